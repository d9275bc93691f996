//! The module's helpers at the FFI seam, shared by every feature: directive table entries and
//! results, strings, directive arguments, configuration errors, log lines, pool allocation and
//! variable values.

use core::ffi::{c_char, c_void, CStr};
use core::{ptr, slice};

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_log_error, ngx_conf_t, ngx_http_request_t, ngx_int_t,
    ngx_log_error_core, ngx_palloc, ngx_pnalloc, ngx_pool_cleanup_add, ngx_pool_t, ngx_str_t,
    ngx_uint_t, ngx_variable_value_t, NGX_LOG_EMERG,
};

/// nginx's `NGX_OK` as the `ngx_int_t` hooks and handlers return.
pub const NGX_OK: ngx_int_t = 0;
/// nginx's `NGX_ERROR` as the `ngx_int_t` hooks and handlers return.
pub const NGX_ERROR: ngx_int_t = -1;

/// The handler nginx calls for a directive (`ngx_command_t::set`).
pub type DirectiveHandler =
    unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char;

/// A directive table entry: `name`, its context and argument flags (`type_`), its handler and
/// which configuration nginx passes to it (`conf`: an `NGX_HTTP_*_CONF_OFFSET`, or 0).
pub const fn command(
    name: &'static CStr,
    type_: u32,
    set: DirectiveHandler,
    conf: usize,
) -> ngx_command_t {
    ngx_command_t {
        name: ngx_str_t {
            len: name.count_bytes(),
            data: name.as_ptr() as *mut u8,
        },
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf: conf as ngx_uint_t,
        offset: 0,
        post: ptr::null_mut(),
    }
}

/// Why a directive handler failed.
#[derive(Debug)]
pub enum ConfFail {
    /// Log this text as `[emerg]`.
    Message(String),
    /// Already logged (nginx did it) or out of memory: only return `NGX_CONF_ERROR`.
    Logged,
}

impl From<upstrand_core::ConfError> for ConfFail {
    fn from(e: upstrand_core::ConfError) -> Self {
        ConfFail::Message(e.as_str().to_string())
    }
}

impl From<String> for ConfFail {
    fn from(text: String) -> Self {
        ConfFail::Message(text)
    }
}

impl From<&str> for ConfFail {
    fn from(text: &str) -> Self {
        ConfFail::Message(text.to_string())
    }
}

/// What a directive handler returns to nginx for `result`; a [`ConfFail::Message`] is logged as
/// `[emerg] MSG in FILE:LINE` first.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing.
pub unsafe fn conf_result(cf: *mut ngx_conf_t, result: Result<(), ConfFail>) -> *mut c_char {
    match result {
        Ok(()) => NGX_CONF_OK,
        // SAFETY: forwarded from the caller.
        Err(ConfFail::Message(msg)) => unsafe { conf_error(cf, &msg) },
        Err(ConfFail::Logged) => NGX_CONF_ERROR,
    }
}

/// The bytes of an `ngx_str_t` (empty for a null pointer).
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

/// An `ngx_str_t` that borrows `s` (for nginx calls that only read it).
pub fn borrowed(s: &[u8]) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr().cast_mut(),
    }
}

/// The words of the directive being handled (`cf->args`), the directive name first.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing, inside a directive handler.
pub unsafe fn conf_args<'a>(cf: *mut ngx_conf_t) -> Vec<&'a [u8]> {
    // SAFETY: inside a directive handler cf->args is an array of ngx_str_t filled by the parser;
    // the strings live in the configuration pool for the whole parse.
    unsafe {
        let args = &*(*cf).args;
        if args.nelts == 0 {
            return Vec::new();
        }
        let elts = slice::from_raw_parts(args.elts as *const ngx_str_t, args.nelts);
        elts.iter().map(|s| bytes(s)).collect()
    }
}

/// Logs `msg` at `level` as a configuration message (nginx adds ` in FILE:LINE` of the directive
/// being handled).
///
/// # Safety
/// `cf` must be the configuration nginx is parsing.
pub unsafe fn conf_log(cf: *mut ngx_conf_t, level: u32, msg: &str) {
    let mut s = borrowed(msg.as_bytes());
    // SAFETY: cf is valid (caller); "%V" takes an ngx_str_t pointer, which stays valid for the call.
    unsafe {
        ngx_conf_log_error(
            level as ngx_uint_t,
            cf,
            0,
            c"%V".as_ptr(),
            ptr::addr_of_mut!(s),
        )
    };
}

