//! Saving and removing bindings: guarded etcd transactions (`docs/fleet.md`, "Saving a binding").
//!
//! - **Names are unique regardless of ASCII case** (nginx compares upstream names so): creating
//!   binding `NAME` also creates its name claim `PREFIX/names/lower(NAME)` holding `NAME`, in the
//!   same transaction, guarded by the claim not existing. Two hosts creating `Api` and `api` at
//!   once: etcd applies one transaction, the other's guard fails. Removing a binding deletes its
//!   claim when the claim still holds that name (a nested transaction). A claim left by a binding
//!   removed some other way (a daemon of before the claims, `etcdctl del`) is taken back when a
//!   creation finds it ([`EtcdStore::reclaim_names`]).
//! - **A change is written only over the version it was prepared from.** Every update compares
//!   the binding key's `mod_revision` with the revision the mirror read it at; an update given
//!   with the stored record it was prepared from (secret fields carried over from it) is refused
//!   before that when the mirror's record is no longer that one (the caller's copy lags), so a
//!   lagging copy never overwrites a newer change made on another host.
//! - **Versions are not the writers' clocks.** `updated_at_ms`, the version a published target
//!   set names, grows with every update of a binding: `max(clock, previous + 1)`, written under
//!   the `mod_revision` compare, so a writer whose clock is behind still makes a newer version,
//!   never one equal to (or older than) the version it replaces.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};

use super::auth::Meta;
use super::mirror::Update;
use super::write::{Guarded, Written};
use super::{lock, EtcdStore};
use crate::{BindingRecord, StoreError, StoreEvent, StoredBinding, Upsert};

/// The most bytes of one transaction of a save of many bindings (its keys and values, and
/// [`OP_BYTES`] per operation and compare): below etcd's default `--max-request-bytes` (1.5 MiB)
/// with room for the rest of the request (the write's markers, gRPC framing).
pub(crate) const TXN_BYTES: usize = 1024 * 1024;
/// The most operations, and compares, of one such transaction: etcd's default `--max-txn-ops` is
/// 128 each, and the write's markers add one operation and two compares.
pub(crate) const TXN_OPS: usize = 120;
/// What one operation or compare adds to a request beside its key and value (its protobuf
/// framing, revisions, lease), rounded up.
const OP_BYTES: usize = 32;

/// The request bytes of a compare or operation on `key` with `value_len` bytes of value.
fn op_bytes(key: &str, value_len: usize) -> usize {
    key.len() + value_len + OP_BYTES
}

/// The next version of a binding whose current version is `previous`, at clock reading `now`.
pub(crate) fn next_version(now: i64, previous: i64) -> i64 {
    now.max(previous.saturating_add(1))
}

/// One chunk of an upsert, ready to send.
struct Chunk {
    /// How many entries of the list it covers (unchanged ones included).
    taken: usize,
    /// Its request bytes as [`op_bytes`] counts them.
    bytes: usize,
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
    written: Vec<StoredBinding>,
    /// The etcd state of each written key after the write.
    metas: Vec<Meta>,
    created: Vec<String>,
    out: Vec<Upsert>,
}

impl EtcdStore {
    fn now(&self) -> i64 {
        (self.shared.opts.clock)()
    }

    /// The guard and the put of the name claim of a new binding `name`.
    fn claim_name(&self, name: &str) -> (Compare, TxnOp) {
        let key = self.shared.keys.name_claim(name);
        (
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            TxnOp::put(key, name, None),
        )
    }

    /// Deletes the name claim of `name` when it holds that name.
    fn release_name(&self, name: &str) -> TxnOp {
        let key = self.shared.keys.name_claim(name);
        TxnOp::txn(
            Txn::new()
                .when([Compare::value(key.clone(), CompareOp::Equal, name)])
                .and_then([TxnOp::delete(key, None)]),
        )
    }

