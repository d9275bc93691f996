//! The keys a host writes of its own, host first (`keys.rs`), and what deletes them (a host's
//! etcd user may be limited to its own prefixes: `docs/fleet.md`, "Per-host etcd permissions").
//!
//! - When a binding is removed each host deletes its own outcome and `unable` marker of it
//!   ([`note_removals`] notes the removals the mirror applies, [`delete_orphans`] deletes them
//!   before the next outcome flush); the removal's transaction no longer deletes every host's.
//! - After its first full read a process deletes its own keys of bindings removed while it was
//!   down (its own prefixes read keys only, in pages sized by bytes: `sync.rs`), and, while any
//!   key of the old layout (`PREFIX/outcomes/NAME/HOST`, `PREFIX/unable/NAME/HOST`: daemons of
//!   before) is left in etcd, its own keys of that layout ([`after_sync`], once per process). A
//!   binding's removal deletes the old layout's keys of it while there are any
//!   ([`EtcdStore::old_layout_keys_of`]); the garbage collection of gone hosts and
//!   `fleet forget-host` delete both layouts (`gc.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use etcd_client::{Client, GetOptions, Txn, TxnOp};
use tokio::time::timeout;

use super::keys::{Keys, Kind};
use super::mirror::{Mirror, Update};
use super::sync::{range_end, read_pages, ReadError};
use super::{lock, EtcdStore, Shared};

/// Whether binding `name` exists: held, or its key is in etcd with a value this host refused
/// (its outcome says so: not an orphan).
fn exists(m: &Mirror, keys: &Keys, name: &str) -> bool {
    m.binding_exists(name) || m.meta_of(&keys.binding(name)).version > 0
}

/// Records the bindings that `updates` remove (applied or read), whose keys of this host
/// [`delete_orphans`] deletes at the next flush.
pub(crate) fn note_removals(shared: &Shared, updates: &[Update]) {
    let removed: Vec<String> = updates
        .iter()
        .filter_map(|u| match u {
            Update::Raw {
                key, value: None, ..
            } => match shared.keys.parse(key) {
                Some(Kind::Binding(name)) => Some(name),
                _ => None,
            },
            Update::Binding {
                name, value: None, ..
            } => Some(name.clone()),
            _ => None,
        })
        .collect();
    if !removed.is_empty() {
        lock(&shared.orphans).extend(removed);
        shared.flush.notify_one();
    }
}

/// Deletes this host's outcome and `unable` marker of each binding removed (and not created
/// again: a binding back gets this host's outcome written over the old one). A refusal is
/// logged and the keys left (the garbage collection of the host takes them when it is gone);
/// `Err`: the member did not answer.
pub(crate) async fn delete_orphans(
    shared: &Arc<Shared>,
    client: &mut Client,
) -> Result<(), String> {
    let me = &shared.opts.host_id;
    let keys = &shared.keys;
    // Not both locks at once: the mirror's holder takes `orphans` (`note_removals`).
    let all: Vec<String> = lock(&shared.orphans).iter().cloned().collect();
    let (back, names): (Vec<String>, Vec<String>) = {
        let m = lock(&shared.mirror);
        all.into_iter().partition(|n| exists(&m, keys, n))
    };
    {
        let mut orphans = lock(&shared.orphans);
        back.iter().for_each(|n| {
            orphans.remove(n);
        });
    }
    for chunk in names.chunks(super::TXN_CHUNK / 2) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .flat_map(|n| [keys.outcome(n, me), keys.unable(n, me)])
            .map(|k| TxnOp::delete(k, None))
            .collect();
        match timeout(shared.opts.op_timeout, client.txn(Txn::new().and_then(ops))).await {
            Err(_) => {
                return Err(format!(
                    "delete outcomes: no answer within {:?}",
                    shared.opts.op_timeout
                ))
            }
            Ok(Err(e)) if super::write::retryable(&e) => {
                return Err(format!("delete outcomes: {e}"))
            }
            Ok(Err(e)) => {
                tracing::warn!(store = %shared.location, bindings = chunk.len(), error = %e, "etcd refused deleting this host's outcomes of removed bindings; left (the garbage collection takes them once this host is gone)");
            }
            Ok(Ok(_)) => {}
        }
        let mut orphans = lock(&shared.orphans);
        let mut aside = lock(&shared.stood_aside);
        for n in chunk {
            orphans.remove(n);
            aside.remove(n);
        }
    }
    Ok(())
}

/// What a failed read of [`after_sync`] means. `Ok(None)`: etcd refused it (this host's user may
/// not read there: logged, and the sweep not tried again); `Err`: the member did not answer.
fn read_failed<T>(shared: &Shared, prefix: &str, e: ReadError) -> Result<Option<T>, String> {
    match e {
        ReadError::NoAnswer => Err(format!(
            "sweep own keys: no answer within {:?}",
            shared.opts.op_timeout
        )),
        ReadError::Etcd(e) if super::write::retryable(&e) => Err(format!("sweep own keys: {e}")),
        ReadError::Etcd(e) => {
            tracing::warn!(store = %shared.location, prefix, error = %e, "etcd refused reading this host's keys to delete (of removed bindings, of the old key layout); not tried again by this process");
            shared.swept.store(true, Ordering::Relaxed);
            Ok(None)
        }
    }
}

