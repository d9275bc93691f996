//! The local mirror of the prefix: bindings in a [`SqliteFile`] (they survive a restart while
//! etcd is down; readers see them through [`FileView`], in memory, and never wait on a SQLite
//! write: `mirror_file.rs`), fleet state in memory. Every applied key remembers the etcd revision it was
//! applied at, so a change older than (or equal to) what the mirror holds is ignored: the watch's
//! echo of this host's own writes, and a late event after a newer write. A binding's change is in
//! memory at once and written to the file by a thread of its own; the file's revision of it is
//! recorded only once the file has committed it: when the write fails (disk full, the file
//! locked), the session ends and its next read of the prefix applies the change again
//! (`mirror_file.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use super::auth::Meta;
use super::keys::{self, Can, HostBeat, Keys, Kind, Need};
use super::SecretKeys;
#[path = "mirror_auth.rs"]
mod mirror_auth;
#[path = "mirror_file.rs"]
mod mirror_file;
#[path = "mirror_fleet.rs"]
mod mirror_fleet;
#[path = "mirror_writer.rs"]
mod mirror_writer;

pub use mirror_file::{apply, FileView};
pub use mirror_fleet::{same_outcome, score, Claim};
pub use mirror_writer::Writer;

use crate::sqlite::MirrorOp;
use crate::{HostOutcome, StoreEvent, StoredBinding, TargetSet};
use mirror_file::Batch;

/// One change to apply, with the revision etcd made it at.
#[derive(Debug)]
pub enum Update {
    /// `None`: removed (with its targets, claim and outcomes).
    Binding {
        name: String,
        rev: i64,
        value: Option<StoredBinding>,
        /// The key's etcd state after this write (`auth.rs`).
        meta: Meta,
    },
    Resolver {
        name: String,
        rev: i64,
        holder: Option<(String, i64)>,
    },
    Targets {
        name: String,
        rev: i64,
        value: Option<TargetSet>,
        meta: Meta,
    },
    /// A raw key from the watch or a read, decoded by the mirror.
    Raw {
        key: Vec<u8>,
        rev: i64,
        lease: i64,
        value: Option<Vec<u8>>,
        /// The kv's create revision and version (its MAC binds them, `auth.rs`).
        meta: Meta,
    },
}

impl Update {
    /// Whether it is a binding's key (its apply writes the file).
    fn is_binding(&self, keys: &Keys) -> bool {
        match self {
            Update::Binding { .. } => true,
            Update::Raw { key, .. } => matches!(keys.parse(key), Some(Kind::Binding(_))),
            _ => false,
        }
    }
}

pub struct Mirror {
    /// The bindings as etcd's changes made them (the file follows: `mirror_file.rs`).
    pub file: FileView,
    /// The etcd revision of each key as the mirror holds it in memory.
    revs: HashMap<String, i64>,
    /// The revision of each binding key the file has committed, and the highest one queued to
    /// its writer and not answered yet (`mirror_file.rs`).
    file_revs: HashMap<String, i64>,
    queued: HashMap<String, i64>,
    /// Counts [`Mirror::forget_revisions`]: the writer's answers for batches queued before the
    /// last one record nothing (their revisions are of another history).
    epoch: u64,
    pub targets: HashMap<String, TargetSet>,
    resolvers: HashMap<String, (String, i64)>,
    /// Since when (locally) a binding has had no resolver.
    unclaimed_since: HashMap<String, Instant>,
    outcomes: HashMap<String, BTreeMap<String, HostOutcome>>,
    /// Live hosts: heartbeat and since when this host has seen it.
    hosts: HashMap<String, (HostBeat, Instant)>,
    /// Bindings whose value is to be written again (`reseal.rs`): sealed with a retired key,
    /// without a MAC, or with a `v1` config where the fleet requires integrity.
    pub rewrite: BTreeSet<String>,
    /// etcd create revision and version of each binding and targets key held (also of a value
    /// refused: a write over it is guarded by them).
    meta: HashMap<String, Meta>,
    /// The fleet requires a MAC on every value (`auth.rs`).
    pub require: bool,
    /// Set when the `integrity` key was first seen valid (the store remembers it on disk).
    pub newly_required: bool,
    /// Target sets whose newest value was refused, or had no MAC: the resolver publishes over
    /// them even when its set is the same as the one held.
    republish: HashSet<String>,
    /// Values refused since last taken: (binding, message for its outcome).
    pub refusals: Vec<(String, String)>,
    /// Values refused since the process started.
    pub refused_total: u64,
    /// The fleet's integrity key is in etcd (with a valid MAC).
    pub integrity_key: bool,
    /// Bindings whose config is sealed `v1`: written again as `v2` once integrity is required.
    v1_configs: BTreeSet<String>,
    /// What resolving each binding takes, from its newest value (also one this host cannot
    /// open): the rendezvous choice leaves out the hosts whose heartbeat does not cover it.
    needs: HashMap<String, Need>,
    /// Bindings whose newest value this host could not decode (a key it lacks, a corrupt
    /// value): the file holds an older version, which this host must not resolve.
    unreadable: HashSet<String>,
    /// The etcd revision of the version of each binding the file holds (the set resolved from
    /// it is published only while the binding key still has this revision).
    decoded_rev: HashMap<String, i64>,
    /// Hosts that stepped out of resolving a binding (`keys.rs`): host, and whether the marker
    /// is of the old layout (a host may have one of each while it upgrades).
    unable: HashMap<String, BTreeSet<(String, bool)>>,
    /// What this host can resolve (`None`: anything; the SQLite-era default of tests).
    can: Option<Can>,
}

