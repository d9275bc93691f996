//! This host's session lease and host id: the keep-alive that renews the lease on its own, and
//! the check that no running daemon holds this host id before a session takes it.
//!
//! The keep-alive runs on a thread of its own, with its own single-threaded runtime and its own
//! connection to the session's member ([`KeepAlive::start`]), not as a task of the daemon's
//! runtime: a slow SQLite write of the mirror holds the mirror's lock, and every task that reads
//! the store meanwhile (the engine's, the store's own) blocks a worker thread of the runtime on
//! it; with every worker blocked, a keep-alive task (and the connection tasks its requests need)
//! would not run, and the lease would expire during a sync longer than its TTL, taking the
//! host's heartbeat and resolver claims with it (`etcd_txn.rs`,
//! `a_sync_longer_than_the_lease_ttl_keeps_the_lease_and_the_claims`).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::time::{timeout, Instant};

use super::session::bounded;
use super::{lock, Shared};

/// How the lease keep-alive task ended.
pub(super) enum LeaseEnd {
    /// etcd says the lease is gone: a new one is to be taken.
    Expired,
    /// No answer or a broken stream: the session ends.
    Failed(String),
}

/// The keep-alive of a session: how it ended (`.0`), and its thread's stop signal (dropped with
/// the session: the thread ends, and its connection with it).
pub(super) struct KeepAlive(
    pub(super) tokio::sync::oneshot::Receiver<LeaseEnd>,
    #[allow(dead_code)] tokio::sync::oneshot::Sender<()>,
);

impl KeepAlive {
    /// Starts the keep-alive of `lease` on a thread of its own (see the module docs), connected
    /// to `endpoint` with `opts`, renewing every `period`.
    pub(super) fn start(
        opts: etcd_client::ConnectOptions,
        endpoint: &str,
        lease: i64,
        period: Duration,
        lease_ttl: Duration,
        op_timeout: Duration,
    ) -> Result<KeepAlive, String> {
        let (end_tx, end_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let endpoint = endpoint.to_string();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("lease keep-alive runtime: {e}"))?;
        std::thread::Builder::new()
            .name("etcd-lease".into())
            .spawn(move || {
                rt.block_on(async move {
                    let run = async {
                        let mut client =
                            match timeout(op_timeout, Client::connect([&endpoint], Some(opts)))
                                .await
                            {
                                Ok(Ok(c)) => c,
                                Ok(Err(e)) => {
                                    return LeaseEnd::Failed(format!("lease keep-alive: {e}"))
                                }
                                Err(_) => {
                                    return LeaseEnd::Failed(format!(
                                        "lease keep-alive: no connection within {op_timeout:?}"
                                    ))
                                }
                            };
                        match timeout(op_timeout, client.lease_keep_alive(lease)).await {
                            Ok(Ok((keeper, ka))) => {
                                keep_lease_alive(keeper, ka, period, lease_ttl, op_timeout).await
                            }
                            Ok(Err(e)) => LeaseEnd::Failed(format!("lease keep-alive: {e}")),
                            Err(_) => LeaseEnd::Failed(format!(
                                "lease keep-alive: no answer within {op_timeout:?}"
                            )),
                        }
                    };
                    tokio::select! {
                        end = run => { let _ = end_tx.send(end); }
                        // The session ended.
                        _ = stop_rx => {}
                    }
                });
            })
            .map_err(|e| format!("lease keep-alive thread: {e}"))?;
        Ok(KeepAlive(end_rx, stop_tx))
    }
}

/// Renews the lease every `period` until it fails: no answer within the lease TTL or the
/// operation timeout, the stream ended, or the lease expired.
pub(super) async fn keep_lease_alive(
    mut keeper: etcd_client::LeaseKeeper,
    mut ka: etcd_client::LeaseKeepAliveStream,
    period: Duration,
    lease_ttl: Duration,
    op_timeout: Duration,
) -> LeaseEnd {
    let mut tick = tokio::time::interval(period);
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if last.elapsed() > lease_ttl {
                    return LeaseEnd::Failed("lease keep-alive: no answer within the lease TTL".into());
                }
                match timeout(op_timeout, keeper.keep_alive()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return LeaseEnd::Failed(format!("lease keep-alive: {e}")),
                    Err(_) => {
                        return LeaseEnd::Failed(format!(
                            "lease keep-alive: no answer within {op_timeout:?}"
                        ))
                    }
                }
            }
            r = ka.message() => match r {
                Ok(Some(r)) if r.ttl() <= 0 => return LeaseEnd::Expired,
                Ok(Some(_)) => last = Instant::now(),
                Ok(None) => return LeaseEnd::Failed("lease keep-alive: the stream ended".into()),
                Err(e) => return LeaseEnd::Failed(format!("lease keep-alive: {e}")),
            },
        }
    }
}

/// Refuses the host id when a running daemon holds it: its heartbeat key exists under a session
/// lease other than `own` that is still alive once its remaining time has passed (someone keeps
/// it alive). A lease left by a daemon that crashed expires in that time: then the host id is
/// free (a restart after a crash waits at most one lease TTL). Sets the store's fatal error.
pub(super) async fn host_id_free(
    shared: &Arc<Shared>,
    client: &mut Client,
    own: Option<i64>,
) -> Result<(), String> {
    let o = &shared.opts;
    let key = shared.keys.host(&o.host_id);
    let r = bounded(shared, "host id check", client.get(key, None)).await?;
    let Some(other) = r.kvs().first().map(|kv| kv.lease()) else {
        return Ok(());
    };
    if other == 0 || Some(other) == own {
        return Ok(());
    }
    let left = bounded(
        shared,
        "host id check",
        client.lease_time_to_live(other, None),
    )
    .await?
    .ttl();
    if left <= 0 {
        return Ok(());
    }
    tracing::info!(store = %shared.location, host_id = %o.host_id, lease = other, left_secs = left, "the host id's heartbeat is held by another session lease; waiting for it to expire (a restart after a crash) or prove alive (another daemon with this host id)");
    tokio::time::sleep(Duration::from_secs(left as u64) + Duration::from_millis(1500)).await;
    let now = bounded(
        shared,
        "host id check",
        client.lease_time_to_live(other, None),
    )
    .await?
    .ttl();
    if now <= 0 {
        return Ok(());
    }
    let msg = format!(
        "host id {:?} is in use under etcd prefix {} by another running daemon (its session lease {other:x} is kept alive): give every daemon its own --host-id (the default is the host name)",
        o.host_id, shared.keys.prefix
    );
    lock(&shared.conn).fatal = Some(msg.clone());
    Err(msg)
}
