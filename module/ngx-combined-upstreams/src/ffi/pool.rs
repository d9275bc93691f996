//! nginx's memory, every raw access to it in one file: the bytes of its strings ([`bytes`]),
//! pools (the `ngx` crate's [`Pool`] plus allocations that report out of memory, plain data
//! without a cleanup entry, [`PoolCell`]), and shared memory — a zone's slab pool ([`Slab`], its
//! held mutex [`SlabLocked`], owned zeroed allocations [`SlabBox`]; `peers/slab.rs` is safe code
//! on them), an upstream's zone ([`shm::ShmZone`]) and the module's own blocks in it. The types
//! of shared memory are declared in the safe child [`shm`], with their safe logic; their raw
//! accesses are below.

use core::ffi::c_void;
use core::mem::size_of;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};
use core::slice;

use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ngx::core::{Pool, Status};
use ngx::ffi::{
    ngx_atomic_t, ngx_int_t, ngx_pagesize, ngx_pagesize_shift, ngx_pool_cleanup_add, ngx_pool_t,
    ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_shm_zone_t, ngx_shmtx_lock, ngx_shmtx_unlock,
    ngx_slab_calloc, ngx_slab_calloc_locked, ngx_slab_free, ngx_slab_free_locked, ngx_slab_stat_t,
    ngx_str_t,
};

use self::shm::{RwWord, ShmZone, ZoneData, ZoneInit, ZoneInitFn, ZoneRef, ZoneShared, ZoneTable};
pub use self::shm::{Slab, SlabBox, SlabLocked, SlabPages, Zeroed};
use super::counters::{Counters, Slot};
use super::peers::Peer;

pub mod shm;

/// The bytes of an `ngx_str_t` (empty for a null pointer).
///
/// # Safety
/// `s.data` must point to `s.len` readable bytes (or `s.len` must be 0) for `'a`.
#[inline]
pub(crate) unsafe fn bytes<'a>(s: &ngx_str_t) -> &'a [u8] {
    if s.len == 0 || s.data.is_null() {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { slice::from_raw_parts(s.data, s.len) }
}

/// The `ngx` crate's handle of a pool nginx keeps alive (the configuration's or a request's).
///
/// # Safety
/// `pool` is a live nginx pool for as long as the handle is used.
#[inline]
pub(crate) unsafe fn pool(pool: *mut ngx_pool_t) -> Pool {
    // SAFETY: guaranteed by the caller.
    unsafe { Pool::from_ngx_pool(pool) }
}

/// Copies `data` into `pool` as an `ngx_str_t`; `None` when out of memory.
#[inline]
pub(crate) fn copy_str(pool: &Pool, data: &[u8]) -> Option<ngx_str_t> {
    let p = pool.alloc_unaligned(data.len().max(1)).cast::<u8>();
    if p.is_null() {
        return None;
    }
    // SAFETY: p has room for data.len() bytes and does not overlap data (fresh allocation).
    unsafe { ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    Some(ngx_str_t {
        len: data.len(),
        data: p,
    })
}

/// Moves `value` into `pool` memory (released with the pool, without running destructors);
/// `None` when out of memory.
#[inline]
pub(crate) fn alloc<T>(pool: &Pool, value: T) -> Option<NonNull<T>> {
    const { assert!(!core::mem::needs_drop::<T>(), "pool memory never runs Drop") };
    // nginx pools align allocations to NGX_ALIGNMENT (at least pointer size), enough for the
    // module's structures, which hold pointers and integers.
    let p = NonNull::new(pool.alloc(core::mem::size_of::<T>().max(1)).cast::<T>())?;
    // SAFETY: p is non-null, aligned and large enough for T.
    unsafe { p.as_ptr().write(value) };
    Some(p)
}

/// Moves `value` into a `Box` that the pool frees (runs `Drop`) when it is destroyed.
pub(crate) fn alloc_box<T>(pool: &Pool, value: T) -> Option<NonNull<T>> {
    // SAFETY: the pool is live (handle).
    let cln = unsafe { ngx_pool_cleanup_add(pool.as_ptr(), 0) };
    if cln.is_null() {
        return None;
    }
    let p = Box::into_raw(Box::new(value));
    // SAFETY: cln was just returned by nginx and is ours to fill.
    unsafe {
        (*cln).handler = Some(drop_box::<T>);
        (*cln).data = p.cast::<c_void>();
    }
    NonNull::new(p)
}

unsafe extern "C" fn drop_box<T>(data: *mut c_void) {
    // SAFETY: data was produced by Box::into_raw in alloc_box and is dropped exactly once here.
    drop(unsafe { Box::from_raw(data.cast::<T>()) });
}

/// A plain value (`Copy`: nothing to drop) in a request tree's pool, made by
/// [`crate::ffi::request::Req::alloc_cell`]; the pool outlives every request that can reach the
/// handle. Values are copied in and out ([`PoolCell::get`], [`PoolCell::set`],
/// [`PoolCell::update`]): no reference into the pool memory exists between calls, so a handler
/// that nginx re-enters (a variable evaluated from the filter chain) cannot alias one.
pub struct PoolCell<T: Copy>(NonNull<T>);

impl<T: Copy> Clone for PoolCell<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Copy> Copy for PoolCell<T> {}
impl<T: Copy> PartialEq for PoolCell<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<T: Copy> Eq for PoolCell<T> {}
impl<T: Copy> core::fmt::Debug for PoolCell<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "PoolCell({:p})", self.0)
    }
}

