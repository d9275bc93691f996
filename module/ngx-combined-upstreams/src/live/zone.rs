//! The live state of one upstream in its zone ([`Shared`]) and the operations on it: reading
//! the set, applying a `PUT` (which retires busy peers), slab figures. Freeing retired peers
//! once idle and warning about overdue ones: `retired.rs`.
//!
//! Locks (all in the zone, so they work across workers):
//! - `Shared::gate` (an `ngx_rwlock`): read-held by every peer selection (the balancer wrapper
//!   in `balancer.rs`) and by `GET`; write-held by a `PUT`. While a `PUT` holds it no worker is
//!   between reading the generation and selecting a peer, so a selection never sees a set that
//!   its per-request `tried` bitmap was not sized for.
//! - the lists' own rwlocks (`ngx_http_upstream_rr_peers_t.rwlock`, primary then backup), which
//!   nginx's balancers take: write-held while lists change and while retired peers are freed.
//! - the slab mutex, taken last.
//!
//! Order: gate → primary list → backup list → slab mutex. nginx's balancers never hold both
//! lists at once, and take the slab mutex only inside a list lock.
//!
//! Recovery: the rwlocks have no owner, so one whose holder died stays held until a reload makes
//! a new zone (nginx frees the slab mutex of a dead worker itself). Write sides are therefore
//! taken with a deadline (`peers::wlock_until`): a `PUT` waits at most [`WRITE_WAIT`] for the
//! gate and the list locks together, then answers 503 "busy, retry" having changed nothing (the
//! daemon then takes the reload path, which makes a new zone); a sweep of retired peers tries
//! once and leaves them for a later sweep. Read sides (selections, `GET`) never wait for a dead
//! reader: an rwlock admits readers while it is not write-held. What runs with a write side held
//! is panic-free ([`LiveUpstream::swap`], [`LiveUpstream::sweep`]; see `ffi/peers/`), so an
//! abort never leaves one held; a worker killed in the microseconds a `PUT` holds one stalls
//! the selections of that upstream until a reload (the one unrecovered case).
//!
//! The fence: [`LiveState`] is a handle on the [`Shared`] block (made by [`LiveState::create`]
//! in the zone); [`LiveUpstream`] pairs it with the upstream's primary list (`unsafe`
//! constructor: they must be the same upstream's). Their methods are safe; the guards
//! ([`GateRead`], `GateWrite`, and `peers`' list and slab guards) release what they hold on drop.

use core::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use upstrand_core::live::plan::{totals, ListTotals};
use upstrand_core::live::render::{PutView, ServerView, SlabView, UpstreamView};
use upstrand_core::live::{plan, sizing, ApiError, Current, PutRequest, Server};

use crate::ffi::peers::{peer_layout, Peer};
pub use crate::ffi::zone::LiveUpstream;

/// How long a `PUT` waits for the write sides of the gate and the list locks together before it
/// answers 503.
pub const WRITE_WAIT: Duration = Duration::from_secs(1);

/// nginx's cached monotonic clock in milliseconds (the same clock in every worker).
pub(super) fn now_ms() -> u64 {
    crate::ffi::current_msec()
}

/// How often a `PUT` plans again when another `PUT` changed the set between its read of the set
/// and its write lock, before it answers 503.
const PLAN_ATTEMPTS: usize = 8;

