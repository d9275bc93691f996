//! Shared memory: an upstream's zone ([`ShmZone`], with its `init` wrapper trampoline
//! [`ZoneInit`]) and the primitives the module's own blocks in a zone are built from, so that
//! `zone.rs` (the live state and its gate) and `health.rs` (the record table and the lease) are
//! safe code on them:
//! - [`ZoneShared`] / [`ZoneRef`]: a block of the module's in a zone, reached as `&T` — sound
//!   because every field another worker writes is an atomic (the trait's contract) and blocks
//!   are never freed before their zone;
//! - [`RwWord`]: an `ngx_rwlock` word in such a block, taken with nginx's functions (read side)
//!   or within a deadline ([`wlock_until`], the write side of every rwlock in a zone, the lists'
//!   too);
//! - [`ZoneTable`]: an array of plain records in the zone's slab behind its own [`RwWord`],
//!   copied out, changed in place or replaced under it;
//! - [`ZoneLink`]: a pointer from one block to another block of the same zone (checked when
//!   set).

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use ngx::ffi::{
    ngx_atomic_t, ngx_int_t, ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_shm_zone_init_pt,
    ngx_shm_zone_t, ngx_slab_free,
};

use super::counters::{Counters, Slot};
use super::peers::Slab;
use super::upstream::Upstream;
use super::{bytes, Status};

/// nginx's `NGX_RWLOCK_WLOCK`: the lock word of a write-held `ngx_rwlock` (0: free; otherwise
/// the number of readers).
const RWLOCK_WLOCK: u64 = u64::MAX;

