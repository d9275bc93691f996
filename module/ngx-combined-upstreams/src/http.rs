//! The request-time fence: handles on the request and variable-value pointers nginx passes to
//! the module's callbacks (variable handlers, filters, `peer.init`).
//!
//! [`Req::from_ptr`] and [`VarSlot::from_ptr`] are the only `unsafe` steps: a callback turns
//! nginx's pointers into handles once. The handles' safe methods touch nginx's structure for the
//! duration of one method call and hand out no reference into it, so a method can never keep a
//! borrow alive across a call back into nginx (which may run other handlers of this module on
//! the same request).

use core::ffi::c_void;
use core::ptr::{self, NonNull};
use core::slice;

use ngx::ffi::{
    ngx_http_get_flushed_variable, ngx_http_request_t, ngx_str_t, ngx_uint_t, ngx_variable_value_t,
    NGX_HTTP_LOCK, NGX_HTTP_PATCH, NGX_HTTP_POST, NGX_LOG_DEBUG_HTTP,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf};
use upstrand_core::upstrand::status::Origin;

use crate::conf::{MainConf, Module};
use crate::ffi_util::{bytes, log_str, pool_copy, pool_new};
use crate::upstrand::dynamic::LocConf;

/// A live request of the request tree a callback runs for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Req(NonNull<ngx_http_request_t>);

impl Req {
    /// # Safety
    /// `r` is null or a request nginx handed to the running callback (or a request of the same
    /// tree), alive for as long as the handle is used, on nginx's thread.
    pub unsafe fn from_ptr(r: *mut ngx_http_request_t) -> Option<Req> {
        NonNull::new(r).map(Req)
    }

    /// The pointer, for nginx calls.
    pub fn as_ptr(self) -> *mut ngx_http_request_t {
        self.0.as_ptr()
    }

    fn get<T>(self, f: impl FnOnce(&ngx_http_request_t) -> T) -> T {
        // SAFETY: see `from_ptr`; the reference lives only during `f`, which calls no nginx code.
        f(unsafe { self.0.as_ref() })
    }

    fn get_mut<T>(self, f: impl FnOnce(&mut ngx_http_request_t) -> T) -> T {
        // SAFETY: see `from_ptr`; nginx is single-threaded and `f` calls no nginx code, so no
        // other reference to the request is used meanwhile.
        f(unsafe { &mut *self.0.as_ptr() })
    }

    /// The parent request (None for the main request).
    pub fn parent(self) -> Option<Req> {
        // SAFETY: a request's parent is null or a live request of the same tree.
        self.get(|r| unsafe { Req::from_ptr(r.parent) })
    }

    /// The main request of the tree.
    pub fn main(self) -> Req {
        // SAFETY: a request's main is a live request of the same tree (itself for the main).
        self.get(|r| unsafe { Req::from_ptr(r.main) })
            .unwrap_or(self)
    }

    /// This module's context slot of the request.
    pub fn ctx(self) -> *mut c_void {
        // SAFETY: ctx has one slot per HTTP module; ours is at the module's ctx_index.
        self.get(|r| unsafe { *r.ctx.add(Module::module().ctx_index) })
    }

    /// Sets this module's context slot of the request.
    pub fn set_ctx(self, value: *mut c_void) {
        // SAFETY: as for `ctx`.
        self.get_mut(|r| unsafe { *r.ctx.add(Module::module().ctx_index) = value });
    }

