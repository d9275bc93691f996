//! Configuration structures of the module, allocated from nginx's configuration pool.

use core::ffi::c_void;
use core::ptr;

use ngx::ffi::{ngx_conf_t, ngx_http_upstream_init_pt, ngx_pcalloc};

/// `http {}`-level configuration. Features add their fields here.
#[derive(Default)]
pub struct MainConf {
    /// Upstrands of this configuration (owned by the configuration pool).
    pub upstrand: Option<core::ptr::NonNull<crate::upstrand::Registry>>,
}

/// Per `server {}` / `upstream {}` block configuration (nginx creates one for every upstream block).
#[derive(Default)]
pub struct SrvConf {
    /// `extend_single_peers` was given in this upstream block.
    pub extend_single_peers: bool,
    /// The upstream's `init_upstream` before `extend_single_peers` wrapped it (None: round robin).
    pub original_init_upstream: ngx_http_upstream_init_pt,
    /// Set when the wrapper really ran (a balancer directive after ours would replace it).
    pub extend_single_peers_ran: bool,
}

/// Allocates a `T::default()` in the configuration pool; null on allocation failure.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing. `T` must not need `Drop` (pool memory is
/// released without running destructors).
unsafe fn pool_alloc<T: Default>(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: cf is valid (caller); ngx_pcalloc returns zeroed, suitably aligned memory or null.
    let p = unsafe { ngx_pcalloc((*cf).pool, core::mem::size_of::<T>().max(1)) }.cast::<T>();
    if p.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: p is non-null, aligned and large enough for T.
    unsafe { p.write(T::default()) };
    p.cast()
}

/// `create_main_conf` hook.
pub unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: called by nginx with the configuration being parsed; MainConf has no Drop.
    unsafe { pool_alloc::<MainConf>(cf) }
}

/// `create_srv_conf` hook.
pub unsafe extern "C" fn create_srv_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: called by nginx with the configuration being parsed; SrvConf has no Drop.
    unsafe { pool_alloc::<SrvConf>(cf) }
}
