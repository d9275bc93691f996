//! A small safe extension of `ngx_conf_t` for directive handlers and configuration hooks: the
//! directive's words, the configuration pool, configuration log lines and the handler result.
//!
//! A `&ngx_conf_t` / `&mut ngx_conf_t` exists only inside a call from nginx (a directive handler
//! or a configuration hook turns its raw pointer into a reference once, at the `extern "C"`
//! edge), so the fields these methods read are nginx's: `args` is the parser's array of
//! `ngx_str_t`, `pool` the live configuration pool, `log` the configuration log.

use core::ffi::c_char;
use core::{ptr, slice};

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_conf_log_error, ngx_conf_t, ngx_log_error_core, ngx_str_t, ngx_uint_t, NGX_LOG_EMERG,
};

use crate::ffi_util::{borrowed, bytes, pool_box, pool_copy, pool_new, ConfFail};

/// Safe access to the configuration being parsed.
pub trait ConfExt {
    /// The words of the directive being handled (`cf->args`), the directive name first; empty
    /// outside a directive handler.
    fn args(&self) -> Vec<&[u8]>;
    /// The directive's parameters (the words after its name) as text, invalid UTF-8 replaced.
    fn param_texts(&self) -> Vec<String> {
        self.args()
            .iter()
            .skip(1)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }
    /// Copies `data` into the configuration pool; `None` when out of memory.
    fn copy_str(&self, data: &[u8]) -> Option<ngx_str_t>;
    /// Moves plain data (no `Drop`) into the configuration pool.
    fn alloc<T>(&self, value: T) -> Option<&'static mut T>;
    /// Moves a value into the configuration pool, dropped when the pool is destroyed.
    fn alloc_box<T>(&self, value: T) -> Option<&'static mut T>;
    /// Logs `msg` at `level` as a configuration message: nginx adds ` in FILE:LINE` of the
    /// directive being handled.
    fn log(&self, level: u32, msg: &str);
    /// Logs `msg` at `level` on the configuration log as a plain line (no ` in FILE:LINE` of the
    /// current directive: the message names its own place).
    fn log_plain(&self, level: u32, msg: &str);
    /// What a directive handler returns to nginx; a [`ConfFail::Conf`] is logged as
    /// `[emerg] MSG in FILE:LINE` first.
    fn result(&self, result: Result<(), ConfFail>) -> *mut c_char;
}

impl ConfExt for ngx_conf_t {
    fn args(&self) -> Vec<&[u8]> {
        if self.args.is_null() {
            return Vec::new();
        }
        // SAFETY: cf->args is nginx's array of ngx_str_t for the directive being parsed; its
        // strings live in the configuration pool for the whole parse, longer than &self.
        unsafe {
            let a = &*self.args;
            if a.nelts == 0 || a.elts.is_null() {
                return Vec::new();
            }
            let elts = slice::from_raw_parts(a.elts as *const ngx_str_t, a.nelts);
            elts.iter().map(|s| bytes(s)).collect()
        }
    }

    fn copy_str(&self, data: &[u8]) -> Option<ngx_str_t> {
        // SAFETY: self.pool is the live configuration pool.
        unsafe { pool_copy(self.pool, data) }
    }

    fn alloc<T>(&self, value: T) -> Option<&'static mut T> {
        // SAFETY: self.pool is the live configuration pool, which outlives every use of the
        // configuration (the cycle); the memory is fresh, so the reference is unique.
        unsafe { pool_new(self.pool, value).map(|p| &mut *p) }
    }

    fn alloc_box<T>(&self, value: T) -> Option<&'static mut T> {
        // SAFETY: as for `alloc`; the pool's cleanup drops the value with the pool.
        unsafe { pool_box(self.pool, value).map(|p| &mut *p) }
    }

    fn log(&self, level: u32, msg: &str) {
        let mut s = borrowed(msg.as_bytes());
        // SAFETY: nginx only reads the configuration (and writes through its log pointer);
        // "%V" takes an ngx_str_t pointer that stays valid for the call.
        unsafe {
            ngx_conf_log_error(
                level as ngx_uint_t,
                ptr::from_ref(self).cast_mut(),
                0,
                c"%V".as_ptr(),
                ptr::addr_of_mut!(s),
            )
        };
    }

    fn log_plain(&self, level: u32, msg: &str) {
        let mut s = borrowed(msg.as_bytes());
        // SAFETY: cf->log is the live configuration log; "%V" takes an ngx_str_t pointer that
        // stays valid for the call.
        unsafe {
            if (*self.log).log_level >= level as ngx_uint_t {
                ngx_log_error_core(
                    level as ngx_uint_t,
                    self.log,
                    0,
                    c"%V".as_ptr(),
                    ptr::addr_of_mut!(s),
                );
            }
        }
    }

    fn result(&self, result: Result<(), ConfFail>) -> *mut c_char {
        match result {
            Ok(()) => NGX_CONF_OK,
            Err(ConfFail::Conf(e)) => {
                self.log(NGX_LOG_EMERG, &e.to_string());
                NGX_CONF_ERROR
            }
            Err(ConfFail::Logged) => NGX_CONF_ERROR,
        }
    }
}
