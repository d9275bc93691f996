//! Configuration structures of the module and their typed access through the `ngx` crate's
//! module traits ([`Module`]: `HttpModuleMainConf` / `HttpModuleServerConf` /
//! `HttpModuleLocationConf`), instead of indexing context slots by hand.

use core::ffi::c_void;
use core::ptr;

use ngx::ffi::{ngx_conf_t, ngx_http_upstream_init_pt, ngx_module_t};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf};

use crate::conf_ext::ConfExt;
use crate::upstrand::dynamic::LocConf;
use crate::upstrand::Registry;

/// `http {}`-level configuration. Features add their fields here. Lives in the configuration
/// pool and is dropped with it.
#[derive(Default)]
pub struct MainConf {
    /// Upstrands of this configuration (created by the first `upstrand` block).
    pub upstrand: Option<Box<Registry>>,
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

/// This module, for the `ngx` crate's typed configuration access.
pub struct Module;

impl HttpModule for Module {
    fn module() -> &'static ngx_module_t {
        // SAFETY: the module object is a static that nginx only writes while loading modules
        // (ctx_index, index), before any configuration hook or request of this module runs.
        unsafe { &*ptr::addr_of!(crate::ngx_http_combined_upstreams_module) }
    }
}

// SAFETY: the main, server and location slots of this module hold exactly these types: they are
// made by `create_main_conf`, `create_srv_conf` and `create_loc_conf` below, listed in the
// module's context.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}
// SAFETY: see above.
unsafe impl HttpModuleServerConf for Module {
    type ServerConf = SrvConf;
}
// SAFETY: see above.
unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}

/// Turns a pool allocation into what a `create_*_conf` hook returns (null when out of memory).
fn hook_result<T>(conf: Option<&'static mut T>) -> *mut c_void {
    conf.map_or(ptr::null_mut(), |c| ptr::from_mut(c).cast())
}

/// `create_main_conf` hook.
pub extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx calls the hook with the configuration being parsed.
    let cf = unsafe { &mut *cf };
    if crate::live::configuration_begins(cf).is_err() {
        return ptr::null_mut();
    }
    hook_result(cf.alloc_box(MainConf::default()))
}

/// `create_srv_conf` hook (also run for every singlet upstream the module creates).
pub extern "C" fn create_srv_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx calls the hook with the configuration being parsed.
    let cf = unsafe { &*cf };
    hook_result(cf.alloc(SrvConf::default()))
}

/// `create_loc_conf` hook.
pub extern "C" fn create_loc_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    // SAFETY: nginx calls the hook with the configuration being parsed.
    let cf = unsafe { &*cf };
    hook_result(cf.alloc_box(LocConf::default()))
}
