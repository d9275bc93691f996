//! The request-time side of the seam: [`Req`], the handle on the requests nginx passes to the
//! module's callbacks (variable handlers, filters, `peer.init`, content handlers): its
//! context slot, configuration, log, pool, variables, upstream ([`UpstreamConf`], the figures
//! of a try: [`TryEnd::of`]) and subrequests. The filter trampolines are in `content.rs`.
//! Why `Req` is a copyable pointer and not a `&mut`: its type doc. [`Req::from_ptr`] is the
//! only `unsafe` step: a trampoline turns nginx's pointer into a handle once.

use core::ffi::c_void;
use core::ptr::{self, NonNull};
use core::slice;

use ngx::core::Pool;
use ngx::ffi::{
    ngx_http_get_flushed_variable, ngx_http_request_t, ngx_http_subrequest,
    ngx_http_upstream_conf_t, ngx_list_t, ngx_msec_t, ngx_str_t, ngx_uint_t, NGX_HTTP_LOCK,
    NGX_HTTP_PATCH, NGX_HTTP_POST, NGX_HTTP_SUBREQUEST_CLONE,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};
use upstrand_core::upstrand::status::Origin;

use super::conf::RequestCtx;
use super::counters::TryEnd;
use super::log::{debug_http, log_str};
use super::pool::{self, PoolCell};
use super::upstream::PeerConn;
use super::{bytes, Status};

