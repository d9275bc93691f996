//! `ngx_http_combined_upstreams_module`: an nginx dynamic module built with the `ngx` crate.
//!
//! Layers, each using only the ones below it (no import cycle; `scripts/module-layers.py`
//! checks the `use crate::` edges):
//! - this file: the symbols nginx's `load_module` reads;
//! - `conf`: the composition root (module object, directive table, configuration
//!   structures, hooks);
//! - the features: `add_upstream`, `combine_server_singlets`, `extend_single_peers`,
//!   `upstrand/`, `live/` — safe Rust over the seam;
//! - `ffi`: the seam — every `extern "C"` trampoline nginx calls and the handles on nginx's
//!   structures.
//!
//! Argument parsing, naming and planning are in the pure crate `upstrand_core`; the features
//! only translate between nginx structures (through `ffi`) and those plain values.

mod add_upstream;
mod combine_server_singlets;
mod conf;
mod extend_single_peers;
mod ffi;
mod live;
mod upstrand;

use core::ffi::c_char;
use core::ptr;

use ngx::ffi::ngx_module_t;

// The three symbols nginx's `load_module` looks up. `ngx::ngx_modules!` would export an empty
// order, which puts the module last; the order below places it where nginx puts an
// HTTP_AUX_FILTER module: just before `ngx_http_copy_filter_module` (below headers/add_header,
// above postpone/gzip/chunked in the filter chains).

/// Modules contained in this shared object.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_modules: [*const ngx_module_t; 2] = [
    conf::ngx_http_combined_upstreams_module.as_ptr(),
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