impl<T: Copy> PoolCell<T> {
    /// # Safety
    /// `p` points at an initialised `T` in a pool that outlives every use of the handle, and
    /// is only used from nginx's thread.
    pub(crate) unsafe fn from_raw(p: NonNull<T>) -> PoolCell<T> {
        PoolCell(p)
    }

    /// The address (for nginx's context slot).
    pub(crate) fn as_ptr(self) -> *mut T {
        self.0.as_ptr()
    }

    /// A copy of the value.
    #[inline]
    pub fn get(self) -> T {
        // SAFETY: see `from_raw`; plain data, read by value.
        unsafe { self.0.as_ptr().read() }
    }

    /// Replaces the value.
    #[inline]
    pub fn set(self, value: T) {
        // SAFETY: see `from_raw`; plain data, written by value (no reference is alive).
        unsafe { self.0.as_ptr().write(value) }
    }

    /// Changes the value through `f` on a copy, then stores the copy.
    #[inline]
    pub fn update<R>(self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut v = self.get();
        let r = f(&mut v);
        self.set(v);
        r
    }
}

/// What runs when a pool is destroyed ([`add_cleanup`]).
pub trait Cleanup {
    /// Runs with the `data` the cleanup was added with.
    fn run(data: usize);
}

extern "C" fn cleanup<C: Cleanup>(data: *mut c_void) {
    C::run(data as usize);
}

/// Makes `C::run(data)` run when `pool` is destroyed; false when out of memory.
pub fn add_cleanup<C: Cleanup>(pool: &Pool, data: usize) -> bool {
    // SAFETY: the pool is live (handle).
    let cln = unsafe { ngx_pool_cleanup_add(pool.as_ptr(), 0) };
    if cln.is_null() {
        return false;
    }
    // SAFETY: cln was just returned by nginx and is ours to fill.
    unsafe {
        (*cln).handler = Some(cleanup::<C>);
        (*cln).data = data as *mut c_void;
    }
    true
}

impl Slab {
    /// Allocates zeroed memory for a `T` in the zone; None when the zone is full. Takes the
    /// pool's mutex itself.
    pub fn calloc<T>(self) -> Option<NonNull<T>> {
        // SAFETY: the pool is live (handle); ngx_slab_calloc locks it and returns zeroed memory
        // aligned for any structure or null.
        NonNull::new(unsafe { ngx_slab_calloc(self.raw(), size_of::<T>()) }.cast::<T>())
    }

    /// Allocates `n` bytes in the zone (not zeroed); None when it is full. Takes the mutex.
    pub fn alloc_bytes(self, n: usize) -> Option<NonNull<u8>> {
        // SAFETY: the pool is live (handle); ngx_slab_alloc locks it.
        NonNull::new(unsafe { ngx::ffi::ngx_slab_alloc(self.raw(), n) }.cast::<u8>())
    }

    /// The end of the zone (`end`, set once by ngx_slab_init).
    pub(super) fn end(self) -> usize {
        // SAFETY: the pool is live (handle); `end` is a plain word written once at init.
        unsafe { (*self.raw()).end as usize }
    }

