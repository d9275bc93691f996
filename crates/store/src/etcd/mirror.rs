//! The local mirror of the prefix: bindings in a [`SqliteFile`] (they survive a restart while
//! etcd is down), fleet state in memory. Every applied key remembers the etcd revision it was
//! applied at, so a change older than (or equal to) what the mirror holds is ignored: the watch's
//! echo of this host's own writes, and a late event after a newer write.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::keys::{self, HostBeat, Keys, Kind};
use super::SecretKeys;
use crate::{
    FleetHost, FleetView, HostOutcome, SqliteFile, StoreError, StoreEvent, StoredBinding, TargetSet,
};

/// One change to apply, with the revision etcd made it at.
#[derive(Debug)]
pub enum Update {
    /// `None`: removed (with its targets, claim and outcomes).
    Binding {
        name: String,
        rev: i64,
        value: Option<StoredBinding>,
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
    },
    /// A raw key from the watch or a read, decoded by the mirror.
    Raw {
        key: Vec<u8>,
        rev: i64,
        lease: i64,
        value: Option<Vec<u8>>,
    },
}

/// What `claim_resolver` does, decided on the mirror.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    Mine,
    Other,
    Take,
    Release,
}

pub struct Mirror {
    pub file: SqliteFile,
    revs: HashMap<String, i64>,
    pub targets: HashMap<String, TargetSet>,
    resolvers: HashMap<String, (String, i64)>,
    /// Since when (locally) a binding has had no resolver.
    unclaimed_since: HashMap<String, Instant>,
    outcomes: HashMap<String, BTreeMap<String, HostOutcome>>,
    /// Live hosts: heartbeat and since when this host has seen it.
    hosts: HashMap<String, (HostBeat, Instant)>,
    /// Bindings sealed with a key that is not the active one (rewritten by the session task).
    pub stale_key: Vec<String>,
}