/// Takes the write side of the nginx rwlock at `lock` like `ngx_rwlock_wlock` (the same lock
/// word transitions: 0 → `NGX_RWLOCK_WLOCK` by compare-and-swap, spinning with the CPU's pause
/// hint in rounds of growing length, yielding the CPU between rounds), but gives up once
/// `deadline` has passed (after at least one round): false, nothing held. Released with
/// nginx's `ngx_rwlock_unlock`.
///
/// # Safety
/// `lock` is an `ngx_rwlock` word in memory shared by the workers, live for the call.
#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
pub unsafe fn wlock_until(lock: *mut ngx_atomic_t, deadline: Instant) -> bool {
    // SAFETY: caller; the word is only ever used atomically (nginx's functions use the CPU's
    // atomic instructions on it, as `AtomicU64` does) and is suitably aligned (ngx_atomic_t).
    let word = unsafe { AtomicU64::from_ptr(lock) };
    let try_take = || {
        word.load(Ordering::Relaxed) == 0
            && word
                .compare_exchange(0, RWLOCK_WLOCK, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    };
    loop {
        // nginx's NGX_RWLOCK_SPIN rounds: 1, 2, 4, ... 1024 pauses between attempts.
        let mut n: u32 = 1;
        while n < 2048 {
            if try_take() {
                return true;
            }
            for _ in 0..n {
                core::hint::spin_loop();
            }
            n = n.wrapping_shl(1);
        }
        if try_take() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
}

/// An `ngx_rwlock` word (`ngx_atomic_t`) in a block of the module's in a zone; zeroed: free.
/// Whoever takes a side releases it with [`Self::unlock`] (the guards of `zone.rs`, or the
/// methods of [`ZoneTable`]).
#[repr(transparent)]
pub struct RwWord(AtomicU64);

const _: () = assert!(core::mem::size_of::<RwWord>() == core::mem::size_of::<ngx_atomic_t>());

impl RwWord {
    /// Takes the read side with nginx's `ngx_rwlock_rlock` (spins while it is write-held).
    pub fn rlock(&self) {
        // SAFETY: a live lock word, used only atomically (as nginx's functions do).
        unsafe { ngx_rwlock_rlock(self.0.as_ptr()) };
    }

    /// Takes the read side like `ngx_rwlock_rlock` (one more reader unless it is write-held)
    /// but gives up at `deadline`: false, nothing held.
    pub fn rlock_until(&self, deadline: Instant) -> bool {
        loop {
            for _ in 0..64 {
                let v = self.0.load(Ordering::Relaxed);
                if v != RWLOCK_WLOCK
                    && self
                        .0
                        .compare_exchange(v, v.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    return true;
                }
                core::hint::spin_loop();
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Takes the write side within `deadline` ([`wlock_until`]); false: nothing held.
    pub fn wlock_until(&self, deadline: Instant) -> bool {
        // SAFETY: a live lock word in shared memory.
        unsafe { wlock_until(self.0.as_ptr(), deadline) }
    }

    /// Releases the side this process took (nginx's `ngx_rwlock_unlock`).
    pub fn unlock(&self) {
        // SAFETY: a live lock word, used only atomically.
        unsafe { ngx_rwlock_unlock(self.0.as_ptr()) };
    }
}

/// A block type the module keeps in a zone and reaches through a shared reference
/// ([`ZoneRef`]).
///
/// # Safety
/// All-zero bytes are a valid value, and every field a process may write while another uses
/// the block is an atomic (or made of atomics: [`RwWord`], [`ZoneTable`], [`ZoneLink`], the
/// retired chain's head).
pub unsafe trait ZoneShared {}

/// A block of `T` the module made (zeroed) in a zone's slab: valid as long as the zone (the
/// configuration's cycle; blocks are never freed), reached as `&T` ([`ZoneShared`]).
pub struct ZoneRef<T: ZoneShared>(NonNull<T>);

impl<T: ZoneShared> ZoneRef<T> {
    /// Makes a zeroed block in `slab`; None when the zone is full.
    pub fn calloc(slab: Slab) -> Option<ZoneRef<T>> {
        slab.calloc::<T>().map(ZoneRef)
    }

    /// The block.
    pub fn get(&self) -> &T {
        // SAFETY: made zeroed by `calloc` (a valid T, ZoneShared) in a zone that outlives the
        // handle; a shared reference is sound (ZoneShared: what others write is atomic).
        unsafe { self.0.as_ref() }
    }

    fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl<T: ZoneShared> Clone for ZoneRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ZoneShared> Copy for ZoneRef<T> {}
impl<T: ZoneShared> PartialEq for ZoneRef<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<T: ZoneShared> Eq for ZoneRef<T> {}
impl<T: ZoneShared> core::fmt::Debug for ZoneRef<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "ZoneRef({:p})", self.0)
    }
}

/// A link from a block to a block of `T` in the same zone; zeroed: none.
pub struct ZoneLink<T>(AtomicPtr<T>);

impl<T: ZoneShared> ZoneLink<T> {
    /// Points the link (a field of a block in the zone of `slab`) at `r`; false (nothing
    /// changed) unless both are in that zone, so the target lives as long as the link.
    pub fn set(&self, slab: Slab, r: ZoneRef<T>) -> bool {
        let here = ptr::from_ref(self) as usize;
        if !slab.contains(here) || !slab.contains(r.addr()) {
            return false;
        }
        self.0.store(r.0.as_ptr(), Ordering::SeqCst);
        true
    }

    /// The linked block.
    pub fn get(&self) -> Option<ZoneRef<T>> {
        NonNull::new(self.0.load(Ordering::SeqCst)).map(ZoneRef)
    }
}

/// An array of plain records in a zone's slab behind its own rwlock (`lock`: read-held to copy
/// the records out, write-held to change them in place or to swap in a new array); zeroed: empty
/// and free. Its methods never wait without bound.
#[repr(C)]
pub struct ZoneTable<T: Copy> {
    lock: RwWord,
    /// The array (slab) and its length: written only with the write side held.
    array: AtomicPtr<T>,
    len: AtomicUsize,
    _t: PhantomData<T>,
}

impl<T: Copy> ZoneTable<T> {
    /// The array and its length; stable while a side of the lock is held.
    fn raw(&self) -> Option<(NonNull<T>, usize)> {
        let p = NonNull::new(self.array.load(Ordering::Relaxed))?;
        Some((p, self.len.load(Ordering::Relaxed)))
    }

    /// Runs `f` on the records; called only with a side of the lock held.
    fn with_records<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        match self.raw() {
            // SAFETY: `array` holds `len` initialised records (both set together under the
            // write side, by `replace_until`), stable while the caller holds a side of the lock.
            Some((p, len)) => f(unsafe { core::slice::from_raw_parts(p.as_ptr(), len) }),
            None => f(&[]),
        }
    }

    /// Runs `f` on the records; called only with the write side held.
    fn with_records_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        match self.raw() {
            // SAFETY: as in `with_records`; the write side excludes every other reader and
            // writer, so the slice is the only access meanwhile.
            Some((p, len)) => f(unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), len) }),
            None => f(&mut []),
        }
    }

    /// A copy of the records, read under the read side taken within `deadline`; None when it
    /// stays write-held (e.g. a worker died holding it: the caller goes on without them).
    pub fn read_until(&self, deadline: Instant) -> Option<Vec<T>> {
        if !self.lock.rlock_until(deadline) {
            return None;
        }
        let out = self.with_records(|r| r.to_vec());
        self.lock.unlock();
        Some(out)
    }

    /// Runs `f` on the records under the write side taken within `deadline`; None when it
    /// stays taken. `f` must not panic or allocate (the write side is held).
    pub fn modify_until<R>(&self, deadline: Instant, f: impl FnOnce(&mut [T]) -> R) -> Option<R> {
        if !self.lock.wlock_until(deadline) {
            return None;
        }
        let out = self.with_records_mut(f);
        self.lock.unlock();
        Some(out)
    }

    /// Makes the records a copy of `new`, allocated in `slab` (the zone that holds the table)
    /// before the lock is taken; `carry(old, new)` runs under the write side (to carry state
    /// over from the old records; must not panic or allocate). The old array is freed after the
    /// swap. False (nothing changed) when the table is not in `slab`'s zone, the zone is full
    /// or the lock stays taken.
    pub fn replace_until(
        &self,
        slab: Slab,
        new: &[T],
        deadline: Instant,
        carry: impl FnOnce(&[T], &mut [T]),
    ) -> bool {
        if !slab.contains(ptr::from_ref(self) as usize) {
            return false;
        }
        let bytes = core::mem::size_of::<T>() * new.len().max(1);
        let Some(fresh) = slab.alloc_bytes(bytes) else {
            return false;
        };
        let fresh = fresh.cast::<T>();
        // SAFETY: `fresh` has room for new.len() records, is aligned for any structure (slab)
        // and overlaps nothing.
        unsafe { ptr::copy_nonoverlapping(new.as_ptr(), fresh.as_ptr(), new.len()) };
        if !self.lock.wlock_until(deadline) {
            // SAFETY: allocated above from this zone's pool, never shared.
            unsafe { ngx_slab_free(slab.raw_pool(), fresh.as_ptr().cast()) };
            return false;
        }
        let old = self.raw();
        self.with_records(|old| {
            // SAFETY: `fresh` holds new.len() records written above, seen by nobody else yet.
            let f = unsafe { core::slice::from_raw_parts_mut(fresh.as_ptr(), new.len()) };
            carry(old, f);
        });
        self.array.store(fresh.as_ptr(), Ordering::Relaxed);
        self.len.store(new.len(), Ordering::Relaxed);
        self.lock.unlock();
        if let Some((old, _)) = old {
            // SAFETY: the old array is no longer reachable (swapped under the write side; every
            // reader copies under the read side); it was allocated from this zone's pool.
            unsafe { ngx_slab_free(slab.raw_pool(), old.as_ptr().cast()) };
        }
        true
    }
}

