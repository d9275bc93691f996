//! The live API's state in an upstream's zone: the per-upstream block ([`Shared`]) behind
//! [`LiveState`] with its gate lock, and [`LiveUpstream`], the pair of that state and the
//! upstream's zone list. Safe code on `ffi/pool/shm.rs` (the zone itself, [`ShmZone`], and the
//! block, lock and link primitives). What the live API does with them (`GET`, `PUT`, retiring and sweeping
//! peers) is `live/zone.rs`, safe code over these handles.
//!
//! The gate (an `ngx_rwlock` in the zone) is read-held by every peer selection and by `GET`,
//! write-held by a `PUT` (see `live/zone.rs` for the lock order and the recovery rules).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::health::{Health, HealthShared};
use super::peers::{Peers, Retired, RetiredChain, Slab};
use super::probe::Balancer;
use super::shm::{RwWord, ZoneLink, ZoneRef, ZoneShared};
use super::upstream::Upstream;

pub use super::shm::{ShmZone, ZoneData, ZoneInit, ZoneInitFn};

/// Per-upstream live state, allocated in the upstream's zone when the zone is created.
#[repr(C)]
pub struct Shared {
    /// See the module comment.
    gate: RwWord,
    /// Changes with every applied change; starts at the zone's creation time in milliseconds so
    /// a zone made by a reload never repeats an earlier generation.
    pub(crate) generation: AtomicU64,
    /// Retired peers (out of every list, connections still open). Used only with both list
    /// write locks held.
    retired: Retired,
    /// Number of peers in `retired` (read without lock as a hint).
    pub(crate) retiring: AtomicU64,
    /// Selections that found the set changed since their request's balancer data was made and
    /// made it again (see `balancer.rs`).
    pub(crate) rebalanced: AtomicU64,
    /// `ngx_current_msec` before which a `free` does not sweep (see `live/zone.rs`,
    /// `SWEEP_EVERY_MS`).
    pub(crate) next_sweep_ms: AtomicU64,
    /// Not 0 while nginx reads a new configuration that replaces this zone's (a reload): the
    /// token of that configuration (see `live/mod.rs`, `configuration_begins`). Set and cleared
    /// by the master; the API then answers 503 in the workers of this zone's configuration.
    superseded: AtomicU64,
    /// `retired_warn` in `ngx_current_msec` units (0: off), set when the zone is made.
    pub(crate) retired_warn_ms: AtomicU64,
    /// The removal time (`ngx_current_msec`) of the newest retired peer a `warn` line named:
    /// each is named once, by the worker that moves this forward.
    pub(crate) warned_since: AtomicU64,
    /// The upstream's per-server record table (`health.rs`; none: no `probe`), set when the
    /// zone is made.
    health: ZoneLink<HealthShared>,
    /// The run-time `down` bits a peer added by a `PUT` starts with (`down::CHECKING` under
    /// `probe ... mandatory`), set when the zone is made.
    pub(crate) new_peer_bits: AtomicU64,
    /// The id the next server that enters the set gets (`Peer::id`): ids of a zone are never
    /// given twice.
    pub(crate) next_id: AtomicU64,
}

// SAFETY: zeroed memory is a valid Shared (gate free, no retired peers, no table); every field
// is an atomic or made of atomics (`RwWord`, `Retired`, `ZoneLink`).
unsafe impl ZoneShared for Shared {}

/// A handle on one upstream's [`Shared`] block in its zone (valid as long as the zone: the
/// configuration's cycle).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LiveState {
    shared: ZoneRef<Shared>,
    /// The upstream whose state it is.
    up: Upstream,
}

impl LiveState {
    /// Allocates the state of `up` in the zone (while nginx creates the zone); None when it is
    /// full. `retired_warn_ms`: see [`Shared`] (0: off).
    pub fn create(
        slab: Slab,
        now_ms: u64,
        up: Upstream,
        retired_warn_ms: u64,
    ) -> Option<LiveState> {
        // Zeroed memory is a valid Shared (lock free, no retired peers).
        let shared = ZoneRef::calloc(slab)?;
        let st = LiveState { shared, up };
        st.shared()
            .generation
            .store(now_ms.max(1), Ordering::SeqCst);
        st.shared()
            .retired_warn_ms
            .store(retired_warn_ms, Ordering::SeqCst);
        Some(st)
    }

