//! What a host that is gone leaves under the prefix (`docs/fleet.md`, "A host that is gone"):
//! its outcomes (no lease: the fleet view shows them with `alive: false`), and until their leases
//! end its `unable` markers and its writes' markers; of both key layouts (`keys.rs`: its own
//! prefixes `P/outcomes-by-host/HOST/`, `P/unable-by-host/HOST/`, and its keys among the old
//! layout's `P/outcomes/NAME/HOST`, `P/unable/NAME/HOST`). A permission refusal of any of its
//! reads and writes is said as such, naming the etcd user (`refusal.rs`), not as unreachable.
//!
//! - `forget_host` (`BindingStore::forget_host`, the `fleet forget-host` command) deletes all of
//!   it at once, guarded by the host's heartbeat not existing: a host that is alive (its daemon
//!   keeps its heartbeat's lease) is refused, unless forced (its session lease is revoked first).
//! - [`run`], one task per store: the live host that rendezvous hashing picks among the heartbeats
//!   (one for the fleet; another when it goes) reads every outcome (`fleet_read.rs`: hosts do not
//!   watch them) and removes the outcomes of a host whose heartbeat has been gone for
//!   [`EtcdOptions::forget_gone_hosts_after`], through the same guarded deletion. The guard makes
//!   a late or repeated deletion (two hosts collecting for a moment) change nothing. The count
//!   lives in etcd, not in the collecting process (`PREFIX/outcomes-gone/HOST`: the wall-clock
//!   time a collector first saw HOST gone, created once; a value that does not decode is
//!   replaced once, guarded by its mod revision, and the count starts then): a restart of the
//!   collecting daemon, or another host taking the collection over, goes on counting where it
//!   was, so a fleet that is redeployed more often than the set time still collects. The key
//!   goes with the host's outcomes, or when the host is back.
//!
//! [`EtcdOptions::forget_gone_hosts_after`]: super::EtcdOptions::forget_gone_hosts_after

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use etcd_client::{Compare, CompareOp, DeleteOptions, KeyValue, TxnOp};

use super::keys::Kind;
use super::write::{Guarded, Written};
use super::{lock, EtcdStore, Shared};
use crate::{ForgotHost, StoreError};

/// Deletions per transaction (etcd's default `--max-txn-ops` is 128; the write's markers add one).
const DELETES_PER_TXN: usize = 100;

impl EtcdStore {
    /// Deletes what host `host` left under the prefix: its outcomes of every binding, its `unable`
    /// markers and its writes' markers. Refused (nothing deleted) while `host` is alive (its
    /// heartbeat exists; this host always is) unless `force`, which first revokes the lease of
    /// its heartbeat (its session: claims and markers go with it). Unknown (nothing of it under
    /// the prefix): [`StoreError::NoSuchHost`]. `BindingStore::forget_host` calls it.
    pub(crate) async fn forget_gone_host(
        &self,
        host: &str,
        force: bool,
    ) -> Result<ForgotHost, StoreError> {
        super::keys::check_host_id(host)?;
        if host == self.shared.opts.host_id {
            return Err(alive(&self.shared, host));
        }
        let k = &self.shared.keys;
        let beat = k.host(host);
        let mut session_ended = false;
        if let Some(lease) = self.lease_of(&beat).await? {
            if !force {
                return Err(alive(&self.shared, host));
            }
            self.revoke(lease).await?;
            session_ended = true;
            tracing::warn!(store = %self.shared.location, host, lease, "forget-host --force: the host's session lease was revoked (its heartbeat and resolver claims are gone)");
        }
        // Both layouts (`keys.rs`): the host's own prefixes, and its keys among every host's of
        // the old one.
        let mut keys = Vec::new();
        for prefix in [k.outcomes_of_host(host), k.unable_of_host(host)] {
            keys.extend(self.keys_under(&prefix, |_| true).await?);
        }
        let new_layout = keys.len();
        for prefix in k.old_layout() {
            let of_host = |key: &[u8]| {
                matches!(k.parse(key),
                            Some(Kind::Outcome { host: h, .. } | Kind::Unable { host: h, .. })
                            if h == host)
            };
            keys.extend(self.keys_under(&prefix, of_host).await?);
        }
        let old_layout = if keys.len() > new_layout {
            format!(
                ", its keys under {} and {}",
                k.old_layout()[0],
                k.old_layout()[1]
            )
        } else {
            String::new()
        };
        let keys: Vec<TxnOp> = keys
            .into_iter()
            .map(|key| TxnOp::delete(key, None))
            .collect();
        if keys.is_empty() && !session_ended {
            return Err(StoreError::NoSuchHost {
                host: host.to_string(),
                prefix: k.prefix.clone(),
            });
        }
        let what = format!(
            "the outcomes and markers of host {host:?} ({}, {}{old_layout}), its writes' markers {} \
             and {}",
            k.outcomes_of_host(host),
            k.unable_of_host(host),
            k.write_marker(host, ""),
            k.gone_since(host)
        );
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
        parts[0].push(TxnOp::delete(k.gone_since(host), None));
        // Guarded by the heartbeat's absence, except after `--force`: the host's daemon, still
        // running, takes a new session at once, and its new heartbeat must not turn the forced
        // deletion into "alive" half-way (it publishes its outcomes again).
        let guard: Vec<Compare> = if session_ended {
            Vec::new()
        } else {
            vec![Compare::create_revision(beat.clone(), CompareOp::Equal, 0)]
        };
        for (i, ops) in parts.into_iter().enumerate() {
            // Not counted: the markers' prefix deletion and the gone-since key of the first.
            let n = ops.len() - 2 * usize::from(i == 0);
            let w = self
                .write_to(
                    Guarded {
                        compares: guard.clone(),
                        ops,
                    },
                    &what,
                )
                .await?;
            match w {
                Written::Applied(_) => deleted += n,
                Written::Refused(_) => return Err(alive(&self.shared, host)),
            }
        }
        if deleted > 0 {
            tracing::info!(store = %self.shared.location, host, keys = deleted, "forgot a host that is gone: its outcomes and markers were deleted");
        }
        Ok(ForgotHost {
            keys: deleted,
            session_ended,
        })
    }