/// The bindings of this host's outcomes or markers under `prefix` (one of its own prefixes):
/// keys only, in pages sized by bytes (`sync.rs`), so a host with more keys than one answer
/// carries (many bindings removed while it was down) still reads them all. Failures as
/// [`read_failed`].
async fn own_bindings(
    shared: &Shared,
    client: &Client,
    prefix: &str,
) -> Result<Option<Vec<String>>, String> {
    let end = range_end(prefix.as_bytes());
    let mut names = Vec::new();
    let each = |kv: &etcd_client::KeyValue| {
        if let Some(Kind::Outcome { binding, .. } | Kind::Unable { binding, .. }) =
            shared.keys.parse(kv.key())
        {
            names.push(binding);
        }
    };
    let from = prefix.as_bytes().to_vec();
    match read_pages(shared, client, from, &end, 0, true, each).await {
        Ok(_) => Ok(Some(names)),
        Err(e) => read_failed(shared, prefix, e),
    }
}

/// The count of keys under `prefix` (one answer, whatever the count). Failures as
/// [`read_failed`].
async fn count(shared: &Shared, client: &mut Client, prefix: &str) -> Result<Option<i64>, String> {
    let opts = GetOptions::new().with_prefix().with_count_only();
    match timeout(shared.opts.op_timeout, client.get(prefix, Some(opts))).await {
        Err(_) => read_failed(shared, prefix, ReadError::NoAnswer),
        Ok(Err(e)) => read_failed(shared, prefix, ReadError::Etcd(e)),
        Ok(Ok(r)) => Ok(Some(r.count())),
    }
}

/// Once per process, after the session's first full read: this host's own keys of bindings
/// that no longer exist (removed while it was down) become orphans, and while etcd holds any
/// key of the old layout (daemons of before, or this host's own from before its upgrade), this
/// host deletes its own old-layout outcome and marker of every binding. A refusal (a user
/// limited to its new prefixes, with old keys left) is logged once and not tried again: the new
/// layout's keys win in every read; so is a refused read. `Err`: the member did not answer
/// (tried again next session).
pub(crate) async fn after_sync(shared: &Arc<Shared>, client: &mut Client) -> Result<(), String> {
    if shared.swept.load(Ordering::Relaxed) {
        return Ok(());
    }
    let me = &shared.opts.host_id;
    let keys = &shared.keys;
    let op_timeout = shared.opts.op_timeout;
    let no_answer = || format!("sweep own keys: no answer within {op_timeout:?}");
    // Own keys of bindings removed meanwhile.
    let mut own = Vec::new();
    for prefix in [keys.outcomes_of_host(me), keys.unable_of_host(me)] {
        let Some(names) = own_bindings(shared, client, &prefix).await? else {
            return Ok(());
        };
        own.extend(names);
    }
    let (gone, names): (Vec<String>, Vec<String>) = {
        let m = lock(&shared.mirror);
        let gone = own.into_iter().filter(|n| !exists(&m, keys, n)).collect();
        let names = m
            .file
            .list_bindings()
            .map_err(|e| format!("mirror: {e}"))?
            .into_iter()
            .map(|sb| sb.binding.name)
            .collect();
        (gone, names)
    };
    if !gone.is_empty() {
        lock(&shared.orphans).extend(gone);
        shared.flush.notify_one();
    }
    // The old layout: anything left of it at all? (A count, not the keys.)
    let mut old = 0;
    for prefix in keys.old_layout() {
        let Some(n) = count(shared, client, &prefix).await? else {
            return Ok(());
        };
        old += n;
    }
    if old > 0 {
        let ops: Vec<TxnOp> = names
            .iter()
            .flat_map(|n| [keys.old_outcome(n, me), keys.old_unable(n, me)])
            .map(|k| TxnOp::delete(k, None))
            .collect();
        let mut refused = false;
        for chunk in ops.chunks(super::TXN_CHUNK) {
            let txn = Txn::new().and_then(chunk.to_vec());
            match timeout(op_timeout, client.txn(txn)).await {
                Err(_) => return Err(no_answer()),
                Ok(Err(e)) if super::write::retryable(&e) => {
                    return Err(format!("delete old-layout keys: {e}"))
                }
                Ok(Err(e)) => {
                    tracing::warn!(store = %shared.location, error = %e, "etcd refused deleting this host's outcomes and markers of the old key layout (PREFIX/outcomes/NAME/HOST); they stay, and this host's keys of the new layout win in every read (docs/fleet.md, rolling upgrade)");
                    refused = true;
                    break;
                }
                Ok(Ok(_)) => {}
            }
        }
        if !refused {
            tracing::info!(store = %shared.location, old_layout_keys = old, "this host's keys of the old layout were deleted (its outcomes are under PREFIX/outcomes-by-host/HOST/ now)");
        }
    }
    shared.swept.store(true, Ordering::Relaxed);
    Ok(())
}

impl EtcdStore {
    /// Whether etcd holds an outcome or `unable` marker of binding `name` in the old layout (a
    /// count, on the session's member). Not connected or not answered: `false` (a key of a
    /// daemon of before may stay; the readers show outcomes of existing bindings only).
    pub(crate) async fn old_layout_keys_of(&self, name: &str) -> bool {
        let Some(mut client) = lock(&self.shared.conn).client.clone() else {
            return false;
        };
        let k = &self.shared.keys;
        let count = || Some(GetOptions::new().with_prefix().with_count_only());
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.old_outcomes_of(name), count()),
            TxnOp::get(k.old_unable_of(name), count()),
        ]);
        match tokio::time::timeout(self.shared.opts.op_timeout, client.txn(txn)).await {
            Ok(Ok(r)) => r
                .op_responses()
                .iter()
                .any(|op| matches!(op, etcd_client::TxnOpResponse::Get(g) if g.count() > 0)),
            other => {
                tracing::debug!(store = %self.shared.location, binding = name, answer = ?other.map(|r| r.map(|_| ())), "counting the old layout's keys of a binding failed; not deleted with it");
                false
            }
        }
    }
}