// ---- the zone ----------------------------------------------------------------------------

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
        // SAFETY: the zone is live (handle); `init` is read and written only while the
        // configuration is parsed and the zone made, on nginx's thread.
        ZoneInitFn(unsafe { (*self.raw()).init })
    }

    /// Makes `Z` the zone's `init`.
    pub fn wrap_init<Z: ZoneInit>(self) {
        // SAFETY: as in `init_fn`.
        unsafe { (*self.raw()).init = Some(zone_init::<Z>) };
    }

    /// The zone's slab pool, once the zone is mapped (`shm.addr`).
    pub fn slab(self) -> Option<Slab> {
        // SAFETY: the zone is live (handle); once mapped, `shm.addr` is the slab pool nginx
        // initialised at the start of the zone.
        unsafe { Slab::from_ptr((*self.raw()).shm.addr.cast()) }
    }
}

impl Counters {
    /// # Safety
    /// `p` is null or a [`Slot`] in a zone (a slab allocation, `SlabLocked::calloc_slot` or
    /// `SlabLocked::alloc_peer`), alive while the handle is used (it is freed with its peer).
    #[inline]
    pub(crate) unsafe fn from_ptr(p: *mut Slot) -> Option<Counters> {
        NonNull::new(p).map(Counters)
    }

    #[inline]
    pub(in crate::ffi) fn s(&self) -> &Slot {
        // SAFETY: the slot is live (handle); every field is an atomic, so a shared reference is
        // sound while other workers add to it.
        unsafe { self.0.as_ref() }
    }
}