    /// The lease of `key` when it exists (a heartbeat: its session's lease), read from etcd now.
    async fn lease_of(&self, key: &str) -> Result<Option<i64>, StoreError> {
        let mut client = self.client()?;
        let r = tokio::time::timeout(self.shared.opts.op_timeout, client.get(key, None))
            .await
            .map_err(|_| self.no_answer())?
            .map_err(|e| self.answered(&e, &format!("reading {key}")))?;
        Ok(r.kvs().first().map(|kv| kv.lease()))
    }

    /// Revokes `lease` (a gone host's session): every key under it is deleted by etcd.
    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        let mut client = self.client()?;
        match tokio::time::timeout(self.shared.opts.op_timeout, client.lease_revoke(lease)).await {
            Err(_) => Err(self.no_answer()),
            // Expired meanwhile: the same result.
            Ok(Err(e)) if e.to_string().contains("lease not found") => Ok(()),
            Ok(Err(e)) => Err(self.answered(
                &e,
                &format!("revoking lease {lease:x} (every key under it: a heartbeat, resolver claims, markers)"),
            )),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// Every `PREFIX/outcomes-gone/HOST` now: host → when a collector first saw it gone (wall
    /// clock, ms), or the mod revision of a value that does not decode ([`Count::Undecodable`]).
    /// Read in pages sized by bytes as every read of a prefix here ([`Self::read_under`]).
    async fn gone_since_all(&self) -> Result<HashMap<String, Count>, StoreError> {
        let prefix = self.shared.keys.all_gone_since();
        let mut counts = HashMap::new();
        self.read_under(&prefix, false, |kv| {
            let Some(host) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(prefix.as_str()))
            else {
                return;
            };
            let count = match serde_json::from_slice::<GoneSince>(kv.value()) {
                Ok(g) => Count::Since(g.since_ms),
                Err(_) => Count::Undecodable(kv.mod_revision()),
            };
            counts.insert(host.to_string(), count);
        })
        .await?;
        Ok(counts)
    }

    /// Replaces `host`'s count that does not decode (written by hand, or by something else
    /// than a collector) with one starting at `since_ms`, guarded by the bad value's mod
    /// revision `rev`: the count starts then, once (a collector that replaced it meanwhile
    /// wins). Read as "seen now" on every pass instead, the count would start again each time
    /// and the host would never be collected.
    async fn restart_gone_count(
        &self,
        host: &str,
        rev: i64,
        since_ms: i64,
    ) -> Result<(), StoreError> {
        let key = self.shared.keys.gone_since(host);
        tracing::warn!(store = %self.shared.location, host, key = %key, "the count of a host that is gone does not decode: it is replaced by one starting now");
        let value = serde_json::to_string(&GoneSince { since_ms }).expect("plain struct");
        let g = Guarded {
            compares: vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
            ops: vec![TxnOp::put(key.clone(), value, None)],
        };
        self.write_to(g, &key).await.map(|_| ())
    }

    /// Starts `host`'s count at `since_ms` unless one runs already (created once: another
    /// collector's count goes on).
    async fn start_gone_count(&self, host: &str, since_ms: i64) -> Result<(), StoreError> {
        let key = self.shared.keys.gone_since(host);
        let value = serde_json::to_string(&GoneSince { since_ms }).expect("plain struct");
        let g = Guarded {
            compares: vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
            ops: vec![TxnOp::put(key.clone(), value, None)],
        };
        self.write_to(g, &key).await.map(|_| ())
    }

    /// Ends `host`'s count (it is back, or has nothing left to collect).
    async fn end_gone_count(&self, host: &str) -> Result<(), StoreError> {
        let key = self.shared.keys.gone_since(host);
        let g = Guarded {
            compares: Vec::new(),
            ops: vec![TxnOp::delete(key.clone(), None)],
        };
        self.write_to(g, &key).await.map(|_| ())
    }