    /// This module's main configuration of the request (the cycle's).
    pub fn main_conf(self) -> Option<&'static MainConf> {
        self.get(Module::main_conf)
    }

    /// This module's location configuration of the request.
    pub fn loc_conf(self) -> Option<&'static LocConf> {
        self.get(Module::location_conf)
    }

    /// True when the request's log has HTTP debugging on (`error_log ... debug` in a build with
    /// `--with-debug`, as Debian's nginx is).
    pub fn debug_enabled(self) -> bool {
        // SAFETY: a request's connection and its log are live while the request is.
        self.get(
            |r| unsafe { (*(*r.connection).log).log_level } & NGX_LOG_DEBUG_HTTP as ngx_uint_t != 0,
        )
    }

    /// Logs `msg` on the request's connection log at `level`.
    pub fn log(self, level: u32, msg: &str) {
        let log = self.get(|r| r.connection);
        // SAFETY: the request's connection and its log are live while the request is.
        unsafe { log_str((*log).log, level, msg) };
    }

    /// Copies `data` into the request's pool (shared by the request tree).
    pub fn copy(self, data: &[u8]) -> Option<ngx_str_t> {
        // SAFETY: the request's pool is live while the request is.
        unsafe { pool_copy(self.get(|r| r.pool), data) }
    }

    /// Moves plain data (no `Drop`) into the request's pool; released with the pool.
    pub fn alloc<T>(self, value: T) -> Option<NonNull<T>> {
        // SAFETY: as for `copy`.
        unsafe { pool_new(self.get(|r| r.pool), value) }.and_then(NonNull::new)
    }

    /// POST, LOCK or PATCH (nginx's non-idempotent methods).
    pub fn non_idempotent_method(self) -> bool {
        self.get(|r| r.method & (NGX_HTTP_POST | NGX_HTTP_LOCK | NGX_HTTP_PATCH) as ngx_uint_t != 0)
    }

    /// Keeps `error_page` from applying to the request.
    pub fn set_error_page(self) {
        // nginx >= 1.29.3 lays the request's bit fields out differently: see ffi_util.
        self.get_mut(crate::ffi_util::set_error_page);
    }

    /// The status of the header being sent.
    pub fn status(self) -> u16 {
        self.get(|r| u16::try_from(r.headers_out.status).unwrap_or(0))
    }

    /// Who produced the answer being sent: nginx itself (`error`/`timeout` words) when the
    /// request has no upstream, when no status line came, or when nginx finalised the request
    /// with an error status of its own (`ngx_http_special_response_handler` sets `err_status`)
    /// — also after the backend sent a status line and then failed or timed out before the
    /// header ended.
    pub fn origin(self) -> Origin {
        self.get(|r| {
            let u = r.upstream;
            // SAFETY: r->upstream is null or the request's live upstream.
            if u.is_null() || unsafe { (*u).headers_in.status_n } == 0 || r.err_status != 0 {
                Origin::Generated
            } else {
                Origin::Backend
            }
        })
    }

    /// When nginx first contacted an upstream for this request (`peer.start_time`, ms), if it did.
    pub fn upstream_start_time(self) -> Option<u64> {
        self.get(|r| {
            let u = r.upstream;
            let t = if u.is_null() {
                0
            } else {
                // SAFETY: r->upstream is null or the request's live upstream.
                unsafe { (*u).peer.start_time }
            };
            (t != 0).then_some(t as u64)
        })
    }

    /// A copy of the request's URI.
    pub fn uri(self) -> Vec<u8> {
        // SAFETY: the URI points into the tree's pool, alive while the request is.
        self.get(|r| unsafe { bytes(&r.uri) }.to_vec())
    }

    /// The request's arguments (pointing into the tree's pool, for nginx calls).
    pub fn args(self) -> ngx_str_t {
        self.get(|r| r.args)
    }

    /// The value of the indexed variable `index` for this request (`None` when not found).
    /// Runs the variable's handler: call it with no walk state borrowed.
    pub fn variable(self, index: ngx_uint_t) -> Option<Vec<u8>> {
        // SAFETY: index is a variable index registered at configuration time; the returned
        // value (possibly a slot shared with the parent request) is copied at once.
        unsafe {
            let vv = ngx_http_get_flushed_variable(self.as_ptr(), index);
            // Like nginx itself, trust `not_found` only: handlers that report "not found" may
            // leave the other fields unset.
            if vv.is_null() || (*vv).not_found() != 0 || (*vv).data.is_null() {
                return None;
            }
            Some(slice::from_raw_parts((*vv).data, (*vv).len() as usize).to_vec())
        }
    }

    /// Replaces the request's upstream configuration through `f` (in `peer.init`, before nginx
    /// reads it); nothing happens without an upstream.
    pub fn map_upstream_conf(
        self,
        f: impl FnOnce(
            *mut ngx::ffi::ngx_http_upstream_conf_t,
        ) -> *mut ngx::ffi::ngx_http_upstream_conf_t,
    ) {
        self.get(|r| {
            let u = r.upstream;
            // SAFETY: r->upstream is null or the request's live upstream; `conf` is a pointer
            // field nginx reads later.
            unsafe {
                if !u.is_null() && !(*u).conf.is_null() {
                    (*u).conf = f((*u).conf);
                }
            }
        });
    }
}

/// The value slot nginx passed to a variable handler.
pub struct VarSlot(NonNull<ngx_variable_value_t>);

impl VarSlot {
    /// # Safety
    /// `v` is null or the value slot nginx passed to the running variable handler.
    pub unsafe fn from_ptr(v: *mut ngx_variable_value_t) -> Option<VarSlot> {
        NonNull::new(v).map(VarSlot)
    }

    fn set(&mut self, data: *mut u8, len: usize, found: bool) {
        // SAFETY: see `from_ptr`; nginx reads the slot after the handler returns.
        let v = unsafe { self.0.as_mut() };
        // nginx's `len:28, valid:1, no_cacheable:1, not_found:1, escape:1` share one 32-bit unit.
        // One store of the whole unit: bindgen's setters go bit by bit, and the 28-bit `len`
        // alone cost about 450 instructions per value (callgrind.sh, `upstrand_value`).
        #[cfg(target_endian = "little")]
        {
            let bits: u32 = (len as u32 & 0x0fff_ffff)
                | (found as u32) << 28
                | 1 << 29
                | ((!found) as u32) << 30;
            v._bitfield_1 = ngx::ffi::__BindgenBitfieldUnit::new(bits.to_le_bytes());
            debug_assert!(v.len() as usize == len && v.no_cacheable() == 1 && v.escape() == 0);
        }
        #[cfg(not(target_endian = "little"))]
        {
            v.set_len(len as u32);
            v.set_valid(found as u32);
            v.set_no_cacheable(1);
            v.set_not_found((!found) as u32);
            v.set_escape(0);
        }
        v.data = data;
    }

    /// The variable is not found.
    pub fn not_found(&mut self) {
        self.set(ptr::null_mut(), 0, false);
    }

    /// The value is `value`, which lives as long as the configuration (nginx only reads it).
    pub fn set_static(&mut self, value: &'static [u8]) {
        let data = if value.is_empty() {
            NonNull::<u8>::dangling().as_ptr()
        } else {
            value.as_ptr().cast_mut()
        };
        self.set(data, value.len(), true);
    }

    /// The value is a copy of `value` in `r`'s pool; false when out of memory.
    pub fn set_copy(&mut self, r: Req, value: &[u8]) -> bool {
        let Some(copy) = r.copy(value) else {
            return false;
        };
        self.set(copy.data, copy.len, true);
        true
    }
}
