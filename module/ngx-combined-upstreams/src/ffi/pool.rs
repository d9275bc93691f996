//! nginx's memory: the bytes of its strings ([`bytes`]) and its allocators. Pools: the `ngx`
//! crate's [`Pool`] handle plus what it lacks here — allocations that report out of memory
//! (`Pool::allocate` writes through a null pointer when the pool is full), plain data without a
//! cleanup entry, and [`PoolCell`], a handle on plain data in a pool. A zone's slab pool:
//! [`Slab`], its held mutex [`SlabLocked`] and the owned zeroed allocations made under it
//! ([`SlabBox`]), on which `peers/slab.rs` is safe code.

use core::ffi::c_void;
use core::mem::{size_of, ManuallyDrop};
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};
use core::slice;

use ngx::core::Pool;
use ngx::ffi::{
    ngx_pagesize, ngx_pagesize_shift, ngx_pool_cleanup_add, ngx_pool_t, ngx_shmtx_lock,
    ngx_shmtx_unlock, ngx_slab_calloc, ngx_slab_calloc_locked, ngx_slab_free_locked,
    ngx_slab_pool_t, ngx_slab_stat_t, ngx_str_t,
};

use super::peers::Peer;

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

/// The slab pool at the start of a shared-memory zone (`ngx_slab_pool_t`).
///
/// Invariant (made only by [`Slab::from_ptr`]): the pool of a live zone, alive as long as the
/// handle is used (the configuration's cycle); its words other than the set-once `start` and
/// `end` are read and written only under its mutex ([`SlabLocked`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slab(NonNull<ngx_slab_pool_t>);

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

    /// The pool, for `ngx_slab_free` of what [`Self::alloc_bytes`] returned.
    pub(crate) fn raw_pool(self) -> *mut ngx_slab_pool_t {
        self.raw()
    }

    /// True when `addr` is inside the zone (the pool is at its start, `end` at its end).
    pub(in crate::ffi) fn contains(self, addr: usize) -> bool {
        (self.raw() as usize..self.end()).contains(&addr)
    }

    /// The end of the zone (`end`, set once by ngx_slab_init).
    fn end(self) -> usize {
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

/// A held slab mutex (made only by [`Slab::lock`], released on drop).
pub struct SlabLocked(Slab);

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

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl SlabLocked {
    /// The pool.
    pub fn slab(&self) -> Slab {
        self.0
    }

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

    fn calloc_raw(&self, n: usize) -> Option<NonNull<u8>> {
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
pub struct SlabBox<'a, T: ?Sized>(NonNull<T>, &'a SlabLocked);

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
