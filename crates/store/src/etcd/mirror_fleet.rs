//! The mirror's fleet side: who is alive and who is gone (heartbeats, the outcomes read), the
//! fleet view of a binding, the host that collects what gone hosts left, and the resolver choice
//! (rendezvous hashing over the live hosts able to resolve a binding; `claims.rs` acts on it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::Mirror;
use crate::{FleetHost, FleetView, HostOutcome};

/// What `claim_resolver` does, decided on the mirror.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    Mine,
    Other,
    Take,
    Release,
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
    /// The hosts with an outcome of some binding and no heartbeat (gone, or not known yet).
    pub fn gone_hosts(&self) -> std::collections::HashSet<String> {
        self.outcomes
            .values()
            .flat_map(|hosts| hosts.keys())
            .filter(|h| !self.hosts.contains_key(*h))
            .cloned()
            .collect()
    }

    /// Whether `me` is the live host that collects what gone hosts left (`gc.rs`): the highest
    /// rendezvous score among the heartbeats, this host counted live.
    pub fn collects(&self, me: &str) -> bool {
        let key = "\0gone-hosts";
        let mine = score(me, key);
        self.hosts
            .keys()
            .filter(|h| h.as_str() != me)
            .all(|h| (score(h, key), h.as_str()) < (mine, me))
    }

    /// Every host known: live ones (heartbeat; `me` always) and those with an outcome, by id.
    pub fn members(&self, me: &str) -> Vec<crate::FleetMember> {
        let mut ids: BTreeSet<&str> = self.hosts.keys().map(String::as_str).collect();
        ids.insert(me);
        ids.extend(
            self.outcomes
                .values()
                .flat_map(|h| h.keys().map(String::as_str)),
        );
        ids.into_iter()
            .map(|h| crate::FleetMember {
                host: h.to_string(),
                alive: h == me || self.hosts.contains_key(h),
            })
            .collect()
    }

    /// Replaces the outcomes held, of binding `name` or of every binding, by `read` (what etcd
    /// holds now, `fleet_read.rs`).
    pub fn set_outcomes(
        &mut self,
        name: Option<&str>,
        read: HashMap<String, BTreeMap<String, HostOutcome>>,
    ) {
        match name {
            Some(n) => {
                let hosts = read.into_values().next().unwrap_or_default();
                if self.binding_exists(n) || !hosts.is_empty() {
                    self.outcomes.insert(n.to_string(), hosts);
                }
            }
            None => self.outcomes = read,
        }
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

    /// The revision of the binding key whose value the mirror holds decoded (`None`: the newest
    /// value could not be decoded, or the binding is unknown).
    pub fn decoded_rev(&self, name: &str) -> Option<i64> {
        if self.unreadable.contains(name) {
            return None;
        }
        self.decoded_rev.get(name).copied()
    }

    /// Whether `host` can resolve `name`: it did not step out of it, and its capabilities (this
    /// host's own, or the other host's heartbeat) cover the binding's newest value. This host
    /// also cannot when it could not decode that value.
    pub fn able(&self, host: &str, name: &str, me: &str) -> bool {
        if self
            .unable
            .get(name)
            .is_some_and(|s| s.iter().any(|(h, _)| h == host))
        {
            return false;
        }
        let can = if host == me {
            if self.unreadable.contains(name) {
                return false;
            }
            self.can.as_ref()
        } else {
            self.hosts.get(host).and_then(|(b, _)| b.can.as_ref())
        };
        match (can, self.needs.get(name)) {
            (Some(can), Some(need)) => can.covers(need),
            _ => true,
        }
    }

    /// The live host preferred to resolve `name` (rendezvous hashing over heartbeats, this host
    /// counted live) among those able to resolve it, or among all when none is; and whether any
    /// live host is able.
    pub(super) fn preferred<'a>(
        &'a self,
        name: &str,
        me: &'a str,
    ) -> (&'a str, Option<Instant>, bool) {
        let mut candidates: Vec<(&str, Option<Instant>)> = vec![(me, None)];
        candidates.extend(
            self.hosts
                .iter()
                .filter(|(h, _)| h.as_str() != me)
                .map(|(h, (_, since))| (h.as_str(), Some(*since))),
        );
        let able: Vec<(&str, Option<Instant>)> = candidates
            .iter()
            .copied()
            .filter(|(h, _)| self.able(h, name, me))
            .collect();
        let any_able = !able.is_empty();
        let pool = if any_able { able } else { candidates };
        let mut best = (me, None, 0u64, false);
        for (h, since) in pool {
            let s = score(h, name);
            if !best.3 || s > best.2 || (s == best.2 && h > best.0) {
                best = (h, since, s, true);
            }
        }
        (best.0, best.1, any_able)
    }

    pub fn claim_decision(&mut self, name: &str, me: &str, lease: i64, ttl: Duration) -> Claim {
        let (preferred, seen_since, any_able) = self.preferred(name, me);
        let preferred_is_me = preferred == me;
        // This host cannot resolve the binding and another live host can: it never takes the
        // claim, and gives it up at once when it holds it.
        let stand_aside = any_able && !self.able(me, name, me);
        match self.resolvers.get(name) {
            Some((h, l)) if h == me && *l == lease && stand_aside => Claim::Release,
            None if stand_aside => Claim::Other,
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