/// `meta` of a write made at `rev`: a first put's create revision is `rev`.
fn first_put(meta: Meta, rev: i64) -> Meta {
    if meta.version == 1 {
        Meta {
            create_rev: rev,
            version: 1,
        }
    } else {
        meta
    }
}

impl Mirror {
    pub fn new(file: FileView, can: Option<Can>) -> Mirror {
        Mirror {
            needs: HashMap::new(),
            unreadable: HashSet::new(),
            decoded_rev: HashMap::new(),
            unable: HashMap::new(),
            can,
            file,
            revs: HashMap::new(),
            file_revs: HashMap::new(),
            queued: HashMap::new(),
            epoch: 0,
            targets: HashMap::new(),
            resolvers: HashMap::new(),
            unclaimed_since: HashMap::new(),
            outcomes: HashMap::new(),
            hosts: HashMap::new(),
            rewrite: BTreeSet::new(),
            meta: HashMap::new(),
            require: false,
            newly_required: false,
            republish: HashSet::new(),
            refusals: Vec::new(),
            refused_total: 0,
            integrity_key: false,
            v1_configs: BTreeSet::new(),
        }
    }

    pub fn rev_of(&self, key: &str) -> i64 {
        self.revs.get(key).copied().unwrap_or(0)
    }

    /// `true` (and the revision recorded) when `rev` is newer than what `key` holds.
    fn newer(&mut self, key: String, rev: i64) -> bool {
        let e = self.revs.entry(key).or_insert(0);
        if rev <= *e && rev != 0 {
            return false;
        }
        *e = (*e).max(rev);
        true
    }