    /// Takes the pool's mutex, released by the guard.
    pub fn lock(self) -> SlabLocked {
        // SAFETY: the mutex lives in the pool (handle).
        unsafe { ngx_shmtx_lock(ptr::addr_of_mut!((*self.raw()).mutex)) };
        SlabLocked(self)
    }
}

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl SlabLocked {
    /// The pool's page words now.
    pub fn pages(&self) -> SlabPages {
        let pool = self.0.raw();
        // SAFETY: the pool is live (handle) and locked (guard); `start`, `end`, `pfree` are plain
        // words; `ngx_pagesize` is a plain global nginx sets at start.
        unsafe {
            SlabPages {
                start: (*pool).start as usize,
                end: (*pool).end as usize,
                pfree: (*pool).pfree as u64,
                page: ngx_pagesize as u64,
            }
        }
    }

    /// Runs `f` with the pool's `min_shift` and its statistics per size class (nginx updates
    /// them under the mutex, which is held).
    pub fn size_classes<T>(&self, f: impl FnOnce(usize, &[ngx_slab_stat_t]) -> T) -> T {
        let pool = self.0.raw();
        // SAFETY: the pool is live (handle) and its mutex held (guard), so nothing writes the
        // statistics while `f` reads them; `stats` has one entry per size class,
        // `ngx_pagesize_shift - min_shift` of them (as ngx_slab_init makes it).
        unsafe {
            let shift = (*pool).min_shift;
            let classes = ngx_pagesize_shift.saturating_sub(shift);
            f(
                shift,
                core::slice::from_raw_parts((*pool).stats as *const ngx_slab_stat_t, classes),
            )
        }
    }

    /// Turns nginx's `[crit] ngx_slab_alloc() failed: no memory` line on or off; returns the
    /// previous setting.
    pub fn set_log_nomem(&self, on: bool) -> bool {
        // SAFETY: the pool is live and its mutex held (guard).
        unsafe {
            let pool = self.0.raw();
            let was = (*pool).log_nomem() != 0;
            (*pool).set_log_nomem(u32::from(on));
            was
        }
    }

    pub(super) fn calloc_raw(&self, n: usize) -> Option<NonNull<u8>> {
        // SAFETY: the pool is live and its mutex held (guard); the memory returned is zeroed,
        // aligned for any structure, or null.
        NonNull::new(unsafe { ngx_slab_calloc_locked(self.0.raw(), n) }.cast::<u8>())
    }

    /// Frees a peer and the slab allocations it owns, as [`super::peers::SlabLocked::alloc_peer`]
    /// made them or the zone module copied them (through
    /// [`super::peers::ListsWrite::free_unlinked`], which checks what it can of the contract).
    ///
    /// # Safety
    /// `p` belongs to this zone and nobody uses it any more: it is in no list, not in use
    /// ([`Peer::in_use`] false), the write locks of every list it was in are held by this
    /// process, and the caller drops every copy of the handle.
    pub(in crate::ffi) unsafe fn free_peer(&self, p: Peer) {
        let f = p.fields();
        #[cfg(ngx_upstream_sid)]
        let sid = f.sid.data.cast::<c_void>();
        #[cfg(not(ngx_upstream_sid))]
        let sid = ptr::null_mut::<c_void>();
        let owned = [
            f.ssl_session,
            sid,
            f.server.data.cast(),
            f.name.data.cast(),
            f.sockaddr.cast(),
            f.start_time as *mut c_void,
            p.raw().cast(),
        ];
        for q in owned.into_iter().filter(|q| !q.is_null()) {
            // SAFETY: caller; each pointer is a slab allocation of this pool, freed once, under
            // the held mutex (guard).
            unsafe { ngx_slab_free_locked(self.0.raw(), q) };
        }
    }
}

impl Drop for SlabLocked {
    fn drop(&mut self) {
        // SAFETY: taken in `Slab::lock` by this process.
        unsafe { ngx_shmtx_unlock(ptr::addr_of_mut!((*self.0.raw()).mutex)) };
    }
}

impl<T: ?Sized> Deref for SlabBox<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a valid T that nobody else reaches (the box's invariant).
        unsafe { self.0.as_ref() }
    }
}

impl<T: ?Sized> DerefMut for SlabBox<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes the reference unique.
        unsafe { self.0.as_mut() }
    }
}

impl<T: ?Sized> Drop for SlabBox<'_, T> {
    fn drop(&mut self) {
        // SAFETY: a slab allocation of the pool (invariant) that nobody else reaches, freed
        // once; the borrowed guard is alive, so the mutex is held.
        unsafe { ngx_slab_free_locked(self.1 .0.raw(), self.0.as_ptr().cast()) };
    }
}

// ---- the module's blocks in a zone, and the zone (`shm.rs` is the safe code on them) -------

