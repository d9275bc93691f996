//! The session task: connect, read what this host needs of the prefix into the mirror and watch it
//! (`sync.rs`: bindings, heartbeats, claims, target sets, `unable` markers, not the other hosts'
//! outcomes nor the writes' markers), keep this host's lease and heartbeat alive (the lease on a
//! task of its own, `lease.rs`, so a long sync never delays it), write pending host outcomes (at
//! most one flush per [`FLUSH_GAP`]), end when the mirror's file refused a write (its writer
//! thread says so, `mirror_file.rs`; the next read applies the change again). Any failure ends
//! the session:
//! the store says unreachable (the mirror stays as it was) and the task reconnects with a
//! back-off, reusing its lease when it is still alive (claims survive a short outage). From the
//! loss of a connected member until the next member is connected, or every member failed once,
//! the store is *moving* (`Conn::moving`): writes try the members themselves (`write.rs`).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, Identity, PutOptions, TlsOptions, Txn,
    TxnOp, TxnOpResponse,
};
use tokio::time::{timeout, Instant};

use super::keys::HostBeat;
use super::lease::{host_id_free, KeepAlive, LeaseEnd};
use super::sync::{apply_and_emit, read_watched, updates_of, watch_ranges, went_back};
use super::{lock, Shared};
use crate::{now_ms, StoreEvent};

/// Largest message this client takes from etcd, raised on purpose from tonic's 4 MiB: one key
/// holds at most etcd's request limit (`--max-request-bytes`, 1.5 MiB by default) and a watch
/// response carries every event of one transaction. A page that is still refused as too large
/// (`OutOfRange`) is asked again with a quarter of its keys.
pub(crate) const MAX_MESSAGE: usize = 64 << 20;
/// The least time between two writes of this host's pending outcomes: the outcomes of a change
/// applied to many bindings go in one flush (transactions of [`super::TXN_CHUNK`]).
const FLUSH_GAP: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// HTTP/2 keep-alive pings to the member: etcd refuses a client that pings more often than its
/// `--grpc-keepalive-min-time` (5 s by default) with `too_many_pings` and closes the connection.
/// A member that dies is noticed sooner anyway: its connection is reset, or the lease keep-alive
/// (every TTL/3, each bounded by the operation timeout) gets no answer.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(10);