/// A live request of the request tree a callback runs for.
///
/// Deliberately a copyable pointer and not the `ngx` crate's `&mut Request`: nginx re-enters
/// this module's variable handlers and filters on requests of the same tree while a filter of
/// the module runs (the next filter, `ngx_http_subrequest`, `peer.init`), so a `&mut` kept
/// across such a call would alias the one the re-entered handler makes. Each method makes its
/// reference for the duration of the call only, and calls no nginx code while holding it.
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

    pub(super) fn get<T>(self, f: impl FnOnce(&ngx_http_request_t) -> T) -> T {
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

    /// The module's context of the request (its context slot), when it holds one.
    #[inline]
    pub fn ctx<T: RequestCtx>(self) -> Option<PoolCell<T>> {
        // SAFETY: ctx has one slot per HTTP module; `T::module()` is this module and `T` the
        // only type it keeps there (`RequestCtx`), stored by `set_ctx` from a cell in the
        // request tree's pool.
        self.get(|r| unsafe {
            NonNull::new((*r.ctx.add(T::module().ctx_index)).cast::<T>())
                .map(|p| PoolCell::from_raw(p))
        })
    }

    /// Sets the module's context slot of the request.
    #[inline]
    pub fn set_ctx<T: RequestCtx>(self, value: PoolCell<T>) {
        // SAFETY: as for `ctx`.
        self.get_mut(|r| unsafe {
            *r.ctx.add(T::module().ctx_index) = value.as_ptr().cast::<c_void>();
        });
    }

    /// The main configuration of module `M` of the request (the cycle's).
    #[inline]
    pub fn main_conf<M: HttpModuleMainConf>(self) -> Option<&'static M::MainConf> {
        self.get(M::main_conf)
    }

    /// The location configuration of module `M` of the request.
    #[inline]
    pub fn loc_conf<M: HttpModuleLocationConf>(self) -> Option<&'static M::LocationConf> {
        self.get(M::location_conf)
    }

    /// True when the request's log has HTTP debugging on (`error_log ... debug` in a build with
    /// `--with-debug`, as Debian's nginx is).
    #[inline]
    pub fn debug_enabled(self) -> bool {
        // SAFETY: a request's connection and its log are live while the request is.
        self.get(|r| unsafe { debug_http(&*(*r.connection).log) })
    }

    /// Logs `msg` on the request's connection log at `level`.
    pub fn log(self, level: u32, msg: &str) {
        let log = self.get(|r| r.connection);
        // SAFETY: the request's connection and its log are live while the request is.
        unsafe { log_str(&*(*log).log, level, msg) };
    }

    /// The request's pool (shared by the request tree).
    pub(super) fn pool(self) -> Pool {
        // SAFETY: the request's pool is live while the request is.
        unsafe { pool::pool(self.get(|r| r.pool)) }
    }

    /// Copies `data` into the request's pool (shared by the request tree).
    #[inline]
    pub fn copy(self, data: &[u8]) -> Option<ngx_str_t> {
        pool::copy_str(&self.pool(), data)
    }

    /// Moves plain data into the request tree's pool (released with it) behind a
    /// [`PoolCell`].
    #[inline]
    pub fn alloc_cell<T: Copy>(self, value: T) -> Option<PoolCell<T>> {
        let p = pool::alloc(&self.pool(), value)?;
        // SAFETY: fresh, initialised pool memory of the request tree, which outlives every
        // request that can reach the handle.
        Some(unsafe { PoolCell::from_raw(p) })
    }

    /// POST, LOCK or PATCH (nginx's non-idempotent methods).
    pub fn non_idempotent_method(self) -> bool {
        self.get(|r| r.method & (NGX_HTTP_POST | NGX_HTTP_LOCK | NGX_HTTP_PATCH) as ngx_uint_t != 0)
    }

    /// Keeps `error_page` from applying to the request.
    pub fn set_error_page(self) {
        // nginx >= 1.29.3 lays the request's bit fields out differently: see set_error_page.
        self.get_mut(set_error_page);
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
        unsafe { value_copy(ngx_http_get_flushed_variable(self.as_ptr(), index)) }
    }

    /// The value of the variable `name` (lower case; not indexed) for this request.
    pub fn variable_by_name(self, name: &[u8]) -> Option<Vec<u8>> {
        let mut name = name.to_vec();
        let mut s = ngx::ffi::ngx_str_t {
            len: name.len(),
            data: name.as_mut_ptr(),
        };
        // SAFETY: the request is live (handle); `name` outlives the call; the value is copied
        // at once.
        unsafe {
            let key = ngx::ffi::ngx_hash_key(name.as_mut_ptr(), name.len());
            value_copy(ngx::ffi::ngx_http_get_variable(self.as_ptr(), &mut s, key))
        }
    }

    /// Replaces the request's upstream configuration through `f` (in `peer.init`, before nginx
    /// reads it); nothing happens without an upstream. `f` returns a configuration that lives
    /// as long as the cycle.
    pub fn map_upstream_conf(self, f: impl FnOnce(UpstreamConf) -> *mut ngx_http_upstream_conf_t) {
        let u = self.get(|r| r.upstream);
        if u.is_null() {
            return;
        }
        // SAFETY: r->upstream is the request's live upstream; `conf` is a pointer field nginx
        // reads later; no reference is alive while `f` runs.
        unsafe {
            if let Some(conf) = NonNull::new((*u).conf) {
                (*u).conf = f(UpstreamConf(conf));
            }
        }
    }

    /// Clears the upstream's `out_bufs` when it does not buffer (`proxy_buffering off`): what
    /// a swallowed answer had queued is dropped too.
    pub fn drop_unbuffered_output(self) {
        let u = self.get(|r| r.upstream);
        // SAFETY: r->upstream is null or the request's live upstream.
        unsafe {
            if !u.is_null() && (*u).buffering() == 0 {
                (*u).out_bufs = ptr::null_mut();
            }
        }
    }

    /// Makes `src`'s response headers this request's (a struct copy whose header lists are
    /// re-pointed at this request's copy) and clears this request's error status.
    pub fn take_headers_out(self, src: Req) {
        let (dst, src) = (self.as_ptr(), src.as_ptr());
        // SAFETY: both are live requests of one tree; headers_out is plain data with lists
        // allocated in the shared pool; no reference into either request is alive.
        unsafe {
            (*dst).headers_out = (*src).headers_out;
            fix_list(
                ptr::addr_of_mut!((*dst).headers_out.headers),
                ptr::addr_of_mut!((*src).headers_out.headers),
            );
            fix_list(
                ptr::addr_of_mut!((*dst).headers_out.trailers),
                ptr::addr_of_mut!((*src).headers_out.trailers),
            );
            (*dst).err_status = 0;
        }
    }

    /// Starts a subrequest of this request (which is in its header filter) to `uri` with
    /// `args`, a clone (`NGX_HTTP_SUBREQUEST_CLONE`: same method, headers, body) when `clone`;
    /// `None` when nginx refused (it logged why). Runs nginx code: hold no module state
    /// borrowed.
    pub fn subrequest(self, uri: &[u8], args: Option<ngx_str_t>, clone: bool) -> Option<Req> {
        // The subrequest keeps pointing at its URI: copy it into the pool.
        let mut uri_s = self.copy(uri)?;
        let mut args_s = args.unwrap_or(ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        });
        let args_p = if args.is_some() {
            ptr::addr_of_mut!(args_s)
        } else {
            ptr::null_mut()
        };
        let flags = if clone {
            NGX_HTTP_SUBREQUEST_CLONE as ngx_uint_t
        } else {
            0
        };
        let mut sr: *mut ngx_http_request_t = ptr::null_mut();
        // SAFETY: the request is live; uri_s and args point into the tree's pool; sr is
        // initialised by ngx_http_subrequest.
        unsafe {
            if ngx_http_subrequest(
                self.as_ptr(),
                &mut uri_s,
                args_p,
                &mut sr,
                ptr::null_mut(),
                flags,
            ) != Status::NGX_OK.0
            {
                return None;
            }
            let sr = Req::from_ptr(sr)?;
            // The subrequest got a struct copy of r's headers_in.
            fix_list(
                ptr::addr_of_mut!((*sr.as_ptr()).headers_in.headers),
                ptr::addr_of_mut!((*self.as_ptr()).headers_in.headers),
            );
            Some(sr)
        }
    }
}