/// [`shm::wlock_word`] on an `ngx_rwlock` word of nginx's (the lists' locks).
///
/// # Safety
/// `lock` is an `ngx_rwlock` word in memory shared by the workers, live for the call.
pub unsafe fn wlock_until(lock: *mut ngx_atomic_t, deadline: Instant) -> bool {
    // SAFETY: caller; the word is only ever used atomically (nginx's functions use the CPU's
    // atomic instructions on it, as `AtomicU64` does) and is suitably aligned (ngx_atomic_t).
    shm::wlock_word(unsafe { AtomicU64::from_ptr(lock) }, deadline)
}

impl RwWord {
    /// Takes the read side with nginx's `ngx_rwlock_rlock` (spins while it is write-held).
    pub fn rlock(&self) {
        // SAFETY: a live lock word, used only atomically (as nginx's functions do).
        unsafe { ngx_rwlock_rlock(self.0.as_ptr()) };
    }

    /// Releases the side this process took (nginx's `ngx_rwlock_unlock`).
    pub fn unlock(&self) {
        // SAFETY: a live lock word, used only atomically.
        unsafe { ngx_rwlock_unlock(self.0.as_ptr()) };
    }
}

impl<T: ZoneShared> ZoneRef<T> {
    /// The block.
    pub fn get(&self) -> &T {
        // SAFETY: made zeroed by `calloc` (a valid T, ZoneShared) in a zone that outlives the
        // handle; a shared reference is sound (ZoneShared: what others write is atomic).
        unsafe { self.0.as_ref() }
    }
}

impl<T: Copy> ZoneTable<T> {
    /// Runs `f` on the records; called only with a side of the lock held.
    fn with_records<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        match self.raw() {
            // SAFETY: `array` holds `len` initialised records (both set together under the
            // write side, by `replace_until`), stable while the caller holds a side of the lock.
            Some((p, len)) => f(unsafe { slice::from_raw_parts(p.as_ptr(), len) }),
            None => f(&[]),
        }
    }

    /// Runs `f` on the records; called only with the write side held.
    fn with_records_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        match self.raw() {
            // SAFETY: as in `with_records`; the write side excludes every other reader and
            // writer, so the slice is the only access meanwhile.
            Some((p, len)) => f(unsafe { slice::from_raw_parts_mut(p.as_ptr(), len) }),
            None => f(&mut []),
        }
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
        let bytes = size_of::<T>() * new.len().max(1);
        let Some(fresh) = slab.alloc_bytes(bytes) else {
            return false;
        };
        let fresh = fresh.cast::<T>();
        // SAFETY: `fresh` has room for new.len() records, is aligned for any structure (slab)
        // and overlaps nothing.
        unsafe { ptr::copy_nonoverlapping(new.as_ptr(), fresh.as_ptr(), new.len()) };
        if !self.lock.wlock_until(deadline) {
            // SAFETY: allocated above from this zone's pool, never shared.
            unsafe { ngx_slab_free(slab.raw(), fresh.as_ptr().cast()) };
            return false;
        }
        let old = self.raw();
        self.with_records(|old| {
            // SAFETY: `fresh` holds new.len() records written above, seen by nobody else yet.
            let f = unsafe { slice::from_raw_parts_mut(fresh.as_ptr(), new.len()) };
            carry(old, f);
        });
        self.array.store(fresh.as_ptr(), Ordering::Relaxed);
        self.len.store(new.len(), Ordering::Relaxed);
        self.lock.unlock();
        if let Some((old, _)) = old {
            // SAFETY: the old array is no longer reachable (swapped under the write side; every
            // reader copies under the read side); it was allocated from this zone's pool.
            unsafe { ngx_slab_free(slab.raw(), old.as_ptr().cast()) };
        }
        true
    }
}

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

impl ZoneInitFn {
    /// Runs it for `z`, the zone it was read from, with nginx's `data`.
    pub fn call(self, z: ShmZone, data: ZoneData) -> Status {
        match self.0 {
            // SAFETY: the zone module's init, called with nginx's own arguments.
            Some(f) => Status(unsafe { f(z.raw(), data.0) }),
            None => Status::NGX_ERROR,
        }
    }
}

impl ShmZone {
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
    /// The slot, shared with the other workers.
    #[inline]
    pub(in crate::ffi) fn s(&self) -> &Slot {
        // SAFETY: the slot is live (handle); every field is an atomic, so a shared reference is
        // sound while other workers add to it.
        unsafe { self.0.as_ref() }
    }
}