    /// Applies updates in memory, except the bindings' view, writes and revisions: those are
    /// staged in the batch returned, for [`apply`] to take and queue to the file.
    fn stage(
        &mut self,
        updates: Vec<Update>,
        keys: &Keys,
        secrets: &SecretKeys,
        me: &str,
    ) -> Batch {
        let mut events = Vec::new();
        // The bindings' file writes, in etcd's order.
        let mut ops = Vec::new();
        // Binding keys' revisions and decoded versions of this batch: taken by `apply` (the
        // file's revisions only once it committed them: a failed write, disk full or the file
        // locked, leaves them as they were, so the next read of the prefix applies it again).
        let mut staged: HashMap<String, i64> = HashMap::new();
        let mut decoded: HashMap<String, i64> = HashMap::new();
        // The fleet's integrity key first: whether a value without a MAC is refused depends on
        // it (a full read returns keys in order, `bindings/` before `integrity`).
        let mut updates = updates;
        updates.sort_by_key(
            |u| !matches!(u, Update::Raw { key, .. } if keys.parse(key) == Some(Kind::Integrity)),
        );
        for u in updates {
            match u {
                Update::Binding {
                    name,
                    rev,
                    value,
                    meta,
                } => {
                    if !self.staged_newer(&mut staged, keys.binding(&name), rev) {
                        continue;
                    }
                    // A first put's create revision is its own revision.
                    let meta = first_put(meta, rev);
                    match value {
                        Some(sb) => {
                            self.meta.insert(keys.binding(&name), meta);
                            self.rewrite.remove(&name);
                            // This host's own write: its config is `v2` once integrity is
                            // required (`EtcdStore::binding_value`).
                            if self.require {
                                self.v1_configs.remove(&name);
                            } else {
                                self.v1_configs.insert(name.clone());
                            }
                            self.needs.insert(
                                name.clone(),
                                Need {
                                    provider: keys::provider_pair(
                                        &sb.binding.plugin,
                                        &sb.binding.provider,
                                    ),
                                    key_id: secrets.active_id().to_string(),
                                },
                            );
                            self.unreadable.remove(&name);
                            decoded.insert(name.clone(), rev);
                            ops.push(MirrorOp::Put(sb))
                        }
                        None => {
                            self.forget_binding(&name, keys, rev);
                            decoded.remove(&name);
                            ops.push(MirrorOp::Remove(name));
                        }
                    }
                }
                Update::Resolver { name, rev, holder } => {
                    if self.newer(keys.resolver(&name), rev) {
                        self.set_resolver(&name, holder);
                        events.push(StoreEvent::Resolver(name));
                    }
                }
                Update::Targets {
                    name,
                    rev,
                    value,
                    meta,
                } => {
                    let meta = first_put(meta, rev);
                    if self.newer(keys.targets(&name), rev) {
                        self.republish.remove(&name);
                        match value {
                            Some(mut set) => {
                                set.generation = rev;
                                self.meta.insert(keys.targets(&name), meta);
                                self.targets.insert(name.clone(), set);
                            }
                            None => {
                                self.meta.remove(&keys.targets(&name));
                                self.targets.remove(&name);
                            }
                        }
                        events.push(StoreEvent::Targets(name));
                    }
                }
                Update::Raw {
                    key,
                    rev,
                    lease,
                    value,
                    meta,
                } => {
                    let Some(kind) = keys.parse(&key) else {
                        continue;
                    };
                    let skey = String::from_utf8_lossy(&key).into_owned();
                    let newer = if matches!(kind, Kind::Binding(_)) {
                        self.staged_newer(&mut staged, skey.clone(), rev)
                    } else {
                        self.newer(skey.clone(), rev)
                    };
                    if !newer {
                        continue;
                    }
                    match kind {
                        Kind::Binding(name) => match value {
                            None => {
                                self.meta.remove(&skey);
                                self.forget_binding(&name, keys, rev);
                                decoded.remove(&name);
                                ops.push(MirrorOp::Remove(name));
                            }
                            Some(v) => {
                                self.meta.insert(skey.clone(), meta);
                                match keys::need_of(&v) {
                                    Some(n) => self.needs.insert(name.clone(), n),
                                    None => self.needs.remove(&name),
                                };
                                if let Some(sb) =
                                    self.binding_value(&skey, &name, &v, meta, keys, secrets)
                                {
                                    decoded.insert(name.clone(), rev);
                                    ops.push(MirrorOp::Put(sb));
                                }
                            }
                        },
                        Kind::Resolver(name) => {
                            let holder =
                                value.map(|v| (String::from_utf8_lossy(&v).into_owned(), lease));
                            self.set_resolver(&name, holder);
                            events.push(StoreEvent::Resolver(name));
                        }
                        Kind::Targets(name) => {
                            if self.targets_value(&skey, &name, rev, value, meta, keys, secrets) {
                                events.push(StoreEvent::Targets(name));
                            }
                        }
                        Kind::Integrity => self.integrity_value(&skey, value, meta, keys, secrets),
                        Kind::Outcome { binding, host, .. } => {
                            let entry = self.outcomes.entry(binding.clone()).or_default();
                            match value.and_then(|v| serde_json::from_slice::<HostOutcome>(&v).ok())
                            {
                                Some(mut o) => {
                                    o.host = host.clone();
                                    entry.insert(host, o);
                                }
                                None => {
                                    entry.remove(&host);
                                }
                            }
                            events.push(StoreEvent::Fleet(binding));
                        }
                        Kind::Unable { binding, host, old } => {
                            let entry = self.unable.entry(binding.clone()).or_default();
                            if value.is_some() {
                                entry.insert((host, old));
                            } else {
                                entry.remove(&(host, old));
                            }
                            // The choice of resolver may change: hosts that schedule the binding
                            // ask for the claim again.
                            events.push(StoreEvent::Resolver(binding));
                        }
                        Kind::Host(host) => {
                            match value.and_then(|v| serde_json::from_slice::<HostBeat>(&v).ok()) {
                                Some(beat) => {
                                    let since = self
                                        .hosts
                                        .get(&host)
                                        .map_or_else(Instant::now, |(_, s)| *s);
                                    self.hosts.insert(host.clone(), (beat, since));
                                }
                                None => {
                                    self.hosts.remove(&host);
                                }
                            }
                            // Who is alive changed: every fleet view may change.
                            if host != me {
                                events.push(StoreEvent::Status);
                            }
                        }
                    }
                }
            }
        }
        Batch {
            events,
            ops,
            staged,
            decoded,
        }
    }

