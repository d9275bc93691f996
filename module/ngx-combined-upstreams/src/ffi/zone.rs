//! The live API's shared memory: [`ShmZone`] (an upstream's `zone`) with its `init` wrapper
//! trampoline ([`ZoneInit`]), and the per-upstream state block in the zone ([`Shared`]) behind
//! [`LiveState`] with its gate lock, and [`LiveUpstream`], the pair of that state and the
//! upstream's zone list. What the live API does with them (`GET`, `PUT`, retiring and sweeping
//! peers) is `live/zone.rs`, safe code over these handles.
//!
//! The gate (an `ngx_rwlock` in the zone) is read-held by every peer selection and by `GET`,
//! write-held by a `PUT` (see `live/zone.rs` for the lock order and the recovery rules).

use core::ffi::c_void;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ngx::ffi::{
    ngx_atomic_t, ngx_int_t, ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_shm_zone_init_pt,
    ngx_shm_zone_t,
};

use super::health::Health;
use super::peers::{wlock_until, Peers, Retired, RetiredChain, Slab};
use super::probe::Balancer;
use super::upstream::Upstream;
use super::{bytes, Status};

/// A zone's `init` wrapper.
pub trait ZoneInit {
    /// Initialises zone `z` (call the original through [`ZoneInitFn::call`] with `data`).
    fn init(z: ShmZone, data: ZoneData) -> Status;
}

/// nginx's `data` argument of a zone's `init` (the zone's data of the previous cycle), passed
/// on unchanged.
#[derive(Clone, Copy, Debug)]
pub struct ZoneData(*mut c_void);

extern "C" fn zone_init<Z: ZoneInit>(
    shm_zone: *mut ngx_shm_zone_t,
    data: *mut c_void,
) -> ngx_int_t {
    // SAFETY: nginx passes the zone it is creating, of the configuration being started.
    match unsafe { ShmZone::from_ptr(shm_zone) } {
        Some(z) => Z::init(z, ZoneData(data)).0,
        None => Status::NGX_ERROR.0,
    }
}

/// A zone's `init` as nginx's upstream zone module set it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZoneInitFn(ngx_shm_zone_init_pt);

impl ZoneInitFn {
    /// Set when there is one.
    pub fn is_some(self) -> bool {
        self.0.is_some()
    }

    /// Runs it for `z`, the zone it was read from, with nginx's `data`.
    pub fn call(self, z: ShmZone, data: ZoneData) -> Status {
        match self.0 {
            // SAFETY: the zone module's init, called with nginx's own arguments.
            Some(f) => Status(unsafe { f(z.raw(), data.0) }),
            None => Status::NGX_ERROR,
        }
    }
}

/// A handle on an upstream's shared-memory zone (`ngx_shm_zone_t`), valid as long as the
/// configuration (cycle) it belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ShmZone(NonNull<ngx_shm_zone_t>);

impl ShmZone {
    /// The zone of `up`, when it has one.
    pub fn of(up: Upstream) -> Option<ShmZone> {
        up.shm_zone().map(ShmZone)
    }

    /// # Safety
    /// `z` is null or a shared-memory zone of a live configuration (nginx's argument to a
    /// zone's `init`).
    pub(crate) unsafe fn from_ptr(z: *mut ngx_shm_zone_t) -> Option<ShmZone> {
        NonNull::new(z).map(ShmZone)
    }

    fn raw(self) -> *mut ngx_shm_zone_t {
        self.0.as_ptr()
    }

    /// The zone's name.
    pub fn name(self) -> String {
        // SAFETY: the zone and its name live as long as the configuration (handle).
        String::from_utf8_lossy(unsafe { bytes(&(*self.raw()).shm.name) }).into_owned()
    }

    /// The zone's `init`, to call from a wrapper.
    pub fn init_fn(self) -> ZoneInitFn {
        ZoneInitFn(self.init())
    }

    /// Makes `Z` the zone's `init`.
    pub fn wrap_init<Z: ZoneInit>(self) {
        self.set_init(Some(zone_init::<Z>));
    }

    fn init(self) -> ngx_shm_zone_init_pt {
        // SAFETY: the zone is live (handle); `init` is read and written only while the
        // configuration is parsed and the zone made, on nginx's thread.
        unsafe { (*self.raw()).init }
    }

    fn set_init(self, f: ngx_shm_zone_init_pt) {
        // SAFETY: as in `init`.
        unsafe { (*self.raw()).init = f };
    }

