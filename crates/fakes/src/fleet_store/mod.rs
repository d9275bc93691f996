//! An in-memory fleet of [`BindingStore`]s for the daemon's engine tests, with no etcd: several
//! members (one per simulated host) share one state, and each member sees the others' changes as
//! [`StoreEvent`]s, as the etcd store's watch delivers them. It keeps the store contract of
//! `crates/store/src/binding_store.rs`:
//!
//! - reads are local: a member that cannot reach the store ([`Fleet::set_reachable`]) answers
//!   from a frozen copy of the state it last saw (its "mirror"), and its writes fail with
//!   [`StoreError::Unavailable`]; `publish_host_outcome` is kept and written when it is back, and
//!   it then gets a [`StoreEvent::Resync`];
//! - events are about others: a change through one member is not echoed to it;
//! - one resolver claim per binding, spread over the live reachable members (rendezvous hashing on
//!   the binding's name); a member that is not the preferred one takes an unclaimed binding only
//!   once it stayed unclaimed for [`Fleet::fallback`]. [`Fleet::kill`] plays a host whose lease
//!   expired: its claims go and the others get [`StoreEvent::Resolver`].
//!
//! Not a model of etcd's timing (no leases, no TTL): the tests drive those moments themselves.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::broadcast;
use tributary_store::{
    lock, now_ms, BindingRecord, BindingStore, FleetHost, FleetView, HostOutcome, OutcomeRecord,
    StoreError, StoreEvent, StoreStatus, StoredBinding, TargetSet, Upsert,
};

mod member;

/// History kept per binding and member.
const HISTORY: usize = 50;

#[derive(Clone, Default)]
struct Data {
    bindings: BTreeMap<String, StoredBinding>,
    targets: HashMap<String, TargetSet>,
    /// binding → host → outcome.
    outcomes: HashMap<String, BTreeMap<String, HostOutcome>>,
    /// binding → holder.
    claims: HashMap<String, String>,
}

struct Member {
    alive: bool,
    /// `Some`: cannot reach the store since then; reads answer from `mirror`.
    unreachable: Option<(i64, Data)>,
    events: broadcast::Sender<StoreEvent>,
    history: HashMap<String, Vec<OutcomeRecord>>,
    /// Host outcomes published while unreachable, written when back.
    pending: BTreeMap<String, HostOutcome>,
}

struct Shared {
    data: Data,
    members: BTreeMap<String, Member>,
    /// binding → since when nobody holds its claim (for the fallback).
    unclaimed_since: HashMap<String, Instant>,
    generation: i64,
    last_ms: i64,
    fallback: Duration,
    /// Claim calls per member (for the tests).
    claims_asked: HashMap<String, u64>,
    /// A member that is back gets `Resync` after `Status` (default: yes).
    resync_on_return: bool,
}

/// The shared state of a simulated fleet. Cheap to clone.
#[derive(Clone)]
pub struct Fleet {
    shared: Arc<Mutex<Shared>>,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet::new()
    }
}

fn score(host: &str, binding: &str) -> u64 {
    // FNV-1a over host + binding: a stable rendezvous weight.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.bytes().chain([0u8]).chain(binding.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Shared {
    fn tick_ms(&mut self) -> i64 {
        // Strictly growing, so two saves in the same millisecond differ.
        self.last_ms = now_ms().max(self.last_ms + 1);
        self.last_ms
    }

    fn usable(&self, host: &str) -> bool {
        self.members
            .get(host)
            .is_some_and(|m| m.alive && m.unreachable.is_none())
    }

    fn preferred(&self, binding: &str) -> Option<String> {
        self.members
            .keys()
            .filter(|h| self.usable(h))
            .max_by_key(|h| score(h, binding))
            .cloned()
    }

    /// Sends `ev` to every live reachable member but `from`.
    fn tell_others(&self, from: &str, ev: StoreEvent) {
        for (h, m) in &self.members {
            if h != from && m.alive && m.unreachable.is_none() {
                let _ = m.events.send(ev.clone());
            }
        }
    }

    fn check(&self, host: &str) -> Result<(), StoreError> {
        if self.usable(host) {
            Ok(())
        } else {
            Err(StoreError::Unavailable {
                store: "fleet (in-memory test store)".into(),
                why: format!("member {host} is cut off"),
            })
        }
    }

    fn view<'a>(&'a self, host: &str) -> &'a Data {
        match self.members.get(host).and_then(|m| m.unreachable.as_ref()) {
            Some((_, mirror)) => mirror,
            None => &self.data,
        }
    }
}