impl LiveUpstream {
    /// How many of `tried` (socket addresses of a request's tries, see `ListRead::count_up`) are
    /// addresses of servers of the current set that are not `down`.
    pub fn tried_here<'a>(self, tried: impl Iterator<Item = &'a [u8]> + Clone) -> usize {
        let primary = self.primary.read().count_up(tried.clone());
        primary
            + self
                .primary
                .backup()
                .map_or(0, |b| b.read().count_up(tried))
    }

    /// The tries a new request gets now (nginx's `ngx_http_upstream_tries`: the `tries` of the
    /// primary and the backup list).
    pub fn fresh_tries(self) -> usize {
        let primary = self.primary.read().tries();
        primary + self.primary.backup().map_or(0, |b| b.read().tries())
    }

    /// `GET <loc>/NAME`.
    pub fn view(self) -> UpstreamView {
        self.sweep();
        // The gate keeps the lists and the generation still while they are read, the list
        // locks keep the per-peer figures consistent.
        let _g = self.state.gate_read();
        let mut servers = Vec::new();
        for (list, backup) in [(Some(self.primary), false), (self.primary.backup(), true)] {
            let Some(list) = list else { continue };
            let lock = list.read();
            for p in lock.peers() {
                let (name, st) = p.name_and_state();
                let c = p.current(backup);
                servers.push(ServerView {
                    id: Some(p.id()),
                    address: name,
                    weight: c.as_ref().map_or(0, |c| u64::from(c.weight)),
                    max_fails: c.as_ref().map_or(0, |c| u64::from(c.max_fails)),
                    fail_timeout_ms: c.as_ref().map_or(0, |c| u64::from(c.fail_timeout_s) * 1000),
                    max_conns: c.as_ref().map_or(0, |c| u64::from(c.max_conns)),
                    backup,
                    down: c.as_ref().is_some_and(|c| c.down),
                    drain: c.as_ref().is_some_and(|c| c.drain),
                    active: st.conns,
                    fails: st.fails,
                    health: None,
                    stats: Some(
                        p.counters()
                            .map(|c| c.read().to_stats())
                            .unwrap_or_default(),
                    ),
                });
            }
        }
        let retired = if self.state.has_retiring() {
            self.primary.read_both().retired(self.retired(), now_ms())
        } else {
            Vec::new()
        };
        let sh = self.state.shared();
        UpstreamView {
            generation: self.state.generation(),
            servers,
            retiring: sh.retiring.load(Ordering::SeqCst),
            retired,
            rebalanced: sh.rebalanced.load(Ordering::Relaxed),
            probe: None,
        }
    }

    /// `GET <loc>/NAME?slab`: the zone's slab figures.
    pub fn slab(self, zone: &str) -> SlabView {
        self.slab.figures(zone)
    }

    /// Applies a `PUT` (see `docs/live-api.md` for the semantics); `zone` and `name` name the
    /// upstream in error messages.
    ///
    /// The set is read and the change planned (with every buffer and name it needs) under the
    /// gate's read side; the change is then made under the write sides ([`Self::swap`]) if the
    /// generation is still the one read, else planned again.
    pub fn apply(self, name: &str, zone: &str, req: &PutRequest) -> Result<PutView, ApiError> {
        let deadline = Instant::now() + WRITE_WAIT;
        for _ in 0..PLAN_ATTEMPTS {
            let snap = self.snapshot(name)?;
            if let Some(want) = req.generation {
                if want != snap.generation {
                    return Err(ApiError::generation_conflict(want, snap.generation));
                }
            }
            let p = plan(&snap.current, &req.servers);
            if p.unchanged {
                return Ok(PutView {
                    generation: snap.generation,
                    changed: false,
                    added: 0,
                    removed: 0,
                    retiring: self.state.shared().retiring.load(Ordering::SeqCst),
                    names: Default::default(),
                });
            }
            let mut slots: Vec<Slot> = req
                .servers
                .iter()
                .map(|_| Slot {
                    kept: None,
                    name: None,
                    peer: None,
                })
                .collect();
            for &(i, j) in &p.keep {
                if let (Some(slot), Some(peer)) = (slots.get_mut(j), snap.peers.get(i)) {
                    slot.kept = Some(*peer);
                    slot.peer = Some(*peer);
                }
            }
            for &j in &p.add {
                if let (Some(slot), Some(s)) = (slots.get_mut(j), req.servers.get(j)) {
                    slot.name = Some(s.addr.name());
                }
            }
            let removed: Vec<Peer> = p
                .remove
                .iter()
                .filter_map(|&i| snap.peers.get(i).copied())
                .collect();
            let change = Change {
                generation: snap.generation,
                servers: &req.servers,
                slots: &mut slots,
                removed: &removed,
                totals: [totals(&req.servers, false), totals(&req.servers, true)],
                need_backup_list: req.servers.iter().any(|x| x.backup),
            };
            match self.swap(change, deadline) {
                Swapped::Done {
                    generation,
                    retiring,
                } => {
                    return Ok(PutView {
                        generation,
                        changed: true,
                        added: p.add.len() as u64,
                        removed: p.remove.len() as u64,
                        retiring,
                        names: p.names(&snap.current, &req.servers),
                    })
                }
                Swapped::Moved => continue,
                Swapped::Superseded => return Err(ApiError::superseded(name)),
                Swapped::Busy => return Err(ApiError::busy(name, WRITE_WAIT.as_secs())),
                Swapped::Full => {
                    // Measured after the locks are released (the figures under the slab mutex,
                    // the sessions under the lists' read locks).
                    let new_names: Vec<u64> = slots
                        .iter()
                        .filter_map(|s| s.name.as_ref().map(|n| n.len() as u64))
                        .collect();
                    let need = sizing::zone_need(
                        &self.slab.shape(),
                        &peer_layout(),
                        &new_names,
                        self.tls_session_bytes(),
                    );
                    return Err(ApiError::zone_full(name, zone, need));
                }
            }
        }
        Err(ApiError::busy(name, WRITE_WAIT.as_secs()))
    }

    /// The largest TLS session stored in the zone for a server of the set (0: none); read under
    /// the gate's and the lists' read sides.
    fn tls_session_bytes(self) -> u64 {
        let _g = self.state.gate_read();
        let mut most = 0;
        for list in [Some(self.primary), self.primary.backup()] {
            let Some(list) = list else { continue };
            let lock = list.read();
            for p in lock.peers() {
                most = most.max(p.ssl_session_len());
            }
        }
        most
    }

    /// The current set (primary first: the plan's current index order) and its generation, read
    /// under the gate's read side.
    fn snapshot(self, name: &str) -> Result<Snapshot, ApiError> {
        if self.state.superseded() {
            return Err(ApiError::superseded(name));
        }
        let _g = self.state.gate_read();
        let mut snap = Snapshot {
            generation: self.state.generation(),
            peers: Vec::new(),
            current: Vec::new(),
        };
        for (list, backup) in [(Some(self.primary), false), (self.primary.backup(), true)] {
            let Some(list) = list else { continue };
            let lock = list.read();
            for p in lock.peers() {
                let Some(c) = p.current(backup) else {
                    return Err(ApiError::new(
                        409,
                        format!("upstream \"{name}\" has a server with an address family the API cannot handle"),
                    ));
                };
                snap.peers.push(p);
                snap.current.push(c);
            }
        }
        Ok(snap)
    }

    /// Makes a planned change under the gate's and both lists' write sides, taken within
    /// `deadline`. Panic-free while they are held (see `ffi/peers/`): everything that allocates
    /// on the heap was made by the caller.
    #[deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::arithmetic_side_effects
    )]
    fn swap(self, c: Change<'_>, deadline: Instant) -> Swapped {
        let Some(gate) = self.state.gate_write(deadline) else {
            return Swapped::Busy;
        };
        // No change since the snapshot (every change moves the generation, and only a change
        // frees a member): its peers are still members of their lists, as the plan says.
        if self.state.generation() != c.generation {
            return Swapped::Moved;
        }
        // A reload began since the snapshot: its zone is made from the files, not from this one.
        if self.state.superseded() {
            return Swapped::Superseded;
        }
        let Some(lists) = self.primary.write_both(deadline) else {
            return Swapped::Busy;
        };
        let [primary_totals, backup_totals] = c.totals;
        let now = now_ms();
        let sh = self.state.shared();

        // Allocate everything new first: a full zone changes nothing.
        let mut new_backup = None;
        {
            let m = self.slab.lock();
            // A full zone is answered with 507; nginx's "[crit] ngx_slab_alloc() failed: no
            // memory" line for it would only repeat that, so it is off while these allocate.
            let log_nomem = m.set_log_nomem(false);
            let mut failed = false;
            let run_bits = sh.new_peer_bits.load(Ordering::Relaxed) as usize;
            for (slot, s) in c.slots.iter_mut().zip(c.servers) {
                if let Some(name) = &slot.name {
                    let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
                    match m.alloc_peer(s, name, run_bits, id) {
                        Some(np) => slot.peer = Some(np),
                        None => {
                            failed = true;
                            break;
                        }
                    }
                }
            }
            if !failed && c.need_backup_list && self.primary.backup().is_none() {
                match m.alloc_list(self.primary) {
                    Some(b) => new_backup = Some(b),
                    None => failed = true,
                }
            }
            m.set_log_nomem(log_nomem);
            if failed {
                for slot in c.slots.iter() {
                    if let (Some(np), Some(_)) = (slot.peer, &slot.name) {
                        // Allocated just above, never linked: carries the unlinked mark.
                        lists.free_unlinked(&m, np);
                    }
                }
                return Swapped::Full;
            }
        }

        // Swap under the list write locks.
        if let Some(b) = new_backup {
            // A backup list made by this process after the locks were taken is not locked by
            // them, but nobody can use it before the generation changes below, and the gate
            // keeps every selection out until then.
            lists.set_backup(b);
        }
        for (slot, s) in c.slots.iter().zip(c.servers) {
            if let Some(p) = slot.kept {
                lists.set_settings(p, s);
            }
        }
        let members = |backup: bool| {
            c.slots
                .iter()
                .zip(c.servers)
                .filter(move |(_, s)| s.backup == backup)
                .filter_map(|(slot, _)| slot.peer)
        };
        lists.set_lists(
            (members(false), primary_totals),
            (members(true), backup_totals),
        );
        let mut retired = 0u64;
        {
            let m = self.slab.lock();
            let chain = self.retired();
            for &old in c.removed {
                // Out of every list since `set_lists` (it carries the unlinked mark, which both
                // calls check); `old` is not used again.
                if old.in_use() {
                    if lists.retire(chain, old, now) {
                        retired = retired.wrapping_add(1);
                    }
                } else {
                    lists.free_unlinked(&m, old);
                }
            }
        }
        let retiring = sh
            .retiring
            .fetch_add(retired, Ordering::SeqCst)
            .wrapping_add(retired);
        let generation = sh.generation.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        drop(lists);
        drop(gate);
        Swapped::Done {
            generation,
            retiring,
        }
    }
}