    /// Forgets every revision and all fleet state (etcd was restored from a backup or is another
    /// cluster: its revisions mean nothing next to the ones held): the next full read applies
    /// every key as new and removes the bindings it does not return. The file's bindings stay
    /// until then.
    pub fn forget_revisions(&mut self) {
        self.revs.clear();
        self.file_revs.clear();
        self.queued.clear();
        self.epoch += 1;
        self.decoded_rev.clear();
        self.needs.clear();
        self.unreadable.clear();
        self.unable.clear();
        self.targets.clear();
        self.resolvers.clear();
        self.outcomes.clear();
        self.hosts.clear();
        self.unclaimed_since.clear();
        self.rewrite.clear();
        self.meta.clear();
        self.republish.clear();
    }

    /// Forgets what the mirror holds of binding `name`, removed at `rev`. A target set or claim
    /// of a later revision stays: the watch's two ranges (`sync.rs`) may deliver the set of a
    /// binding created again before the removal of the one before it.
    fn forget_binding(&mut self, name: &str, keys: &Keys, rev: i64) {
        // Also on this host's own removal (`Update::Binding`), whose echo is then not newer.
        self.meta.remove(&keys.binding(name));
        self.needs.remove(name);
        self.unreadable.remove(name);
        self.decoded_rev.remove(name);
        self.unable.remove(name);
        if self.rev_of(&keys.targets(name)) <= rev {
            self.targets.remove(name);
        }
        if self.rev_of(&keys.resolver(name)) <= rev {
            self.resolvers.remove(name);
        }
        self.outcomes.remove(name);
        self.unclaimed_since.remove(name);
        self.rewrite.remove(name);
        self.republish.remove(name);
        self.v1_configs.remove(name);
    }

    fn set_resolver(&mut self, name: &str, holder: Option<(String, i64)>) {
        match holder {
            Some(h) => {
                self.resolvers.insert(name.to_string(), h);
                self.unclaimed_since.remove(name);
            }
            None => {
                self.resolvers.remove(name);
                self.unclaimed_since
                    .insert(name.to_string(), Instant::now());
            }
        }
    }

    /// The keys the mirror holds that a full read at `snapshot_rev` did not return (removed
    /// while the mirror was not watching), as deletions.
    pub fn missing_from(
        &self,
        seen: &std::collections::HashSet<String>,
        snapshot_rev: i64,
        keys: &Keys,
    ) -> Vec<Update> {
        let mut out = Vec::new();
        let mut known: Vec<String> = self.revs.keys().cloned().collect();
        known.extend(self.file.names().map(|n| keys.binding(n)));
        // Not the outcomes: the full read does not return them (`sync.rs`); they are replaced
        // by each read of them (`fleet_read.rs`).
        known.extend(self.hosts.keys().map(|h| keys.host(h)));
        for (name, hosts) in &self.unable {
            known.extend(hosts.iter().map(|(h, old)| match old {
                true => keys.old_unable(name, h),
                false => keys.unable(name, h),
            }));
        }
        known.sort();
        known.dedup();
        for k in known {
            if !seen.contains(&k) && self.rev_of(&k) <= snapshot_rev {
                out.push(Update::Raw {
                    key: k.into_bytes(),
                    rev: snapshot_rev,
                    lease: 0,
                    value: None,
                    meta: Meta::default(),
                });
            }
        }
        out
    }
}