    /// The block (a shared reference: every field a worker changes is an atomic or made of
    /// atomics, see [`ZoneShared`]).
    pub(crate) fn shared(&self) -> &Shared {
        self.shared.get()
    }

    /// The current generation.
    pub fn generation(self) -> u64 {
        self.shared().generation.load(Ordering::SeqCst)
    }

    /// Marks the zone replaced by the configuration `token` nginx is reading (a reload).
    pub fn supersede(self, token: u64) {
        self.shared().superseded.store(token, Ordering::SeqCst);
    }

    /// Takes back [`Self::supersede`] of `token` (that configuration failed to load).
    pub fn withdraw(self, token: u64) {
        let _ =
            self.shared()
                .superseded
                .compare_exchange(token, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether a reload is replacing this zone's configuration.
    pub fn superseded(self) -> bool {
        self.shared().superseded.load(Ordering::SeqCst) != 0
    }

    /// Counts one request whose balancer data was made again after a change.
    pub fn count_rebalanced(self) {
        self.shared().rebalanced.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether retired peers wait to be freed (a hint read without lock).
    pub fn has_retiring(self) -> bool {
        self.shared().retiring.load(Ordering::Relaxed) > 0
    }

    /// Takes the gate for reading.
    pub fn gate_read(self) -> GateRead {
        self.shared().gate.rlock();
        GateRead(self)
    }

    /// Takes the gate for writing within `deadline`; None when it stays read- or write-held.
    pub(crate) fn gate_write(self, deadline: Instant) -> Option<GateWrite> {
        // Not `then_some`: a guard made eagerly would release a side never taken on drop.
        if self.shared().gate.wlock_until(deadline) {
            Some(GateWrite(self))
        } else {
            None
        }
    }
}

/// A held read side of the gate, released on drop.
pub struct GateRead(LiveState);

impl Drop for GateRead {
    fn drop(&mut self) {
        // Taken in `gate_read` by this process.
        self.0.shared().gate.unlock();
    }
}

/// A held write side of the gate, released on drop.
pub(crate) struct GateWrite(LiveState);

impl Drop for GateWrite {
    fn drop(&mut self) {
        // Taken in `gate_write` by this process.
        self.0.shared().gate.unlock();
    }
}

/// One live upstream: its state and its primary list (in the zone, with its slab pool).
#[derive(Clone, Copy, Debug)]
pub struct LiveUpstream {
    pub(crate) state: LiveState,
    pub(crate) primary: Peers,
    pub(crate) slab: Slab,
}

impl LiveUpstream {
    /// The live upstream of `state` and the zone list of `balancer`'s upstream; None unless
    /// both are the same upstream's (the lists' locks and the retired chain of `state` then
    /// belong together) and the balancer keeps nginx's round-robin list.
    pub fn new(state: LiveState, balancer: &Balancer) -> Option<LiveUpstream> {
        if balancer.upstream() != Some(state.up) {
            return None;
        }
        let primary = balancer.rr_list()?;
        Some(LiveUpstream {
            state,
            primary,
            slab: primary.slab()?,
        })
    }

    /// The retired chain (used by [`ListsWrite`](super::peers::ListsWrite)'s methods with the locks
    /// held).
    pub(crate) fn retired(self) -> RetiredChain {
        RetiredChain::new(NonNull::from(&self.state.shared().retired))
    }

    /// The upstream's live state.
    pub fn state(self) -> LiveState {
        self.state
    }

    /// Makes a record table for this upstream in its zone (while nginx makes the zone: `probe`)
    /// and the run-time `down` bits peers added later start with; false when the zone is full.
    pub fn create_health(self, new_peer_bits: usize) -> bool {
        let sh = self.state.shared();
        if Health::create(self.slab, &sh.health).is_none() {
            return false;
        }
        sh.new_peer_bits
            .store(new_peer_bits as u64, Ordering::SeqCst);
        true
    }

    /// The upstream's record table (an upstream with `probe`).
    pub fn health(self) -> Option<Health> {
        Health::linked(&self.state.shared().health, self.slab)
    }
}