pub async fn run(shared: Arc<Shared>) {
    let started_ms = now_ms();
    let mut lease: Option<i64> = None;
    let mut backoff = Duration::from_millis(100);
    // One member per session, the next one after a failure (tonic's balanced channel keeps
    // sending to a member that is down); hosts start on different members.
    let n = shared.opts.endpoints.len();
    let mut member = (super::mirror::score(&shared.opts.host_id, "") % n as u64) as usize;
    // Sessions that failed before being connected, in a row.
    let mut failed = 0;
    loop {
        let t0 = Instant::now();
        let index = member;
        let endpoint = shared.opts.endpoints[member].clone();
        member = (member + 1) % n;
        let err = session(&shared, &endpoint, index, &mut lease, started_ms).await;
        if lock(&shared.conn).fatal.is_some() {
            // Another daemon runs with this host id: this store stops here (the daemon refuses
            // to start; `status()` says why).
            tracing::error!(store = %shared.location, error = %err, "etcd session stopped");
            lock(&shared.conn).last_error = Some(err);
            let _ = shared.events.send(StoreEvent::Status);
            return;
        }
        {
            let mut c = lock(&shared.conn);
            if c.client.is_some() {
                // Lost the member: moving to the next one.
                failed = 0;
                c.moving = true;
            } else {
                failed += 1;
                if failed >= n {
                    // Every member failed once: etcd is unreachable.
                    c.moving = false;
                }
            }
            c.client = None;
            c.member_index = None;
            // Writes meanwhile start with the member the session tries next.
            c.write_hint = member;
            c.unreachable_since_ms.get_or_insert_with(now_ms);
            c.last_error = Some(err.clone());
        }
        tracing::warn!(store = %shared.location, member = %endpoint, error = %err, "etcd session ended; serving the local mirror, reconnecting");
        let _ = shared.events.send(StoreEvent::Status);
        if t0.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        // Every member once quickly, then back off.
        if member == 0 || n == 1 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

pub(crate) fn connect_options(shared: &Shared) -> Result<ConnectOptions, String> {
    let o = &shared.opts;
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(o.op_timeout)
        .with_keep_alive(KEEP_ALIVE, o.op_timeout)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some((user, password)) = &o.user {
        opts = opts.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &o.tls {
        let mut t = TlsOptions::new();
        if let Some(ca) = &tls.ca {
            let pem = std::fs::read(ca).map_err(|e| format!("etcd CA {}: {e}", ca.display()))?;
            t = t.ca_certificate(Certificate::from_pem(pem));
        }
        match (&tls.cert, &tls.key) {
            (Some(c), Some(k)) => {
                let cert =
                    std::fs::read(c).map_err(|e| format!("etcd cert {}: {e}", c.display()))?;
                let key = std::fs::read(k).map_err(|e| format!("etcd key {}: {e}", k.display()))?;
                t = t.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            _ => return Err("etcd client certificate and key go together".into()),
        }
        opts = opts.with_tls(t);
    }
    Ok(opts)
}

pub(crate) async fn bounded<T, E: std::fmt::Display>(
    shared: &Shared,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match timeout(shared.opts.op_timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!(
            "{what}: no answer within {:?}",
            shared.opts.op_timeout
        )),
    }
}

/// One session; returns why it ended.
async fn session(
    shared: &Arc<Shared>,
    endpoint: &str,
    index: usize,
    lease_slot: &mut Option<i64>,
    started_ms: i64,
) -> String {
    match session_inner(shared, endpoint, index, lease_slot, started_ms).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

enum Never {}

async fn session_inner(
    shared: &Arc<Shared>,
    endpoint: &str,
    index: usize,
    lease_slot: &mut Option<i64>,
    started_ms: i64,
) -> Result<Never, String> {
    let o = &shared.opts;
    let keys = &shared.keys;
    let opts = connect_options(shared)?;
    let mut client = bounded(shared, "connect", Client::connect([endpoint], Some(opts))).await?;
    let checked = lock(&shared.conn).host_checked;
    if !checked {
        host_id_free(shared, &mut client, *lease_slot).await?;
    }

    // This host's lease: the old one while it lives (its claims with it), else a new one.
    let ttl = o.lease_ttl.as_secs().max(2) as i64;
    let mut lease = None;
    if let Some(old) = *lease_slot {
        let r = bounded(shared, "lease ttl", client.lease_time_to_live(old, None)).await?;
        if r.ttl() > 0 {
            lease = Some(old);
        }
    }
    let lease = match lease {
        Some(l) => l,
        None => bounded(shared, "lease grant", client.lease_grant(ttl, None))
            .await?
            .id(),
    };
    *lease_slot = Some(lease);
    // The lease is kept alive from here on by a thread of its own with its own connection
    // (`lease.rs`): a long mirror sync, a slow SQLite write blocking the runtime's workers, or a
    // flush does not delay it (the session's claims and heartbeat live with it).
    let period = Duration::from_millis((ttl as u64 * 1000) / 3);
    let mut keep_alive = KeepAlive::start(
        connect_options(shared)?,
        endpoint,
        lease,
        period,
        o.lease_ttl,
        o.op_timeout,
    )?;
    let beat = serde_json::to_vec(&HostBeat {
        started_ms,
        can: Some(super::keys::Can {
            providers: o.providers.clone(),
            keys: shared.secrets.ids(),
            auth: true,
        }),
    })
    .unwrap_or_default();
    let host_key = keys.host(&o.host_id);
    let put = TxnOp::put(
        host_key.clone(),
        beat,
        Some(PutOptions::new().with_lease(lease)),
    );
    // The first heartbeat of the process is created only where none is (or it is ours): a daemon
    // that started at the same moment with the same host id is found by the next session's check.
    let guard = if checked {
        Vec::new()
    } else {
        vec![Compare::create_revision(
            host_key.clone(),
            CompareOp::Equal,
            0,
        )]
    };
    let txn = Txn::new()
        .when(guard)
        .and_then(vec![put.clone()])
        .or_else(vec![TxnOp::get(host_key.clone(), None)]);
    let r = bounded(shared, "heartbeat", client.txn(txn)).await?;
    if !r.succeeded() {
        let holder = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
            _ => None,
        });
        if holder != Some(lease) {
            return Err(format!(
                "heartbeat: the key of host id {:?} was created by another session meanwhile",
                o.host_id
            ));
        }
        bounded(
            shared,
            "heartbeat",
            client.txn(Txn::new().and_then(vec![put])),
        )
        .await?;
    }
    lock(&shared.conn).host_checked = true;
    // The markers of the bindings this host stepped out of went with an expired lease: put them
    // again under this one, before the full read, so no host (this one included) counts this
    // host in for them meanwhile.
    let aside: Vec<(String, String)> = lock(&shared.stood_aside)
        .iter()
        .map(|(n, w)| (n.clone(), w.clone()))
        .collect();
    for (name, why) in aside {
        let value = serde_json::to_vec(&serde_json::json!({ "why": why })).unwrap_or_default();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                keys.binding(&name),
                CompareOp::Greater,
                0,
            )])
            .and_then(vec![TxnOp::put(
                keys.unable(&name, &o.host_id),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        bounded(shared, "step-out marker", client.txn(txn)).await?;
    }

    // What this host needs of the prefix, at one revision (`sync.rs`).
    let (updates, seen, snapshot, cluster_id) = read_watched(shared, &client).await?;
    let count = updates.len();
    let rebuild = went_back(shared, cluster_id, snapshot);
    apply_and_emit(shared, updates, Some((seen, snapshot, rebuild))).await?;
    // Recorded once the mirror has it (a failed rebuild is tried again by the next session).
    {
        let mut seen = lock(&shared.seen);
        let max = match *seen {
            Some((_, max)) if !rebuild => max.max(snapshot),
            _ => snapshot,
        };
        *seen = Some((cluster_id, max));
    }
    let mut watch = watch_ranges(shared, &client, snapshot + 1).await?;
    // Before the session counts as connected (`wait_connected`, writes through it): a binding
    // saved before this host knew that the fleet requires integrity would be sealed `v1` and
    // written again as soon as the key arrived (`reseal.rs`). Not a reason to end the session
    // (a role without write access to the key, say): the next session tries again.
    if let Err(e) = super::integrity::require_integrity(shared, &mut client).await {
        tracing::warn!(store = %shared.location, error = %e, "putting the fleet's integrity key failed; values without a MAC are still applied by hosts without --etcd-require-integrity");
    }
    {
        let mut c = lock(&shared.conn);
        c.client = Some(client.clone());
        c.member = Some(endpoint.to_string());
        c.member_index = Some(index);
        c.write_hint = index;
        c.moving = false;
        c.lease = Some(lease);
        c.unreachable_since_ms = None;
        c.last_error = None;
    }
    // Writes go through the session's client again.
    lock(&shared.spares).iter_mut().for_each(|s| *s = None);
    shared.reseal.notify_one();
    tracing::info!(store = %shared.location, host_id = %o.host_id, keys = count, revision = snapshot, "etcd session: mirror synced, watching");
    let _ = shared.events.send(StoreEvent::Resync);
    let _ = shared.events.send(StoreEvent::Status);
    super::own_keys::after_sync(shared, &mut client).await?;
    super::outcomes::flush_pending(shared, &mut client).await?;
    // Outcome flushes: at most one per FLUSH_GAP (the outcomes published meanwhile go together).
    let mut next_flush = Instant::now() + FLUSH_GAP;
    let mut flush_due = false;

    loop {
        tokio::select! {
            msg = watch.message() => {
                let resp = msg.map_err(|e| format!("watch: {e}"))?
                    .ok_or_else(|| "watch: the stream ended".to_string())?;
                if resp.canceled() {
                    return Err(format!("watch canceled (compacted at {}): {}", resp.compact_revision(), resp.cancel_reason()));
                }
                shared.watched.fetch_add(resp.events().len() as u64, std::sync::atomic::Ordering::Relaxed);
                if let Some(h) = resp.header() {
                    if let Some((_, max)) = lock(&shared.seen).as_mut() {
                        *max = (*max).max(h.revision());
                    }
                }
                let updates = updates_of(&resp);
                if !updates.is_empty() {
                    apply_and_emit(shared, updates, None).await?;
                }
            }
            end = &mut keep_alive.0 => {
                match end {
                    Ok(LeaseEnd::Expired) => {
                        *lease_slot = None;
                        lock(&shared.conn).lease = None;
                        return Err("this host's lease expired; a new one is taken".into());
                    }
                    Ok(LeaseEnd::Failed(e)) => return Err(e),
                    Err(e) => return Err(format!("lease keep-alive task: {e}")),
                }
            }
            _ = shared.writer.failure.notify.notified() => {
                // The mirror's file refused a write: the next session's read applies it again.
                if let Some(e) = shared.writer.failure.take() {
                    return Err(format!("mirror file: {e}"));
                }
            }
            _ = shared.flush.notified(), if !flush_due => flush_due = true,
            _ = tokio::time::sleep_until(next_flush), if flush_due => {
                flush_due = false;
                next_flush = Instant::now() + FLUSH_GAP;
                super::outcomes::flush_pending(shared, &mut client).await?;
            }
        }
    }
}
