//! What a host that is gone leaves under the prefix (`docs/fleet.md`, "A host that is gone"):
//! its outcomes (no lease: the fleet view shows them with `alive: false`), and until their leases
//! end its `unable` markers and its writes' markers.
//!
//! - [`EtcdStore::forget_host`] deletes all of it at once, guarded by the host's heartbeat not
//!   existing: a host that is alive (its daemon keeps its heartbeat's lease) is refused.
//! - [`run`], one task per store: every host removes the outcomes of a host whose heartbeat it has
//!   not seen for [`EtcdOptions::forget_gone_hosts_after`] (counted from when this process first
//!   saw the host gone, or started), through the same guarded deletion. Every host may do it; the
//!   guard makes a late or repeated deletion change nothing.
//!
//! [`EtcdOptions::forget_gone_hosts_after`]: super::EtcdOptions::forget_gone_hosts_after

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, TxnOp};

use super::keys::Kind;
use super::write::{Guarded, Written};
use super::{lock, EtcdStore, Shared};
use crate::StoreError;

/// Deletions per transaction (etcd's default `--max-txn-ops` is 128; the write's markers add one).
const DELETES_PER_TXN: usize = 100;

impl EtcdStore {
    /// Deletes what host `host` left under the prefix: its outcomes of every binding, its `unable`
    /// markers and its writes' markers. Refused (nothing deleted) while `host` is alive: its
    /// heartbeat exists. Returns how many keys were deleted.
    pub async fn forget_host(&self, host: &str) -> Result<usize, StoreError> {
        super::keys::check_host_id(host)?;
        if host == self.shared.opts.host_id {
            return Err(alive(&self.shared, host));
        }
        let k = &self.shared.keys;
        let mut keys = Vec::new();
        for kind in ["outcomes/", "unable/"] {
            for key in self.keys_under(&format!("{}{kind}", k.prefix)).await? {
                match k.parse(key.as_bytes()) {
                    Some(Kind::Outcome { host: h, .. } | Kind::Unable { host: h, .. })
                        if h == host =>
                    {
                        keys.push(TxnOp::delete(key, None))
                    }
                    _ => {}
                }
            }
        }
        let beat = k.host(host);
        let mut deleted = 0;
        // The writes' markers (on leases of their own, gone within seconds anyway) go with the
        // first transaction; an empty list still checks that the host is not alive.
        let mut parts: Vec<Vec<TxnOp>> = keys
            .chunks(DELETES_PER_TXN)
            .map(<[TxnOp]>::to_vec)
            .collect();
        if parts.is_empty() {
            parts.push(Vec::new());
        }
        parts[0].push(TxnOp::delete(
            k.write_marker(host, ""),
            Some(DeleteOptions::new().with_prefix()),
        ));
        for (i, ops) in parts.into_iter().enumerate() {
            // Not counted: the markers' prefix deletion of the first.
            let n = ops.len() - usize::from(i == 0);
            let w = self
                .write(Guarded {
                    compares: vec![Compare::create_revision(beat.clone(), CompareOp::Equal, 0)],
                    ops,
                })
                .await?;
            match w {
                Written::Applied(_) => deleted += n,
                Written::Refused(_) => return Err(alive(&self.shared, host)),
            }
        }
        if deleted > 0 {
            tracing::info!(store = %self.shared.location, host, keys = deleted, "forgot a host that is gone: its outcomes and markers were deleted");
        }
        Ok(deleted)
    }

    /// The keys under `prefix` in etcd now (keys only).
    async fn keys_under(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let client = lock(&self.shared.conn).client.clone();
        let mut client = client.ok_or_else(|| self.unavailable("not connected"))?;
        let r = tokio::time::timeout(
            self.shared.opts.op_timeout,
            client.get(
                prefix,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        )
        .await
        .map_err(|_| {
            self.unavailable(format!(
                "no answer within {:?}",
                self.shared.opts.op_timeout
            ))
        })?
        .map_err(|e| self.unavailable(e.to_string()))?;
        Ok(r.kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect())
    }
}

fn alive(shared: &Shared, host: &str) -> StoreError {
    StoreError::Settings(format!(
        "host {host:?} is alive (its heartbeat {} is kept by a running daemon): stop that daemon first; nothing was deleted",
        shared.keys.host(host)
    ))
}

/// How often the task looks for hosts gone long enough.
fn period(after: Duration) -> Duration {
    (after / 4).clamp(Duration::from_millis(500), Duration::from_secs(60))
}

/// The garbage collection task of a store (aborted with it): see the module docs.
pub(crate) async fn run(shared: Arc<Shared>) {
    // Writes go through a handle on the same shared state (its own task is a no-op).
    let store = EtcdStore::handle(shared.clone());
    let after = shared.opts.forget_gone_hosts_after;
    let mut gone_since: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(period(after)).await;
        // Heartbeats are known only once the mirror is synced with etcd.
        if lock(&shared.conn).client.is_none() {
            continue;
        }
        let gone = lock(&shared.mirror).gone_hosts();
        gone_since.retain(|h, _| gone.contains(h));
        let now = Instant::now();
        let due: Vec<String> = gone
            .into_iter()
            .filter(|h| *h != shared.opts.host_id)
            .filter(|h| now.duration_since(*gone_since.entry(h.clone()).or_insert(now)) >= after)
            .collect();
        for host in due {
            match store.forget_host(&host).await {
                Ok(_) => {
                    gone_since.remove(&host);
                }
                Err(e) => {
                    tracing::debug!(store = %shared.location, host, error = %e, "forgetting a host that is gone failed; tried again later")
                }
            }
        }
    }
}
