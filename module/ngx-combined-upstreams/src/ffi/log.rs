//! Log lines through the `ngx` crate's macros (`ngx_log_error!`, `ngx_conf_log_error!`): the
//! message is written as nginx's `%*s`, so no format directive is read from it. The functions
//! take references: whoever holds nginx's log pointer turns it into one (`Req::log`,
//! `ConfExt::log_plain`).

use core::ptr;

use ngx::ffi::{ngx_conf_t, ngx_log_t, ngx_uint_t, NGX_LOG_DEBUG_HTTP};

/// Logs `msg` at `level` on `log`.
#[inline]
pub(crate) fn log_str(log: &ngx_log_t, level: u32, msg: &str) {
    // nginx writes through the log only from this thread (the reference is nginx's own).
    ngx::ngx_log_error!(level, ptr::from_ref(log).cast_mut(), "{msg}");
}

/// True when `log` has HTTP debugging on (`error_log ... debug` in a build with
/// `--with-debug`, as Debian's nginx is).
#[inline]
pub(crate) fn debug_http(log: &ngx_log_t) -> bool {
    log.log_level & NGX_LOG_DEBUG_HTTP as ngx_uint_t != 0
}

/// Logs `msg` at `level` as a configuration message: nginx adds ` in FILE:LINE` of the
/// directive being handled.
pub(crate) fn conf_log(cf: &ngx_conf_t, level: u32, msg: &str) {
    // nginx only reads the configuration (and writes through its log pointer).
    ngx::ngx_conf_log_error!(level, ptr::from_ref(cf).cast_mut(), "{msg}");
}

/// Logs `msg` at `level` on the running cycle's log (for work outside any request: the probes).
pub fn log_cycle(level: u32, msg: &str) {
    super::with_cycle_log(|log| log_str(log, level, msg));
}