    /// The value of `key` in etcd now (through the session's member).
    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let client = lock(&self.shared.conn).client.clone();
        let mut client = client.ok_or_else(|| self.unavailable("not connected"))?;
        let r = tokio::time::timeout(self.shared.opts.op_timeout, client.get(key, None))
            .await
            .map_err(|_| {
                self.unavailable(format!(
                    "no answer within {:?}",
                    self.shared.opts.op_timeout
                ))
            })?
            .map_err(|e| self.refusal_error("the session's member", &e, key))?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// After a creation was refused: the name claims of `names` held by a binding that is gone
    /// are deleted (guarded by both); returns whether one was, and the names whose claim another
    /// existing binding holds, with that binding's name.
    pub(crate) async fn reclaim_names(
        &self,
        names: &[String],
    ) -> Result<(bool, Vec<(String, String)>), StoreError> {
        let k = &self.shared.keys;
        let mut freed = false;
        let mut held = Vec::new();
        for name in names {
            let claim = k.name_claim(name);
            let Some(holder) = self.read(&claim).await? else {
                continue;
            };
            let holder = String::from_utf8_lossy(&holder).into_owned();
            if self.read(&k.binding(&holder)).await?.is_some() {
                held.push((name.clone(), holder));
                continue;
            }
            let w = self
                .write_to(
                    Guarded {
                        compares: vec![
                            Compare::value(claim.clone(), CompareOp::Equal, holder.as_bytes()),
                            Compare::create_revision(k.binding(&holder), CompareOp::Equal, 0),
                        ],
                        ops: vec![TxnOp::delete(claim.clone(), None)],
                    },
                    &claim,
                )
                .await?;
            if matches!(w, Written::Applied(_)) {
                tracing::info!(binding = %holder, "name claim of a binding that is gone taken back");
                freed = true;
            }
        }
        Ok((freed, held))
    }

    pub(crate) async fn insert(&self, b: &BindingRecord) -> Result<(), StoreError> {
        let now = self.now();
        let sb = StoredBinding {
            binding: b.clone(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        let key = self.shared.keys.binding(&b.name);
        let first = Meta::default().next();
        let value = self.binding_value(&sb, first, lock(&self.shared.mirror).require);
        let written = format!("{key}, {}", self.shared.keys.name_claim(&b.name));
        for _ in 0..2 {
            let (guard, put) = self.claim_name(&b.name);
            let w = self
                .write_to(
                    Guarded {
                        compares: vec![
                            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                            guard,
                        ],
                        ops: vec![TxnOp::put(key.clone(), value.clone(), None), put],
                    },
                    &written,
                )
                .await?;
            if let Written::Applied(rev) = w {
                return self
                    .apply_own(vec![Update::Binding {
                        name: b.name.clone(),
                        rev,
                        value: Some(sb),
                        meta: first,
                    }])
                    .await;
            }
            let (freed, held) = self.reclaim_names(std::slice::from_ref(&b.name)).await?;
            if let Some((_, holder)) = held.into_iter().next() {
                return Err(StoreError::Duplicate(holder));
            }
            if !freed {
                break;
            }
        }
        Err(StoreError::Duplicate(b.name.clone()))
    }

    /// The transaction of the next chunk of `list` (from its start), from the mirror: as many
    /// entries as fit in `budget` bytes and [`TXN_OPS`] operations, at least one.
    fn chunk(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
        now: i64,
        budget: usize,
    ) -> Result<Chunk, StoreError> {
        let mut c = Chunk {
            taken: 0,
            bytes: 0,
            compares: Vec::new(),
            ops: Vec::new(),
            written: Vec::new(),
            metas: Vec::new(),
            created: Vec::new(),
            out: Vec::new(),
        };
        let m = lock(&self.shared.mirror);
        for (b, base) in list {
            let key = self.shared.keys.binding(&b.name);
            let existing = m.file.get_binding(&b.name)?;
            // Prepared from a record the mirror no longer holds (changed or removed since the
            // caller read it): written over nothing.
            if let Some(base) = base {
                if existing.as_ref().map(|sb| &sb.binding) != Some(base) {
                    return Err(StoreError::Conflict(b.name.clone()));
                }
            }
            let rev = m.rev_of(&key);
            let mut meta = m.meta_of(&key).next();
            let (sb, upsert) = match existing {
                Some(old) if old.binding == *b => {
                    c.out.push(Upsert::Unchanged);
                    c.taken += 1;
                    continue;
                }
                Some(old) => (
                    StoredBinding {
                        binding: b.clone(),
                        created_at_ms: old.created_at_ms,
                        updated_at_ms: next_version(now, old.updated_at_ms),
                    },
                    Upsert::Updated,
                ),
                None => {
                    meta = Meta::default().next();
                    (
                        StoredBinding {
                            binding: b.clone(),
                            created_at_ms: now,
                            updated_at_ms: now,
                        },
                        Upsert::Created,
                    )
                }
            };
            let value = self.binding_value(&sb, meta, m.require);
            // A new binding: its key and its name claim (compare and put each); an update: the
            // key's compare and put.
            let claim = self.shared.keys.name_claim(&b.name);
            let (bytes, ops) = match upsert {
                Upsert::Created => (
                    2 * op_bytes(&key, 0)
                        + op_bytes(&claim, 0)
                        + op_bytes(&claim, b.name.len())
                        + value.len(),
                    2,
                ),
                _ => (2 * op_bytes(&key, 0) + value.len(), 1),
            };
            if !c.written.is_empty() && (c.bytes + bytes > budget || c.ops.len() + ops > TXN_OPS) {
                // The next chunk's first.
                break;
            }
            match upsert {
                Upsert::Created => {
                    c.compares
                        .push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
                    let (guard, put) = self.claim_name(&b.name);
                    c.compares.push(guard);
                    c.ops.push(put);
                    c.created.push(b.name.clone());
                }
                _ => c
                    .compares
                    .push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev)),
            }
            c.out.push(upsert);
            c.ops.push(TxnOp::put(key, value, None));
            c.bytes += bytes;
            c.taken += 1;
            c.written.push(sb);
            c.metas.push(meta);
        }
        Ok(c)
    }