/// Logs `msg` as `[emerg] MSG in FILE:LINE` and returns `NGX_CONF_ERROR`.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing.
pub unsafe fn conf_error(cf: *mut ngx_conf_t, msg: &str) -> *mut c_char {
    // SAFETY: forwarded from the caller.
    unsafe { conf_log(cf, NGX_LOG_EMERG, msg) };
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

/// Copies `data` into `pool` as an `ngx_str_t`; `None` when out of memory.
///
/// # Safety
/// `pool` is a live nginx pool; the copy lives as long as it.
pub unsafe fn pool_copy(pool: *mut ngx_pool_t, data: &[u8]) -> Option<ngx_str_t> {
    // SAFETY: pool is live (caller); ngx_pnalloc returns room for the bytes or null.
    let p = unsafe { ngx_pnalloc(pool, data.len().max(1)) }.cast::<u8>();
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
///
/// # Safety
/// `pool` is a live nginx pool.
pub unsafe fn pool_new<T>(pool: *mut ngx_pool_t, value: T) -> Option<*mut T> {
    const { assert!(!core::mem::needs_drop::<T>(), "pool memory never runs Drop") };
    // SAFETY: pool is live (caller); nginx pools align allocations to NGX_ALIGNMENT (at least
    // pointer size), enough for the module's structures, which hold pointers and integers.
    let p = unsafe { ngx_palloc(pool, core::mem::size_of::<T>().max(1)) }.cast::<T>();
    if p.is_null() {
        return None;
    }
    // SAFETY: p is non-null, aligned and large enough for T.
    unsafe { p.write(value) };
    Some(p)
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

/// Sets a variable value to a copy of `value` in the request pool; false when out of memory.
///
/// # Safety
/// `r` is a live request and `v` a variable value slot nginx passed to a handler.
pub unsafe fn set_value_copy(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    value: &[u8],
) -> bool {
    // SAFETY: r's pool is live (caller); the copy lives as long as the request.
    let Some(copy) = (unsafe { pool_copy((*r).pool, value) }) else {
        return false;
    };
    // SAFETY: v is a valid slot (caller).
    unsafe { set_value_raw(v, copy.data, copy.len) };
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

/// Sets `r->error_page` (the request then ignores the location's `error_page` redirects).
///
/// nginx 1.29.3 put `in_port_t port` right before the request's bit fields, so they start two bytes
/// past a 4-byte boundary. C moves `uri_changes:4` to the next 32-bit unit rather than let it
/// straddle one; bindgen 0.72 (nginx-sys 0.5) does not, so from `uri_changes` on its setters are
/// two bits low, and `set_error_page` would set `reading_body` (nginx then closes the keep-alive
/// connection after the answer). From 1.29.3 on the bit is set where C has it: two above the one
/// bindgen's own setter uses. Checked against nginx 1.30 by `scripts/test-nginx-versions.sh`.
///
/// # Safety
/// `r` is a live request.
pub unsafe fn set_error_page(r: *mut ngx_http_request_t) {
    #[cfg(not(nginx1_29_3))]
    // SAFETY: r is live (caller); bindgen's layout of the bit fields is right before 1.29.3.
    unsafe {
        (*r).set_error_page(1)
    }
    #[cfg(nginx1_29_3)]
    // SAFETY: r is live (caller); the bit index lies inside `_bitfield_1` (error_page is followed
    // by more than two bits of the same unit).
    unsafe {
        (*r)._bitfield_1.set_bit(error_page_bit() + 2, true)
    }
}

/// The bit bindgen's `set_error_page` writes in `_bitfield_1` (found once on a zeroed request).
#[cfg(nginx1_29_3)]
fn error_page_bit() -> usize {
    static BIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BIT.get_or_init(|| {
        // SAFETY: ngx_http_request_t is plain C data; all-zero bytes are a valid value of it.
        let mut probe: ngx_http_request_t = unsafe { core::mem::zeroed() };
        probe.set_error_page(1);
        (0..8 * core::mem::size_of_val(&probe._bitfield_1))
            .find(|i| probe._bitfield_1.get_bit(*i))
            .unwrap_or(0)
    })
}
