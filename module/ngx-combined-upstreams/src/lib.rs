//! `ngx_http_combined_upstreams_module`: an nginx dynamic module built with the `ngx` crate.
//!
//! This file is the registration code: the module object, the exported symbols nginx's
//! `load_module` reads, the directive table and the configuration hooks. Each feature lives in its
//! own file and contributes
//! - its `ngx_command_t` values (listed in `COMMANDS` below),
//! - optional calls from `preconfiguration` / `postconfiguration` / `init_main_conf`,
//! - its fields in `conf::MainConf` / `conf::SrvConf`.
//!
//! Argument parsing, naming and planning are in the pure crate `upstrand_core`; the files here
//! only translate between nginx structures and those plain values.

mod add_upstream;
mod combine_server_singlets;
mod conf;
mod conf_ext;
mod extend_single_peers;
mod ffi_util;
mod http;
mod live;
mod upstrand;
mod upstreams;

use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_module_t, ngx_int_t, ngx_module_t, ngx_uint_t,
    NGX_HTTP_MODULE, NGX_LOG_EMERG,
};
use ngx::http::HttpModuleMainConf;

use crate::conf_ext::ConfExt;

/// Directive table: each feature file exports its entry as `COMMAND` (made with
/// [`ffi_util::command`]). To add a directive: list it here and bump the array length. The last
/// entry must stay [`ngx_command_t::empty`].
static mut COMMANDS: [ngx_command_t; 7] = [
    add_upstream::COMMAND,
    combine_server_singlets::COMMAND,
    extend_single_peers::COMMAND,
    upstrand::block::COMMAND,
    upstrand::dynamic::COMMAND,
    live::COMMAND,
    ngx_command_t::empty(),
];

static MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(preconfiguration),
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(conf::create_main_conf),
    init_main_conf: Some(init_main_conf),
    create_srv_conf: Some(conf::create_srv_conf),
    merge_srv_conf: None,
    create_loc_conf: Some(conf::create_loc_conf),
    merge_loc_conf: Some(upstrand::dynamic::merge_loc_conf),
};

/// The module object; its name is what `ngx_module_names` lists.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_combined_upstreams_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(MODULE_CTX) as *mut c_void,
    commands: ptr::addr_of_mut!(COMMANDS) as *mut ngx_command_t,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    ..ngx_module_t::default()
};

// The three symbols nginx's `load_module` looks up. `ngx::ngx_modules!` would export an empty
// order, which puts the module last; the order below places it where nginx puts an
// HTTP_AUX_FILTER module: just before `ngx_http_copy_filter_module` (below headers/add_header,
// above postpone/gzip/chunked in the filter chains).

/// Modules contained in this shared object.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_modules: [*const ngx_module_t; 2] = [
    ptr::addr_of!(ngx_http_combined_upstreams_module),
    ptr::null(),
];

/// Their names (the first must match the module object's symbol name).
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_names: [*const c_char; 2] =
    [c"ngx_http_combined_upstreams_module".as_ptr(), ptr::null()];

/// Placement: this module goes right before `ngx_http_copy_filter_module`.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_order: [*const c_char; 3] = [
    c"ngx_http_combined_upstreams_module".as_ptr(),
    c"ngx_http_copy_filter_module".as_ptr(),
    ptr::null(),
];

/// Runs before the `http {}` block is parsed (register variables here).
extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: nginx calls the hook with the configuration being parsed; nothing else holds a
    // reference to it during the call.
    let cf = unsafe { &mut *cf };
    upstrand::preconfiguration(cf)
}

/// Runs after the `http {}` block is parsed and every upstream is initialised (install filters,
/// handlers here).
extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: nginx calls the hook with the parsed configuration; nothing else holds a reference
    // to it during the call.
    let cf = unsafe { &mut *cf };
    let Some(mc) = conf::Module::main_conf_mut(cf) else {
        return ffi_util::NGX_ERROR;
    };
    upstrand::postconfiguration(cf, mc)
}

/// Runs at the end of `http {}`, after `ngx_http_upstream_module` initialised every upstream.
extern "C" fn init_main_conf(cf: *mut ngx_conf_t, _conf: *mut c_void) -> *mut c_char {
    // SAFETY: nginx calls the hook with the configuration being parsed.
    extend_single_peers::check_after_init(unsafe { &*cf });
    // SAFETY: as above; every upstream ran its init_upstream, and nothing else refers to the
    // configuration during the call.
    if let Err(msg) = live::init_main_conf(unsafe { &mut *cf }) {
        // SAFETY: as above.
        unsafe { &*cf }.log(NGX_LOG_EMERG, msg.as_ref());
        return NGX_CONF_ERROR;
    }
    NGX_CONF_OK
}