/// Rendezvous score of `host` for `binding`: the highest-scoring live host is the preferred
/// resolver, so bindings spread evenly and a host's death moves only its own bindings.
pub fn score(host: &str, binding: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(host.as_bytes());
    h.update([0]);
    h.update(binding.as_bytes());
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// Same state, times aside.
pub fn same_outcome(a: &HostOutcome, b: &HostOutcome) -> bool {
    a.state == b.state
        && a.generation == b.generation
        && a.servers == b.servers
        && a.message == b.message
        && a.host == b.host
}

impl Mirror {
    pub fn new(file: SqliteFile) -> Mirror {
        Mirror {
            file,
            revs: HashMap::new(),
            targets: HashMap::new(),
            resolvers: HashMap::new(),
            unclaimed_since: HashMap::new(),
            outcomes: HashMap::new(),
            hosts: HashMap::new(),
            stale_key: Vec::new(),
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

    /// Applies updates; returns the events for them (the caller emits them or not).
    pub fn apply(
        &mut self,
        updates: Vec<Update>,
        keys: &Keys,
        secrets: &SecretKeys,
        me: &str,
    ) -> Result<Vec<StoreEvent>, StoreError> {
        let mut events = Vec::new();
        let mut puts = Vec::new();
        let mut removes = Vec::new();
        for u in updates {
            match u {
                Update::Binding { name, rev, value } => {
                    if !self.newer(keys.binding(&name), rev) {
                        continue;
                    }
                    match value {
                        Some(sb) => puts.push(sb),
                        None => {
                            self.forget_binding(&name);
                            removes.push(name);
                        }
                    }
                }
                Update::Resolver { name, rev, holder } => {
                    if self.newer(keys.resolver(&name), rev) {
                        self.set_resolver(&name, holder);
                        events.push(StoreEvent::Resolver(name));
                    }
                }
                Update::Targets { name, rev, value } => {
                    if self.newer(keys.targets(&name), rev) {
                        match value {
                            Some(mut set) => {
                                set.generation = rev;
                                self.targets.insert(name.clone(), set);
                            }
                            None => {
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
                } => {
                    let Some(kind) = keys.parse(&key) else {
                        continue;
                    };
                    let skey = String::from_utf8_lossy(&key).into_owned();
                    if !self.newer(skey, rev) {
                        continue;
                    }
                    match kind {
                        Kind::Binding(name) => match value {
                            None => {
                                self.forget_binding(&name);
                                removes.push(name);
                            }
                            Some(v) => match keys::decode_binding(&name, &v, secrets) {
                                Ok((sb, key_id)) => {
                                    if key_id != secrets.active_id() {
                                        self.stale_key.push(name.clone());
                                    }
                                    puts.push(sb);
                                }
                                // Kept as it was: a binding this host cannot read is not
                                // removed (its servers stay), and the log says why.
                                Err(e) => {
                                    tracing::error!(binding = %name, error = %e, "binding from etcd not applied")
                                }
                            },
                        },
                        Kind::Resolver(name) => {
                            let holder =
                                value.map(|v| (String::from_utf8_lossy(&v).into_owned(), lease));
                            self.set_resolver(&name, holder);
                            events.push(StoreEvent::Resolver(name));
                        }
                        Kind::Targets(name) => {
                            match value.and_then(|v| serde_json::from_slice::<TargetSet>(&v).ok()) {
                                Some(mut set) => {
                                    set.generation = rev;
                                    self.targets.insert(name.clone(), set);
                                }
                                None => {
                                    self.targets.remove(&name);
                                }
                            }
                            events.push(StoreEvent::Targets(name));
                        }
                        Kind::Outcome { binding, host } => {
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
        if !puts.is_empty() || !removes.is_empty() {
            let (changed, clashes) = self.file.mirror_apply(&puts, &removes)?;
            for c in clashes {
                tracing::error!(binding = %c, "binding from etcd not applied: its name differs only in case from another binding's");
            }
            events.extend(changed.into_iter().map(StoreEvent::Binding));
        }
        Ok(events)
    }

    fn forget_binding(&mut self, name: &str) {
        self.targets.remove(name);
        self.resolvers.remove(name);
        self.outcomes.remove(name);
        self.unclaimed_since.remove(name);
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
        if let Ok(list) = self.file.list_bindings() {
            known.extend(list.into_iter().map(|b| keys.binding(&b.binding.name)));
        }
        for (name, hosts) in &self.outcomes {
            known.extend(hosts.keys().map(|h| keys.outcome(name, h)));
        }
        known.extend(self.hosts.keys().map(|h| keys.host(h)));
        known.sort();
        known.dedup();
        for k in known {
            if !seen.contains(&k) && self.rev_of(&k) <= snapshot_rev {
                out.push(Update::Raw {
                    key: k.into_bytes(),
                    rev: snapshot_rev,
                    lease: 0,
                    value: None,
                });
            }
        }
        out
    }

    pub fn outcome_of(&self, name: &str, host: &str) -> Option<HostOutcome> {
        self.outcomes.get(name)?.get(host).cloned()
    }

    pub fn binding_exists(&self, name: &str) -> bool {
        matches!(self.file.get_binding(name), Ok(Some(_)))
    }

    pub fn fleet_view(&self, name: &str) -> FleetView {
        FleetView {
            resolver: self.resolvers.get(name).map(|(h, _)| h.clone()),
            generation: self.targets.get(name).map_or(0, |t| t.generation),
            hosts: self
                .outcomes
                .get(name)
                .map(|m| {
                    m.values()
                        .map(|o| FleetHost {
                            alive: self.hosts.contains_key(&o.host),
                            outcome: o.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The live host preferred to resolve `name` (rendezvous hashing over heartbeats, this host
    /// counted live).
    fn preferred<'a>(&'a self, name: &str, me: &'a str) -> (&'a str, Option<Instant>) {
        let mut best = (me, None, score(me, name));
        for (h, (_, since)) in &self.hosts {
            let s = score(h, name);
            if s > best.2 || (s == best.2 && h.as_str() > best.0) {
                best = (h.as_str(), Some(*since), s);
            }
        }
        (best.0, best.1)
    }

    pub fn claim_decision(&mut self, name: &str, me: &str, lease: i64, ttl: Duration) -> Claim {
        let (preferred, seen_since) = self.preferred(name, me);
        let preferred_is_me = preferred == me;
        match self.resolvers.get(name) {
            Some((h, l)) if h == me && *l == lease => {
                // Hand over to a better-placed host once it has been live for a whole TTL
                // (no flapping while hosts come and go).
                let settled = seen_since.is_some_and(|s| s.elapsed() >= ttl);
                if !preferred_is_me && settled {
                    Claim::Release
                } else {
                    Claim::Mine
                }
            }
            Some(_) => Claim::Other,
            None => {
                let since = *self
                    .unclaimed_since
                    .entry(name.to_string())
                    .or_insert_with(Instant::now);
                // The preferred host takes it; anyone does when it stayed unclaimed for a TTL
                // (the preferred host is stuck, or does not schedule the binding yet).
                if preferred_is_me || since.elapsed() >= ttl {
                    Claim::Take
                } else {
                    Claim::Other
                }
            }
        }
    }
}