impl Fleet {
    pub fn new() -> Fleet {
        Fleet {
            shared: Arc::new(Mutex::new(Shared {
                data: Data::default(),
                members: BTreeMap::new(),
                unclaimed_since: HashMap::new(),
                generation: 0,
                last_ms: 0,
                fallback: Duration::from_secs(3600),
                claims_asked: HashMap::new(),
                resync_on_return: true,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    /// How long an unclaimed binding waits for its preferred member before any member takes it
    /// (default: one hour, i.e. only the preferred member claims).
    pub fn fallback(&self, d: Duration) {
        self.lock().fallback = d;
    }

    /// Whether a member that is back gets `Resync` after `Status` (a store may send only
    /// `Status` and the per-key events of what changed meanwhile).
    pub fn resync_on_return(&self, yes: bool) {
        self.lock().resync_on_return = yes;
    }

    /// A new member (host) of the fleet, live and reachable.
    pub fn member(&self, host_id: &str) -> Arc<FleetMember> {
        let mut s = self.lock();
        s.members.insert(
            host_id.to_string(),
            Member {
                alive: true,
                unreachable: None,
                events: broadcast::channel(1024).0,
                history: HashMap::new(),
                pending: BTreeMap::new(),
            },
        );
        Arc::new(FleetMember {
            fleet: self.clone(),
            host_id: host_id.to_string(),
        })
    }

    /// Plays the store becoming unreachable for `host` (`false`) or reachable again (`true`).
    /// Back: its pending host outcomes are written and it gets `Resync`.
    pub fn set_reachable(&self, host: &str, reachable: bool) {
        let mut s = self.lock();
        let resync = s.resync_on_return;
        let data = s.data.clone();
        let now = now_ms();
        let Some(m) = s.members.get_mut(host) else {
            return;
        };
        if reachable == m.unreachable.is_none() {
            return;
        }
        let pending = if reachable {
            m.unreachable = None;
            std::mem::take(&mut m.pending)
        } else {
            m.unreachable = Some((now, data));
            BTreeMap::new()
        };
        let _ = m.events.send(StoreEvent::Status);
        if reachable && resync {
            let _ = m.events.send(StoreEvent::Resync);
        }
        for (name, o) in pending {
            s.data
                .outcomes
                .entry(name.clone())
                .or_default()
                .insert(host.to_string(), o);
            s.tell_others(host, StoreEvent::Fleet(name));
        }
    }

    /// Plays a host that died (its lease expired): it is no longer live, its claims are released
    /// and the other members are told to claim.
    pub fn kill(&self, host: &str) {
        let mut s = self.lock();
        if let Some(m) = s.members.get_mut(host) {
            m.alive = false;
        }
        let released: Vec<String> = s
            .data
            .claims
            .iter()
            .filter(|(_, h)| *h == host)
            .map(|(n, _)| n.clone())
            .collect();
        for n in released {
            s.data.claims.remove(&n);
            s.tell_others(host, StoreEvent::Resolver(n));
        }
    }

    /// Who holds the claim of `binding` now.
    pub fn resolver(&self, binding: &str) -> Option<String> {
        self.lock().data.claims.get(binding).cloned()
    }

    /// The member `claim_resolver` would pick for an unclaimed `binding` now.
    pub fn preferred(&self, binding: &str) -> Option<String> {
        self.lock().preferred(binding)
    }

    /// How many times `host` called `claim_resolver`.
    pub fn claims_asked(&self, host: &str) -> u64 {
        self.lock().claims_asked.get(host).copied().unwrap_or(0)
    }
}

/// One host's store: a member of a [`Fleet`].
pub struct FleetMember {
    fleet: Fleet,
    host_id: String,
}

impl fmt::Debug for FleetMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetMember")
            .field("host_id", &self.host_id)
            .finish()
    }
}

impl FleetMember {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.fleet.lock()
    }
}