    /// The zone's slab pool, once the zone is mapped (`shm.addr`).
    pub fn slab(self) -> Option<Slab> {
        // SAFETY: the zone is live (handle); once mapped, `shm.addr` is the slab pool nginx
        // initialised at the start of the zone.
        unsafe { Slab::from_ptr((*self.raw()).shm.addr.cast()) }
    }
}

/// Per-upstream live state, allocated in the upstream's zone when the zone is created.
#[repr(C)]
pub struct Shared {
    /// See the module comment.
    gate: ngx_atomic_t,
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
    /// The address of the upstream's per-server record table (`health.rs`; 0: no `probe`), set
    /// when the zone is made.
    health: AtomicU64,
    /// The run-time `down` bits a peer added by a `PUT` starts with (`down::CHECKING` under
    /// `probe ... mandatory`), set when the zone is made.
    pub(crate) new_peer_bits: AtomicU64,
    /// The id the next server that enters the set gets (`Peer::id`): ids of a zone are never
    /// given twice.
    pub(crate) next_id: AtomicU64,
}

/// A handle on one upstream's [`Shared`] block in its zone (valid as long as the zone: the
/// configuration's cycle).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LiveState {
    shared: NonNull<Shared>,
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
        let shared = slab.calloc::<Shared>()?;
        let st = LiveState { shared, up };
        st.shared()
            .generation
            .store(now_ms.max(1), Ordering::SeqCst);
        st.shared()
            .retired_warn_ms
            .store(retired_warn_ms, Ordering::SeqCst);
        Some(st)
    }

    /// The atomics of the block (a shared reference: every field a worker changes without a
    /// lock is an atomic; `gate` is used only through nginx's lock functions and `retired` only
    /// through [`LiveUpstream`] with the list locks held, both by raw pointer).
    pub(crate) fn shared(&self) -> &Shared {
        // SAFETY: the block lives as long as the zone (handle); see above.
        unsafe { self.shared.as_ref() }
    }

    fn gate(self) -> *mut ngx_atomic_t {
        // SAFETY: the block is live (handle); no reference is made.
        unsafe { ptr::addr_of_mut!((*self.shared.as_ptr()).gate) }
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
        // SAFETY: the lock word lives in the zone (handle).
        unsafe { ngx_rwlock_rlock(self.gate()) };
        GateRead(self)
    }

    /// Takes the gate for writing within `deadline`; None when it stays read- or write-held.
    pub(crate) fn gate_write(self, deadline: Instant) -> Option<GateWrite> {
        // SAFETY: as in gate_read.
        unsafe { wlock_until(self.gate(), deadline) }.then(|| GateWrite(self))
    }
}

/// A held read side of the gate, released on drop.
pub struct GateRead(LiveState);

impl Drop for GateRead {
    fn drop(&mut self) {
        // SAFETY: taken in `gate_read` by this process.
        unsafe { ngx_rwlock_unlock(self.0.gate()) };
    }
}

/// A held write side of the gate, released on drop.
pub(crate) struct GateWrite(LiveState);

impl Drop for GateWrite {
    fn drop(&mut self) {
        // SAFETY: taken in `gate_write` by this process.
        unsafe { ngx_rwlock_unlock(self.0.gate()) };
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

    /// The retired chain (used by [`ListsWrite`]'s methods with the locks held).
    pub(crate) fn retired(self) -> RetiredChain {
        // SAFETY: the block is live and not null (handle): the address of one of its fields is
        // not null either; no reference is made.
        let head = unsafe {
            NonNull::new_unchecked(ptr::addr_of_mut!((*self.state.shared.as_ptr()).retired))
        };
        RetiredChain::new(head)
    }

    /// The upstream's live state.
    pub fn state(self) -> LiveState {
        self.state
    }

    /// Makes a record table for this upstream in its zone (while nginx makes the zone: `probe`)
    /// and the run-time `down` bits peers added later start with; false when the zone is full.
    pub fn create_health(self, new_peer_bits: usize) -> bool {
        let Some(h) = Health::create(self.slab) else {
            return false;
        };
        let sh = self.state.shared();
        sh.health.store(h.addr(), Ordering::SeqCst);
        sh.new_peer_bits
            .store(new_peer_bits as u64, Ordering::SeqCst);
        true
    }

    /// The upstream's record table (an upstream with `probe`).
    pub fn health(self) -> Option<Health> {
        let a = self.state.shared().health.load(Ordering::SeqCst);
        // SAFETY: set only by `create_health` to a block in this zone, which lives as long as
        // the zone.
        unsafe { Health::from_addr(a, self.slab) }
    }
}
