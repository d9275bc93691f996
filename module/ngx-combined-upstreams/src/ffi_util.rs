//! Small helpers at the FFI seam: directive arguments, strings, errors, pool allocation.

use core::ffi::c_char;
use core::{ptr, slice};

use ngx::core::NGX_CONF_ERROR;
use ngx::ffi::{ngx_conf_t, ngx_pnalloc, ngx_str_t, NGX_LOG_EMERG};

/// The bytes of an `ngx_str_t`.
///
/// # Safety
/// `s.data` must point to `s.len` readable bytes (or `s.len` must be 0) for `'a`.
pub unsafe fn bytes<'a>(s: &ngx_str_t) -> &'a [u8] {
    if s.len == 0 || s.data.is_null() {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { slice::from_raw_parts(s.data, s.len) }
}

/// The arguments of the directive being handled, without the directive name.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing, inside a directive handler.
pub unsafe fn directive_args<'a>(cf: *mut ngx_conf_t) -> Vec<&'a [u8]> {
    // SAFETY: inside a directive handler cf->args is an array of ngx_str_t, the first being the
    // directive name; the strings live in the configuration pool for the whole parse.
    unsafe {
        let args = &*(*cf).args;
        let elts = slice::from_raw_parts(args.elts as *const ngx_str_t, args.nelts);
        elts.iter().skip(1).map(|s| bytes(s)).collect()
    }
}

/// Logs `msg` as `[emerg] MSG in FILE:LINE` (the line of the directive being handled) and
/// returns `NGX_CONF_ERROR`.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing.
pub unsafe fn conf_error(cf: *mut ngx_conf_t, msg: &str) -> *mut c_char {
    ngx::ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{}", msg);
    NGX_CONF_ERROR
}

/// Copies `data` into the configuration pool as an `ngx_str_t`; `None` when out of memory.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing.
pub unsafe fn pool_str(cf: *mut ngx_conf_t, data: &[u8]) -> Option<ngx_str_t> {
    // SAFETY: cf is valid (caller); the pool outlives the configuration that uses the string.
    let p = unsafe { ngx_pnalloc((*cf).pool, data.len().max(1)) }.cast::<u8>();
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