    /// A save of many bindings, in transactions sized by bytes ([`TXN_BYTES`]) and operations
    /// ([`TXN_OPS`]); one that etcd still refuses as too large (members with a smaller
    /// `--max-request-bytes`) is sent again as two of half its size, down to one binding. Each
    /// transaction is all-or-nothing, the save is not: when one fails after others were committed (a request too
    /// large for etcd, a concurrent change, a timeout), the committed bindings are on every host,
    /// and on this one too: they are in the mirror and announced as [`StoreEvent::Binding`], so
    /// that the engine, which takes the failed save as a whole as not done, picks them up like a
    /// change made on another host (`docs/fleet.md`, "Saving a binding").
    pub(crate) async fn upsert(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
    ) -> Result<Vec<Upsert>, StoreError> {
        let mut saved = Vec::new();
        let r = self.upsert_chunks(list, &mut saved).await;
        match r {
            Err(e) if !saved.is_empty() => Err(self.saved_in_part(&saved, e)),
            r => r,
        }
    }

    /// After a save failed part-way: the bindings `saved` by its committed transactions are
    /// announced (this host's engine converges with the others), and the error says which.
    fn saved_in_part(&self, saved: &[String], e: StoreError) -> StoreError {
        tracing::warn!(store = %self.shared.location, saved = saved.len(), error = %e, "a save of many bindings failed part-way: the bindings of its committed transactions are saved on every host");
        for name in saved {
            let _ = self.shared.events.send(StoreEvent::Binding(name.clone()));
        }
        let shown: Vec<&str> = saved.iter().take(5).map(String::as_str).collect();
        let more = if saved.len() > shown.len() {
            ", ..."
        } else {
            ""
        };
        let note = format!(
            " (this save's first {} bindings ({}{more}) were saved by earlier transactions and are on every host; the ones after them were not)",
            saved.len(),
            shown.join(", ")
        );
        match e {
            StoreError::Unavailable { store, why } => StoreError::Unavailable {
                store,
                why: format!("{why}{note}"),
            },
            StoreError::Conflict(names) => StoreError::Conflict(format!("{names}{note}")),
            StoreError::TooLarge { store, why } => StoreError::TooLarge {
                store,
                why: format!("{why}{note}"),
            },
            StoreError::PermissionDenied {
                store,
                user,
                keys,
                why,
            } => StoreError::PermissionDenied {
                store,
                user,
                keys,
                why: format!("{why}{note}"),
            },
            other => other,
        }
    }