/// The set a `PUT` read under the gate's read side.
struct Snapshot {
    generation: u64,
    /// The peers, primary list first.
    peers: Vec<Peer>,
    /// Their settings, in the same order.
    current: Vec<Current>,
}

/// The place of one wanted server in a planned change.
struct Slot {
    /// The current peer that stays for it.
    kept: Option<Peer>,
    /// For a new peer: its name (`Addr::name`), made before the locks are taken.
    name: Option<String>,
    /// Its peer: the kept one, or the new one once allocated.
    peer: Option<Peer>,
}

/// A planned change, with everything [`LiveUpstream::swap`] needs already on the heap.
struct Change<'a> {
    /// The generation the plan was made for.
    generation: u64,
    servers: &'a [Server],
    /// One per server of `servers`.
    slots: &'a mut [Slot],
    /// Current peers that leave the set.
    removed: &'a [Peer],
    /// Totals of the primary and the backup list.
    totals: [ListTotals; 2],
    /// Some wanted server is a backup.
    need_backup_list: bool,
}

/// What [`LiveUpstream::swap`] did.
enum Swapped {
    Done {
        generation: u64,
        retiring: u64,
    },
    /// The set changed since it was planned for: nothing done.
    Moved,
    /// A write side stayed taken until the deadline: nothing done.
    Busy,
    /// The zone has no room: nothing done.
    Full,
    /// A reload is replacing this zone's configuration: nothing done.
    Superseded,
}
