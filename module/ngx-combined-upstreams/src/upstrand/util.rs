//! Small FFI helpers of the upstrand files.

use core::ffi::{c_char, c_void};
use core::{ptr, slice};

use ngx::core::NGX_CONF_ERROR;
use ngx::ffi::{
    ngx_conf_log_error, ngx_conf_t, ngx_http_request_t, ngx_log_error_core, ngx_pnalloc,
    ngx_pool_cleanup_add, ngx_pool_t, ngx_str_t, ngx_uint_t, ngx_variable_value_t, NGX_LOG_EMERG,
};

/// Bytes of an `ngx_str_t` (empty for a null pointer).
///
/// # Safety
/// `s` must describe `len` readable bytes that outlive the returned slice.
pub unsafe fn bytes<'a>(s: &ngx_str_t) -> &'a [u8] {
    if s.data.is_null() || s.len == 0 {
        return &[];
    }
    // SAFETY: data/len describe a valid byte range (caller).
    unsafe { slice::from_raw_parts(s.data, s.len) }
}

/// An `ngx_str_t` that borrows `s` (for nginx calls that only read it).
pub fn borrowed(s: &[u8]) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr().cast_mut(),
    }
}

/// Arguments of the directive being parsed (`cf->args`), the directive name first.
///
/// # Safety
/// `cf` is the configuration nginx is parsing.
pub unsafe fn conf_args<'a>(cf: *mut ngx_conf_t) -> Vec<&'a [u8]> {
    // SAFETY: cf->args is an ngx_array_t of ngx_str_t filled by the parser.
    unsafe {
        let a = (*cf).args;
        let elts = (*a).elts.cast::<ngx_str_t>();
        (0..(*a).nelts).map(|i| bytes(&*elts.add(i))).collect()
    }
}

/// Logs `msg` as an `[emerg]` configuration error (nginx adds ` in FILE:LINE`) and returns
/// `NGX_CONF_ERROR`.
///
/// # Safety
/// `cf` is the configuration nginx is parsing.
pub unsafe fn conf_error(cf: *mut ngx_conf_t, msg: &str) -> *mut c_char {
    let mut s = borrowed(msg.as_bytes());
    // SAFETY: "%V" takes an ngx_str_t pointer, which stays valid for the call.
    unsafe {
        ngx_conf_log_error(
            NGX_LOG_EMERG as ngx_uint_t,
            cf,
            0,
            c"%V".as_ptr(),
            ptr::addr_of_mut!(s),
        )
    };
    NGX_CONF_ERROR
}

/// Logs `msg` on the request's connection log at `level`.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn log_request(r: *mut ngx_http_request_t, level: u32, msg: &str) {
    let mut s = borrowed(msg.as_bytes());
    // SAFETY: r and its connection are live; "%V" takes an ngx_str_t pointer valid for the call.
    unsafe {
        let log = (*(*r).connection).log;
        if (*log).log_level >= level as ngx_uint_t {
            ngx_log_error_core(
                level as ngx_uint_t,
                log,
                0,
                c"%V".as_ptr(),
                ptr::addr_of_mut!(s),
            );
        }
    }
}

/// Moves `value` into a `Box` that the pool frees (runs `Drop`) when it is destroyed.
///
/// # Safety
/// `pool` is a live nginx pool.
pub unsafe fn pool_box<T>(pool: *mut ngx_pool_t, value: T) -> Option<*mut T> {
    // SAFETY: pool is live (caller).
    let cln = unsafe { ngx_pool_cleanup_add(pool, 0) };
    if cln.is_null() {
        return None;
    }
    let p = Box::into_raw(Box::new(value));
    // SAFETY: cln was just returned by nginx and is ours to fill.
    unsafe {
        (*cln).handler = Some(drop_box::<T>);
        (*cln).data = p.cast::<c_void>();
    }
    Some(p)
}

unsafe extern "C" fn drop_box<T>(data: *mut c_void) {
    // SAFETY: data was produced by Box::into_raw in pool_box and is dropped exactly once here.
    drop(unsafe { Box::from_raw(data.cast::<T>()) });
}

/// Sets a variable value to a copy of `value` in the request pool.
///
/// # Safety
/// `r` is a live request and `v` a variable value slot nginx passed to a handler.
pub unsafe fn set_value_copy(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    value: &[u8],
) -> bool {
    // SAFETY: r's pool is live; the copy is value.len() bytes long.
    unsafe {
        let p = ngx_pnalloc((*r).pool, value.len().max(1)).cast::<u8>();
        if p.is_null() {
            return false;
        }
        ptr::copy_nonoverlapping(value.as_ptr(), p, value.len());
        set_value_raw(v, p, value.len());
    }
    true
}

/// Points a variable value at `len` bytes at `data` (which must outlive the request).
///
/// # Safety
/// `v` is a variable value slot nginx passed to a handler.
pub unsafe fn set_value_raw(v: *mut ngx_variable_value_t, data: *mut u8, len: usize) {
    // SAFETY: v is a valid slot (caller).
    unsafe {
        (*v).set_len(len as u32);
        (*v).set_valid(1);
        (*v).set_no_cacheable(1);
        (*v).set_not_found(0);
        (*v).data = data;
    }
}

/// Marks a variable value as not found.
///
/// # Safety
/// `v` is a variable value slot nginx passed to a handler.
pub unsafe fn set_not_found(v: *mut ngx_variable_value_t) {
    // SAFETY: v is a valid slot (caller).
    unsafe {
        (*v).set_len(0);
        (*v).set_valid(0);
        (*v).set_not_found(1);
        (*v).data = ptr::null_mut();
    }
}
