//! Shared memory, safe code: an upstream's zone ([`ShmZone`], with its `init` wrapper
//! [`ZoneInit`]) and the primitives the module's own blocks in a zone are built from, so that
//! `zone.rs` (the live state and its gate) and `health.rs` (the record table and the lease) are
//! safe code on them:
//! - [`ZoneShared`] / [`ZoneRef`]: a block of the module's in a zone, reached as `&T` — sound
//!   because every field another worker writes is an atomic (the trait's contract) and blocks
//!   are never freed before their zone;
//! - [`RwWord`]: an `ngx_rwlock` word in such a block, taken with nginx's functions (read side)
//!   or within a deadline ([`wlock_word`], the write side of every rwlock in a zone, the lists'
//!   too);
//! - [`ZoneTable`]: an array of plain records in the zone's slab behind its own [`RwWord`],
//!   copied out, changed in place or replaced under it;
//! - [`ZoneLink`]: a pointer from one block to another block of the same zone (checked when
//!   set).
//!
//! The types are declared here and their raw accesses (`unsafe {}`) are in the parent,
//! `pool.rs`, with the rest of nginx's memory; the fields are `pub(super)`: only `pool.rs` and
//! this file reach them.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::mem::{size_of, ManuallyDrop};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use ngx::ffi::{ngx_atomic_t, ngx_shm_zone_init_pt, ngx_shm_zone_t};

use crate::ffi::upstream::Upstream;
use crate::ffi::Status;
use ngx::ffi::ngx_slab_pool_t;

/// nginx's `NGX_RWLOCK_WLOCK`: the lock word of a write-held `ngx_rwlock` (0: free; otherwise
/// the number of readers).
const RWLOCK_WLOCK: u64 = u64::MAX;