impl Req {
    /// `proxy_next_upstream_tries` (and the like) of the request's upstream (0: no limit, or
    /// no upstream).
    pub fn next_upstream_tries(self) -> ngx_uint_t {
        self.get(|r| {
            // SAFETY: r->upstream is null or the request's live upstream, whose conf is null or
            // its location's configuration.
            unsafe { r.upstream.as_ref().and_then(|u| u.conf.as_ref()) }
                .map_or(0, |conf| conf.next_upstream_tries)
        })
    }

    /// The request's peer connection (None without an upstream).
    pub(in crate::ffi) fn peer_conn(self) -> Option<PeerConn> {
        self.get(|r| {
            let u = r.upstream;
            if u.is_null() {
                return None;
            }
            // SAFETY: r->upstream is the request's live upstream; no reference is made.
            unsafe { PeerConn::from_ptr(ptr::addr_of_mut!((*u).peer)) }
        })
    }
}

/// A copy of a variable's value as nginx returned it (`None` for null or not found).
///
/// # Safety
/// `vv` is null or a value nginx just returned for a live request.
unsafe fn value_copy(vv: *mut ngx::ffi::ngx_variable_value_t) -> Option<Vec<u8>> {
    // SAFETY: caller. Like nginx itself, trust `not_found` only: handlers that report "not
    // found" may leave the other fields unset.
    unsafe {
        if vv.is_null() || (*vv).not_found() != 0 || (*vv).data.is_null() {
            return None;
        }
        Some(slice::from_raw_parts((*vv).data, (*vv).len() as usize).to_vec())
    }
}

/// Re-points `dst.last` when it still points at `src`'s embedded first part (after a struct
/// copy of an `ngx_list_t`).
///
/// # Safety
/// Both lists are live.
unsafe fn fix_list(dst: *mut ngx_list_t, src: *mut ngx_list_t) {
    // SAFETY: both lists are live (caller).
    unsafe {
        if (*dst).last == ptr::addr_of_mut!((*src).part) {
            (*dst).last = ptr::addr_of_mut!((*dst).part);
        }
    }
}

/// A location's upstream configuration (`ngx_http_upstream_conf_t`, alive as long as the
/// cycle), as [`Req::map_upstream_conf`] hands it over.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UpstreamConf(NonNull<ngx_http_upstream_conf_t>);

impl UpstreamConf {
    /// A copy of the configuration (plain C data).
    pub fn get(self) -> ngx_http_upstream_conf_t {
        // SAFETY: see the type; read by value.
        unsafe { self.0.as_ptr().read() }
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
fn set_error_page(r: &mut ngx_http_request_t) {
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
        let mut probe: ngx_http_request_t = unsafe { core::mem::zeroed() };
        probe.set_error_page(1);
        (0..8 * core::mem::size_of_val(&probe._bitfield_1))
            .find(|i| probe._bitfield_1.get_bit(*i))
            .unwrap_or(0)
    })
}

impl TryEnd {
    /// The figures of `r`'s current try (zeros without an upstream state).
    pub fn of(r: Req) -> TryEnd {
        r.get(|r| {
            // SAFETY: r->upstream is null or the request's live upstream; its `state` is null
            // or the entry of the current try in `r->upstream_states` (request pool).
            let Some(u) = (unsafe { r.upstream.as_ref() }) else {
                return TryEnd::default();
            };
            // SAFETY: as above.
            let Some(st) = (unsafe { u.state.as_ref() }) else {
                return TryEnd::default();
            };
            let now = super::current_msec();
            TryEnd {
                status: st.status as u64,
                header_ms: (st.header_time != ngx_msec_t::MAX).then_some(st.header_time as u64),
                response_ms: now.saturating_sub(u.start_time as u64),
                sent: st.bytes_sent.max(0) as u64,
                received: st.bytes_received.max(0) as u64,
            }
        })
    }
}