    fn client(&self) -> Result<etcd_client::Client, StoreError> {
        let client = lock(&self.shared.conn).client.clone();
        client.ok_or_else(|| self.unavailable("not connected"))
    }

    /// The error of a request the session's member answered with `e`: a permission or auth
    /// refusal is said as such (`refusal.rs`), naming `keys`; anything else is unavailable.
    fn answered(&self, e: &etcd_client::Error, keys: &str) -> StoreError {
        if super::write::retryable(e) {
            return self.unavailable(e.to_string());
        }
        let member = lock(&self.shared.conn).member.clone().unwrap_or_default();
        self.refusal_error(&member, e, keys)
    }

    fn no_answer(&self) -> StoreError {
        self.unavailable(format!(
            "no answer within {:?}",
            self.shared.opts.op_timeout
        ))
    }

    /// The keys under `prefix` in etcd now (keys only): the old layout's prefixes hold every
    /// host's key of every binding. Only those `keep` takes are kept.
    async fn keys_under(
        &self,
        prefix: &str,
        keep: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::new();
        self.read_under(prefix, true, |kv| {
            if keep(kv.key()) {
                keys.push(String::from_utf8_lossy(kv.key()).into_owned());
            }
        })
        .await?;
        Ok(keys)
    }

    /// Calls `each` on every key under `prefix` in etcd now (of the keys only when `keys_only`),
    /// read at one revision in pages sized by bytes (`sync.rs`), so no answer is larger than the
    /// client takes however many keys there are.
    async fn read_under(
        &self,
        prefix: &str,
        keys_only: bool,
        each: impl FnMut(&KeyValue),
    ) -> Result<(), StoreError> {
        let client = self.client()?;
        let end = super::sync::range_end(prefix.as_bytes());
        let from = prefix.as_bytes().to_vec();
        super::sync::read_pages(&self.shared, &client, from, &end, 0, keys_only, each)
            .await
            .map(|_| ())
            .map_err(|e| match e {
                super::sync::ReadError::NoAnswer => self.no_answer(),
                super::sync::ReadError::Etcd(e) => {
                    self.answered(&e, &format!("reading the keys under {prefix}"))
                }
            })
    }
}

fn alive(shared: &Shared, host: &str) -> StoreError {
    StoreError::HostAlive {
        host: host.to_string(),
        key: shared.keys.host(host),
    }
}

/// What a collector reads of `PREFIX/outcomes-gone/HOST`.
#[derive(Debug, Clone, Copy)]
enum Count {
    /// Seen gone first at this wall-clock time (ms).
    Since(i64),
    /// A value that does not decode, at this mod revision.
    Undecodable(i64),
}

/// The value of `PREFIX/outcomes-gone/HOST`.
#[derive(Debug, Serialize, Deserialize)]
struct GoneSince {
    since_ms: i64,
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
    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    loop {
        tokio::time::sleep(period(after)).await;
        // Heartbeats are known only once the mirror is synced with etcd.
        if lock(&shared.conn).client.is_none() {
            continue;
        }
        // One live host collects (rendezvous over the heartbeats): it reads every outcome.
        if !lock(&shared.mirror).collects(&shared.opts.host_id) {
            continue;
        }
        if let Err(e) = super::fleet_read::read_outcomes(&shared, None, true).await {
            tracing::debug!(store = %shared.location, error = %e, "reading the hosts' outcomes for the garbage collection failed; tried again later");
            continue;
        }
        let counts = match store.gone_since_all().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(store = %shared.location, error = %e, "reading when the gone hosts were first seen gone failed; tried again later");
                continue;
            }
        };
        let gone = lock(&shared.mirror).gone_hosts();
        let now = tributary_base::now_ms();
        for host in counts.keys().filter(|h| !gone.contains(*h)) {
            if let Err(e) = store.end_gone_count(host).await {
                tracing::debug!(store = %shared.location, host, error = %e, "ending a gone host's count failed; tried again later");
            }
        }
        for host in gone.iter().filter(|h| **h != shared.opts.host_id) {
            let since = match counts.get(host) {
                Some(&Count::Since(since)) => since,
                None => {
                    if let Err(e) = store.start_gone_count(host, now).await {
                        tracing::debug!(store = %shared.location, host, error = %e, "recording that a host is gone failed; tried again later");
                    }
                    continue;
                }
                Some(&Count::Undecodable(rev)) => {
                    if let Err(e) = store.restart_gone_count(host, rev, now).await {
                        tracing::debug!(store = %shared.location, host, error = %e, "replacing a gone host's count that does not decode failed; tried again later");
                    }
                    continue;
                }
            };
            if now.saturating_sub(since) < after_ms {
                continue;
            }
            if let Err(e) = store.forget_gone_host(host, false).await {
                tracing::debug!(store = %shared.location, host, error = %e, "forgetting a host that is gone failed; tried again later");
            }
        }
    }
}
