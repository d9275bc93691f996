//! nginx pools: the `ngx` crate's [`Pool`] handle plus what it lacks here — allocations that
//! report out of memory (`Pool::allocate` writes through a null pointer when the pool is full),
//! plain data without a cleanup entry, and [`PoolCell`], a handle on plain data in a pool.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::core::Pool;
use ngx::ffi::{ngx_pool_cleanup_add, ngx_pool_t, ngx_str_t};

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
