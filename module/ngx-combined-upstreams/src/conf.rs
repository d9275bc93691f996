//! Configuration structures of the module, allocated from nginx's configuration pool (plain
//! data: the pool releases them without running destructors).

use core::ffi::c_void;
use core::ptr;

use ngx::ffi::{ngx_conf_t, ngx_http_upstream_init_pt};

use crate::ffi_util::pool_new;

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

/// `create_main_conf` hook.
pub unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: called by nginx with the configuration being parsed.
    unsafe { pool_new((*cf).pool, MainConf::default()) }.map_or(ptr::null_mut(), |p| p.cast())
}

/// `create_srv_conf` hook.
pub unsafe extern "C" fn create_srv_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: called by nginx with the configuration being parsed.
    unsafe { pool_new((*cf).pool, SrvConf::default()) }.map_or(ptr::null_mut(), |p| p.cast())
}