/// Takes the write side of the nginx rwlock `word` like `ngx_rwlock_wlock` (the same lock word
/// transitions: 0 → `NGX_RWLOCK_WLOCK` by compare-and-swap, spinning with the CPU's pause hint
/// in rounds of growing length, yielding the CPU between rounds), but gives up once `deadline`
/// has passed (after at least one round): false, nothing held. Released with nginx's
/// `ngx_rwlock_unlock`. ([`super::wlock_until`] for a lock word of nginx's.)
#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
pub(super) fn wlock_word(word: &AtomicU64, deadline: Instant) -> bool {
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
pub struct RwWord(pub(super) AtomicU64);

const _: () = assert!(core::mem::size_of::<RwWord>() == core::mem::size_of::<ngx_atomic_t>());

impl RwWord {
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

    /// Takes the write side within `deadline` ([`wlock_word`]); false: nothing held.
    pub fn wlock_until(&self, deadline: Instant) -> bool {
        wlock_word(&self.0, deadline)
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
pub struct ZoneRef<T: ZoneShared>(pub(super) NonNull<T>);

impl<T: ZoneShared> ZoneRef<T> {
    /// Makes a zeroed block in `slab`; None when the zone is full.
    pub fn calloc(slab: Slab) -> Option<ZoneRef<T>> {
        slab.calloc::<T>().map(ZoneRef)
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
    pub(super) lock: RwWord,
    /// The array (slab) and its length: written only with the write side held.
    pub(super) array: AtomicPtr<T>,
    pub(super) len: AtomicUsize,
    _t: PhantomData<T>,
}

impl<T: Copy> ZoneTable<T> {
    /// The array and its length; stable while a side of the lock is held.
    pub(super) fn raw(&self) -> Option<(NonNull<T>, usize)> {
        let p = NonNull::new(self.array.load(Ordering::Relaxed))?;
        Some((p, self.len.load(Ordering::Relaxed)))
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
pub struct ZoneData(pub(super) *mut c_void);

/// A zone's `init` as nginx's upstream zone module set it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZoneInitFn(pub(super) ngx_shm_zone_init_pt);

impl ZoneInitFn {
    /// Set when there is one.
    pub fn is_some(self) -> bool {
        self.0.is_some()
    }
}

/// A handle on an upstream's shared-memory zone (`ngx_shm_zone_t`), valid as long as the
/// configuration (cycle) it belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ShmZone(pub(super) NonNull<ngx_shm_zone_t>);

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

    pub(super) fn raw(self) -> *mut ngx_shm_zone_t {
        self.0.as_ptr()
    }
}

// ---- a zone's slab pool (raw accesses in `pool.rs`) ---------------------------------------

/// The slab pool at the start of a shared-memory zone (`ngx_slab_pool_t`).
///
/// Invariant (made only by [`Slab::from_ptr`]): the pool of a live zone, alive as long as the
/// handle is used (the configuration's cycle); its words other than the set-once `start` and
/// `end` are read and written only under its mutex ([`SlabLocked`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slab(pub(super) NonNull<ngx_slab_pool_t>);

impl Slab {
    /// # Safety
    /// `p` is null or the slab pool at the start of a live shared-memory zone (`shm.addr`),
    /// alive as long as the handle is used (the configuration's cycle).
    pub unsafe fn from_ptr(p: *mut ngx_slab_pool_t) -> Option<Slab> {
        NonNull::new(p).map(Slab)
    }

    pub(in crate::ffi) fn raw(self) -> *mut ngx_slab_pool_t {
        self.0.as_ptr()
    }

    /// True when `addr` is inside the zone (the pool is at its start, `end` at its end).
    pub(in crate::ffi) fn contains(self, addr: usize) -> bool {
        (self.raw() as usize..self.end()).contains(&addr)
    }
}

/// A held slab mutex (made only by [`Slab::lock`], released on drop).
pub struct SlabLocked(pub(super) Slab);

/// The page words of a slab pool, read under its mutex ([`SlabLocked::pages`]).
pub struct SlabPages {
    /// `start`: the first page's address.
    pub start: usize,
    /// `end`: the end of the zone.
    pub end: usize,
    /// `pfree`: free pages.
    pub pfree: u64,
    /// nginx's page size (`ngx_pagesize`).
    pub page: u64,
}

impl SlabLocked {
    /// The pool.
    pub fn slab(&self) -> Slab {
        self.0
    }

    /// A zeroed `T` in the zone, owned by the box until [`SlabBox::into_raw`]; None when the
    /// zone is full.
    pub fn calloc<T: Zeroed>(&self) -> Option<SlabBox<'_, T>> {
        let p = self.calloc_raw(size_of::<T>())?;
        Some(SlabBox(p.cast::<T>(), self))
    }

    /// `n` zeroed bytes in the zone (at least one byte is allocated), owned like
    /// [`Self::calloc`]'s; None when the zone is full.
    pub fn calloc_bytes(&self, n: usize) -> Option<SlabBox<'_, [u8]>> {
        let p = self.calloc_raw(n.max(1))?;
        Some(SlabBox(NonNull::slice_from_raw_parts(p, n), self))
    }
}

/// Types that all-zero bytes make a valid value (plain C structures of integers and pointers,
/// structures of atomics), so [`SlabLocked::calloc`] can hand one out as `&mut`.
///
/// # Safety
/// The all-zero bit pattern is a valid `Self`, and `Self` needs no drop.
pub unsafe trait Zeroed {}

/// A zeroed allocation in a zone's slab that this process alone reaches: freed (under the
/// held mutex, which the box borrows) when dropped, or handed to the zone's structures with
/// [`SlabBox::into_raw`]. Invariant: the pointer is a live slab allocation of the locked pool,
/// holding a valid `T`, reached by nobody else until `into_raw`.
pub struct SlabBox<'a, T: ?Sized>(pub(super) NonNull<T>, pub(super) &'a SlabLocked);

impl<T: ?Sized> SlabBox<'_, T> {
    /// The address (for a structure that points at itself).
    pub fn as_ptr(&self) -> *mut T {
        self.0.as_ptr()
    }

    /// Gives the allocation to the zone: no longer freed here (the zone's owner frees it).
    pub fn into_raw(self) -> NonNull<T> {
        ManuallyDrop::new(self).0
    }
}