    async fn upsert_chunks(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
        saved: &mut Vec<String>,
    ) -> Result<Vec<Upsert>, StoreError> {
        let now = self.now();
        let mut out = Vec::with_capacity(list.len());
        let mut budget = TXN_BYTES;
        let mut start = 0;
        while start < list.len() {
            let mut retried = false;
            let (rev, c) = loop {
                let c = self.chunk(&list[start..], now, budget)?;
                if c.ops.is_empty() {
                    break (None, c);
                }
                let names: Vec<&str> = c.written.iter().map(|s| s.binding.name.as_str()).collect();
                let keys = format!("bindings {} and their name claims", names.join(", "));
                let w = self
                    .write_to(
                        Guarded {
                            compares: c.compares.clone(),
                            ops: c.ops.clone(),
                        },
                        &keys,
                    )
                    .await;
                let w = match w {
                    Err(StoreError::TooLarge { .. }) if c.written.len() > 1 => {
                        // Members that take less than this request: half of it, and so on
                        // for the rest of this save.
                        budget = (c.bytes / 2).max(1);
                        tracing::info!(store = %self.shared.location, bindings = c.written.len(), bytes = c.bytes, "a save's transaction was refused as too large: sent again in halves");
                        continue;
                    }
                    w => w?,
                };
                match w {
                    Written::Applied(rev) => break (Some(rev), c),
                    Written::Refused(_) => {
                        // A name taken regardless of case by a binding this host did not know
                        // yet is a duplicate; a claim left by a binding that is gone is taken
                        // back once; anything else is a concurrent change.
                        let (freed, held) = self.reclaim_names(&c.created).await?;
                        if let Some((_, holder)) = held.into_iter().next() {
                            return Err(StoreError::Duplicate(holder));
                        }
                        if !freed || retried {
                            let names: Vec<&str> =
                                c.written.iter().map(|s| s.binding.name.as_str()).collect();
                            return Err(StoreError::Conflict(names.join(", ")));
                        }
                        retried = true;
                    }
                }
            };
            out.extend(c.out);
            start += c.taken.max(1);
            if let Some(rev) = rev {
                saved.extend(c.written.iter().map(|sb| sb.binding.name.clone()));
                self.apply_own(
                    c.written
                        .into_iter()
                        .zip(c.metas)
                        .map(|(sb, meta)| Update::Binding {
                            name: sb.binding.name.clone(),
                            rev,
                            value: Some(sb),
                            meta,
                        })
                        .collect(),
                )
                .await?;
            }
        }
        Ok(out)
    }

    /// Removes binding `name` with its name claim, target set and resolver claim. The hosts'
    /// outcomes and `unable` markers are each host's to delete (`own_keys.rs`: a host's etcd user
    /// may be limited to its own keys); the old layout's keys of the binding (daemons of before,
    /// `keys.rs`) go in the same transaction while etcd holds any, and only then (a user
    /// without the old prefixes can remove bindings once they are gone).
    pub(crate) async fn remove(&self, name: &str) -> Result<bool, StoreError> {
        let k = &self.shared.keys;
        let bkey = k.binding(name);
        let old = self.old_layout_keys_of(name).await;
        let mut ops = vec![
            TxnOp::delete(bkey.clone(), None),
            TxnOp::delete(k.targets(name), None),
            TxnOp::delete(k.resolver(name), None),
            self.release_name(name),
        ];
        let mut written =
            format!("binding {bkey} with its name claim, target set and resolver claim");
        if old {
            let prefix = Some(DeleteOptions::new().with_prefix());
            ops.push(TxnOp::delete(k.old_outcomes_of(name), prefix.clone()));
            ops.push(TxnOp::delete(k.old_unable_of(name), prefix));
            written.push_str(&format!(
                ", and the old layout's outcomes {} and markers {}",
                k.old_outcomes_of(name),
                k.old_unable_of(name)
            ));
        }
        let w = self
            .write_to(
                Guarded {
                    compares: vec![Compare::create_revision(
                        bkey.clone(),
                        CompareOp::Greater,
                        0,
                    )],
                    ops,
                },
                &written,
            )
            .await?;
        let (rev, removed) = match w {
            Written::Applied(rev) => (rev, true),
            // Gone already: the mirror forgets it too.
            Written::Refused(rev) => (rev, false),
        };
        lock(&self.shared.pending).remove(name);
        self.apply_own(vec![Update::Binding {
            name: name.to_string(),
            rev,
            value: None,
            meta: Meta::default(),
        }])
        .await?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::next_version;

    #[test]
    fn a_version_grows_also_when_the_writers_clock_is_behind() {
        assert_eq!(next_version(1_000, 500), 1_000);
        assert_eq!(next_version(1_000, 1_000), 1_001);
        assert_eq!(next_version(400, 1_000), 1_001);
        assert_eq!(next_version(0, i64::MAX), i64::MAX);
    }
}
