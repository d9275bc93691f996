//! Log lines through the `ngx` crate's macros (`ngx_log_error!`, `ngx_conf_log_error!`): the
//! message is written as nginx's `%*s`, so no format directive is read from it.

use core::ptr;

use ngx::ffi::{ngx_conf_t, ngx_log_t, ngx_uint_t, NGX_LOG_DEBUG_HTTP};

/// Logs `msg` at `level` on `log`.
///
/// # Safety
/// `log` is a live nginx log (a request's connection log, the cycle's log).
#[inline]
pub(crate) unsafe fn log_str(log: *mut ngx_log_t, level: u32, msg: &str) {
    ngx::ngx_log_error!(level, log, "{msg}");
}

/// True when `log` has HTTP debugging on (`error_log ... debug` in a build with
/// `--with-debug`, as Debian's nginx is).
///
/// # Safety
/// As for [`log_str`].
#[inline]
pub(crate) unsafe fn debug_http(log: *mut ngx_log_t) -> bool {
    // SAFETY: guaranteed by the caller.
    unsafe { (*log).log_level & NGX_LOG_DEBUG_HTTP as ngx_uint_t != 0 }
}

/// Logs `msg` at `level` as a configuration message: nginx adds ` in FILE:LINE` of the
/// directive being handled.
pub(crate) fn conf_log(cf: &ngx_conf_t, level: u32, msg: &str) {
    // nginx only reads the configuration (and writes through its log pointer).
    ngx::ngx_conf_log_error!(level, ptr::from_ref(cf).cast_mut(), "{msg}");
}

/// Logs `msg` at `level` on the configuration log as a plain line (no ` in FILE:LINE`).
pub(crate) fn conf_log_plain(cf: &ngx_conf_t, level: u32, msg: &str) {
    // SAFETY: cf->log is the live configuration log while the configuration is parsed.
    unsafe { log_str(cf.log, level, msg) };
}
