//! The module's helpers at the FFI seam, shared by every feature: directive table entries and
//! results, strings, directive arguments, configuration errors, log lines, pool allocation and
//! variable values.

use core::ffi::{c_char, c_void, CStr};
use core::{ptr, slice};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_int_t, ngx_log_error_core, ngx_log_t, ngx_palloc, ngx_pnalloc,
    ngx_pool_cleanup_add, ngx_pool_t, ngx_str_t, ngx_uint_t,
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
    /// Log this error as `[emerg]` (its `Display` is nginx's wording).
    Conf(upstrand_core::ConfError),
    /// Already logged (nginx did it, also for out of memory): only return `NGX_CONF_ERROR`.
    Logged,
}

impl From<upstrand_core::ConfError> for ConfFail {
    fn from(e: upstrand_core::ConfError) -> Self {
        ConfFail::Conf(e)
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

/// Sets `r->error_page` (the request then ignores the location's `error_page` redirects).
///
/// nginx 1.29.3 put `in_port_t port` right before the request's bit fields, so they start two bytes
/// past a 4-byte boundary. C moves `uri_changes:4` to the next 32-bit unit rather than let it
/// straddle one; bindgen 0.72 (nginx-sys 0.5) does not, so from `uri_changes` on its setters are
/// two bits low, and `set_error_page` would set `reading_body` (nginx then closes the keep-alive
/// connection after the answer). From 1.29.3 on the bit is set where C has it: two above the one
/// bindgen's own setter uses. Checked against nginx 1.30 by `scripts/test-nginx-versions.sh`.
pub fn set_error_page(r: &mut ngx::ffi::ngx_http_request_t) {
    #[cfg(not(nginx1_29_3))]
    r.set_error_page(1);
    // The bit index lies inside `_bitfield_1` (error_page is followed by more than two bits of
    // the same unit).
    #[cfg(nginx1_29_3)]
    r._bitfield_1.set_bit(error_page_bit() + 2, true);
}

/// The bit bindgen's `set_error_page` writes in `_bitfield_1` (found once on a zeroed request).
#[cfg(nginx1_29_3)]
fn error_page_bit() -> usize {
    static BIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BIT.get_or_init(|| {
        // SAFETY: ngx_http_request_t is plain C data; all-zero bytes are a valid value of it.
        let mut probe: ngx::ffi::ngx_http_request_t = unsafe { core::mem::zeroed() };
        probe.set_error_page(1);
        (0..8 * core::mem::size_of_val(&probe._bitfield_1))
            .find(|i| probe._bitfield_1.get_bit(*i))
            .unwrap_or(0)
    })
}

/// Logs `msg` at `level` on `log` (as `%V`: no format directives are read from `msg`).
///
/// # Safety
/// `log` is a live nginx log (a request's connection log, the cycle's log).
pub unsafe fn log_str(log: *mut ngx_log_t, level: u32, msg: &str) {
    let mut s = borrowed(msg.as_bytes());
    // SAFETY: caller (live log); "%V" takes an ngx_str_t pointer valid for the call; logging runs
    // no module code.
    unsafe {
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
