//! The request's raw side of the seam: [`Req`], the handle on the requests nginx passes to the
//! module's callbacks, with the views that lend a closure the request, one of its strings or its
//! upstream for one call (`Req::get`, `Req::string`, `Req::upstream`) and the accesses that
//! write into a request or call nginx (context slot, log, pool, variables, subrequests, body, a
//! sent answer); the trampolines of content handlers, request bodies, output filters ([`Chain`])
//! and variables ([`VarSlot`]'s slot, [`add_variable`]). Safe code on them: `read.rs` (what a
//! request says), `hooks.rs` (the traits the trampolines call) and `super::variables`.
//! [`Req::from_ptr`] is the handle's only `unsafe fn`: a trampoline turns nginx's pointer into a
//! handle once.
//!
//! Over 500 lines on purpose: every raw access to a request and every request-time trampoline
//! is one audit surface, whose safety arguments share the handle's invariant (its type doc);
//! what is left here is bodies holding `unsafe`, their docs and the types they make; the safe
//! logic is next door.

mod hooks;
mod read;

use core::ffi::c_void;
use core::ptr::{self, NonNull};
use core::slice;

use ngx::core::Pool;
use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_conf_t, ngx_connection_local_sockaddr, ngx_http_add_variable,
    ngx_http_discard_request_body, ngx_http_finalize_request, ngx_http_get_flushed_variable,
    ngx_http_get_variable_index, ngx_http_output_body_filter_pt, ngx_http_output_filter,
    ngx_http_output_header_filter_pt, ngx_http_read_client_request_body, ngx_http_request_t,
    ngx_http_send_header, ngx_http_subrequest, ngx_http_top_body_filter,
    ngx_http_top_header_filter, ngx_http_upstream_conf_t, ngx_http_upstream_srv_conf_t,
    ngx_http_upstream_state_t, ngx_http_upstream_t, ngx_http_variable_t, ngx_int_t, ngx_pcalloc,
    ngx_read_file, ngx_str_t, ngx_uint_t, ngx_variable_value_t, NGX_HTTP_SUBREQUEST_CLONE,
};
use ngx::http::NgxHttpUpstreamModule;

pub use self::hooks::{set_content_handler, BodyError, BodyReader, ContentHandler, Filters};
use super::conf::RequestCtx;
use super::log::{debug_http, log_str};
use super::pool::{self, PoolCell};
use super::upstream::{PeerConn, Upstream};
use super::variables::Variable;
use super::{borrowed, bytes, Status};

/// A live request of the request tree a callback runs for.
///
/// Deliberately a copyable pointer and not the `ngx` crate's `&mut Request`: nginx re-enters
/// this module's variable handlers and filters on requests of the same tree while a filter of
/// the module runs (the next filter, `ngx_http_subrequest`, `peer.init`), so a `&mut` kept
/// across such a call would alias the one the re-entered handler makes. Each method makes its
/// reference for the duration of the call only, and calls no nginx code while holding it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Req(NonNull<ngx_http_request_t>);

/// The request's upstream as `Req::upstream` lends it: the current try's state and the
/// location's upstream configuration, when set.
pub(super) struct UpstreamView<'a> {
    pub u: &'a mut ngx_http_upstream_t,
    pub state: Option<&'a ngx_http_upstream_state_t>,
    pub conf: Option<&'a ngx_http_upstream_conf_t>,
}

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

    /// Lends `f` the bytes of the string `field` picks: one of the request (in the tree's pool)
    /// or of its configuration; `f` calls no nginx code.
    fn string<T>(
        self,
        field: impl FnOnce(&ngx_http_request_t) -> &ngx_str_t,
        f: impl FnOnce(&[u8]) -> T,
    ) -> T {
        self.get(|r| {
            let s = field(r);
            // SAFETY: see `from_ptr`; the request's strings live as long as it, the
            // configuration's as long as the cycle; the slice lives only during `f`.
            f(unsafe { bytes(s) })
        })
    }

    /// Lends `f` the request's upstream, with its state and configuration (None without an
    /// upstream); `f` calls no nginx code.
    fn upstream<T>(self, f: impl FnOnce(UpstreamView<'_>) -> T) -> Option<T> {
        self.get(|r| {
            // SAFETY: r->upstream is null or the request's live upstream; its `state` is null
            // or the entry of the current try in `r->upstream_states` (request pool), its `conf`
            // null or its location's configuration; the references live only during `f`.
            let view = unsafe {
                let u = r.upstream.as_mut()?;
                UpstreamView {
                    state: u.state.as_ref(),
                    conf: u.conf.as_ref(),
                    u,
                }
            };
            Some(f(view))
        })
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

    /// Moves plain data into the request tree's pool (released with it) behind a
    /// [`PoolCell`].
    #[inline]
    pub fn alloc_cell<T: Copy>(self, value: T) -> Option<PoolCell<T>> {
        let p = pool::alloc(&self.pool(), value)?;
        // SAFETY: fresh, initialised pool memory of the request tree, which outlives every
        // request that can reach the handle.
        Some(unsafe { PoolCell::from_raw(p) })
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
        let mut s = ngx_str_t {
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

    /// The request's peer connection (None without an upstream).
    pub(in crate::ffi) fn peer_conn(self) -> Option<PeerConn> {
        let u = NonNull::new(self.get(|r| r.upstream))?;
        // SAFETY: r->upstream is the request's live upstream; no reference is made.
        unsafe { PeerConn::from_ptr(ptr::addr_of_mut!((*u.as_ptr()).peer)) }
    }

    /// Starts a subrequest of this request (which is in its header filter) to `uri` with
    /// `args`, a clone (`NGX_HTTP_SUBREQUEST_CLONE`: same method, headers, body) when `clone`;
    /// `None` when nginx refused (it logged why). Runs nginx code: hold no module state
    /// borrowed.
    pub fn subrequest(self, uri: &[u8], mut args: Option<ngx_str_t>, clone: bool) -> Option<Req> {
        // The subrequest keeps pointing at its URI: copy it into the pool.
        let mut uri_s = self.copy(uri)?;
        let args_p = args
            .as_mut()
            .map_or(ptr::null_mut(), |a| a as *mut ngx_str_t);
        let flags = ngx_uint_t::from(clone) * NGX_HTTP_SUBREQUEST_CLONE as ngx_uint_t;
        let mut sr: *mut ngx_http_request_t = ptr::null_mut();
        // SAFETY: the request is live; uri_s and args point into the tree's pool; sr is
        // initialised by ngx_http_subrequest.
        unsafe {
            let (r, null) = (self.as_ptr(), ptr::null_mut());
            if ngx_http_subrequest(r, &mut uri_s, args_p, &mut sr, null, flags) != Status::NGX_OK.0
            {
                return None;
            }
            Req::from_ptr(sr)
        }
        .inspect(|sr| {
            // The subrequest got a struct copy of r's headers_in.
            let part = self.get(|r| ptr::addr_of!(r.headers_in.headers.part));
            sr.get_mut(|sr| read::fix_last(&mut sr.headers_in.headers, part));
        })
    }

    /// Lends `f` the bytes of the address of the socket the request came in on (a `sockaddr`
    /// of `local_socklen` bytes; None when unknown); `f` calls no nginx code.
    fn local_sockaddr<T>(self, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let c = self.get(|r| r.connection);
        // SAFETY: the request's connection is live; ngx_connection_local_sockaddr fills
        // `local_sockaddr` with the accepting socket's address (getsockname on a wildcard
        // listener) and leaves it pointing at `local_socklen` bytes of it.
        let sa = unsafe {
            if c.is_null()
                || ngx_connection_local_sockaddr(c, ptr::null_mut(), 0) != Status::NGX_OK.0
                || (*c).local_sockaddr.is_null()
            {
                return None;
            }
            slice::from_raw_parts((*c).local_sockaddr.cast(), (*c).local_socklen as usize)
        };
        Some(f(sa))
    }

    /// nginx's text of the client's address (`unix:` on a unix socket).
    pub fn client(self) -> String {
        // SAFETY: the request's connection and its addr_text live as long as the request.
        self.get(|r| unsafe { r.connection.as_ref() })
            .map_or_else(String::new, |c| {
                self.string(
                    |_| &c.addr_text,
                    |s| String::from_utf8_lossy(s).into_owned(),
                )
            })
    }

    /// The `upstream {}` blocks (and implicit upstreams) of the request's configuration.
    pub fn upstreams(self) -> Vec<Upstream> {
        let Some(umcf) = self.main_conf::<NgxHttpUpstreamModule>() else {
            return Vec::new();
        };
        let a = &umcf.upstreams;
        if a.nelts == 0 || a.elts.is_null() {
            return Vec::new();
        }
        // SAFETY: `upstreams` is nginx's array of upstream configuration pointers of the
        // running configuration; each is null or an upstream living as long as it.
        unsafe {
            slice::from_raw_parts(a.elts as *const *mut ngx_http_upstream_srv_conf_t, a.nelts)
                .iter()
                .filter_map(|p| Upstream::from_ptr(*p))
                .collect()
        }
    }

    /// Discards the request body.
    pub fn discard_body(self) -> Status {
        // SAFETY: the request is live (handle).
        Status(unsafe { ngx_http_discard_request_body(self.as_ptr()) })
    }

    /// Reads the body, then nginx calls `B::body_read`.
    pub fn read_body<B: BodyReader>(self) -> Status {
        // SAFETY: the request is live (handle).
        Status(unsafe { ngx_http_read_client_request_body(self.as_ptr(), Some(body_read::<B>)) })
    }

    /// The request body read by [`Req::read_body`] (memory buffers and buffers in the body's
    /// temporary file), at most `limit` bytes.
    pub fn body(self, limit: usize) -> Result<Vec<u8>, BodyError> {
        let mut out = Vec::new();
        let rb = self.get(|r| r.request_body);
        // SAFETY: request_body is null or the request's body, read by nginx; in its chain
        // memory buffers hold pos..last, file buffers file_pos..file_last of their file.
        unsafe {
            let mut cl = rb.as_ref().map_or(ptr::null_mut(), |rb| rb.bufs);
            while let Some(link) = cl.as_ref() {
                let b: &ngx_buf_t = &*link.buf;
                let len = if b.in_file() != 0 && !b.file.is_null() {
                    (b.file_last - b.file_pos) as usize
                } else if !b.pos.is_null() {
                    b.last.offset_from(b.pos) as usize
                } else {
                    0
                };
                if out.len() + len > limit {
                    return Err(BodyError::TooLarge);
                }
                if b.in_file() != 0 && !b.file.is_null() {
                    let start = out.len();
                    out.resize(start + len, 0);
                    let n = ngx_read_file(b.file, out.as_mut_ptr().add(start), len, b.file_pos);
                    if n != len as isize {
                        return Err(BodyError::Unreadable);
                    }
                } else if len > 0 {
                    out.extend_from_slice(slice::from_raw_parts(b.pos, len));
                }
                cl = link.next;
            }
        }
        Ok(out)
    }

    /// Sends `status` with `body` as `application/json`; returns what the content handler
    /// returns to nginx.
    pub fn send_json(self, status: u16, body: &[u8]) -> Status {
        let Some(copy) = self.copy(body) else {
            return Status::NGX_ERROR;
        };
        self.set_json_header(status, body.len());
        let r = self.as_ptr();
        // SAFETY: the request is live (handle); the body was copied into its pool; the buffer
        // (zeroed by ngx_pcalloc) and chain live until the output filter returns (nginx copies
        // what it keeps: the memory is the pool's).
        unsafe {
            let rc = ngx_http_send_header(r);
            if rc == Status::NGX_ERROR.0 || rc > Status::NGX_OK.0 || (*r).header_only() != 0 {
                return Status(rc);
            }
            let b = ngx_pcalloc((*r).pool, core::mem::size_of::<ngx_buf_t>()).cast::<ngx_buf_t>();
            let Some(b) = b.as_mut() else {
                return Status::NGX_ERROR;
            };
            (b.pos, b.last) = (copy.data, copy.data.add(copy.len));
            b.set_memory(1);
            b.set_last_buf(u32::from(r == (*r).main));
            b.set_last_in_chain(1);
            let mut out = ngx_chain_t {
                buf: b,
                next: ptr::null_mut(),
            };
            Status(ngx_http_output_filter(r, &mut out))
        }
    }
}

/// A copy of a variable's value as nginx returned it (`None` for null or not found).
///
/// # Safety
/// `vv` is null or a value nginx just returned for a live request.
unsafe fn value_copy(vv: *mut ngx_variable_value_t) -> Option<Vec<u8>> {
    // SAFETY: caller. Like nginx itself, trust `not_found` only: handlers that report "not
    // found" may leave the other fields unset.
    unsafe {
        let v = vv
            .as_ref()
            .filter(|v| v.not_found() == 0 && !v.data.is_null())?;
        Some(slice::from_raw_parts(v.data, v.len() as usize).to_vec())
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

/// The bit bindgen's `set_error_page` writes in `_bitfield_1` (found once on a zeroed request;
/// why: `read.rs`, `set_error_page`).
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

// ---- trampolines: content handlers, request bodies, filters, variables --------------------

extern "C" fn content<H: ContentHandler>(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    unsafe { Req::from_ptr(r) }.map_or(Status::NGX_ERROR.0, |r| H::handle(r).0)
}

extern "C" fn body_read<B: BodyReader>(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls this once the body was read, with the request alive.
    let Some(req) = (unsafe { Req::from_ptr(r) }) else {
        return;
    };
    let rc = B::body_read(req);
    // SAFETY: the request is live; finalizing it is this callback's job.
    unsafe { ngx_http_finalize_request(r, rc.0) };
}

static mut NEXT_HEADER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY: ngx_http_output_body_filter_pt = None;

/// Puts `F`'s filters on top of both chains (module order places the module just above the
/// copy filter). Called from postconfiguration (single-threaded, before any request: the time
/// nginx configures filters); once per configuration.
pub fn install_filters<F: Filters>() {
    // SAFETY: nginx configures filters single-threaded in postconfiguration, before any request
    // reads them; the chain heads are plain globals of nginx.
    unsafe {
        NEXT_HEADER = ngx_http_top_header_filter;
        ngx_http_top_header_filter = Some(header_filter::<F>);
        NEXT_BODY = ngx_http_top_body_filter;
        ngx_http_top_body_filter = Some(body_filter::<F>);
    }
}

extern "C" fn header_filter<F: Filters>(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the filter with the live request whose header is being sent.
    unsafe { Req::from_ptr(r) }.map_or(Status::NGX_ERROR.0, |r| F::header(r).0)
}

extern "C" fn body_filter<F: Filters>(
    r: *mut ngx_http_request_t,
    cl: *mut ngx_chain_t,
) -> ngx_int_t {
    // SAFETY: nginx calls the filter with the live request whose body is being sent and the
    // chain it passes down.
    unsafe { Req::from_ptr(r) }.map_or(Status::NGX_ERROR.0, |r| F::body(r, Chain(cl)).0)
}

/// Calls the next header filter with `r`.
#[inline]
pub fn next_header(r: Req) -> Status {
    // SAFETY: NEXT_HEADER was set in postconfiguration before any request (and is only read
    // since); the next filter takes the live request.
    unsafe { (*ptr::addr_of!(NEXT_HEADER)).map_or(Status::NGX_ERROR, |f| Status(f(r.as_ptr()))) }
}

/// Calls the next body filter with `r` and `chain`.
#[inline]
pub fn next_body(r: Req, chain: Chain) -> Status {
    // SAFETY: as for next_header; the chain is the one nginx passed to the body filter.
    unsafe {
        (*ptr::addr_of!(NEXT_BODY)).map_or(Status::NGX_ERROR, |f| Status(f(r.as_ptr(), chain.0)))
    }
}

/// The chain of body buffers nginx passed to the body filter (made only by the trampoline).
#[derive(Clone, Copy, Debug)]
pub struct Chain(*mut ngx_chain_t);

impl Chain {
    /// Runs `f` on every buffer of the chain; `f` calls no nginx code.
    fn each_buf(self, mut f: impl FnMut(&mut ngx_buf_t)) {
        let mut cl = self.0;
        // SAFETY: the chain nginx passes down: its links and buffers are valid during the
        // filter call, and nothing else refers to them while `f` runs.
        unsafe {
            while let Some(link) = cl.as_ref() {
                link.buf.as_mut().map(&mut f);
                cl = link.next;
            }
        }
    }
}

pub(in crate::ffi) extern "C" fn get_variable<V: Variable>(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls a variable handler with the live request and the value slot to fill.
    match unsafe { (Req::from_ptr(r), NonNull::new(v)) } {
        (Some(r), Some(v)) => V::get(r, &mut VarSlot(v), data).0,
        _ => Status::NGX_ERROR.0,
    }
}

/// The value slot nginx passed to a variable handler (made only by the trampoline).
pub struct VarSlot(NonNull<ngx_variable_value_t>);

impl VarSlot {
    /// The slot, for the setters in `variables.rs` (which call no nginx code).
    pub(in crate::ffi) fn value(&mut self) -> &mut ngx_variable_value_t {
        // SAFETY: the slot nginx passed to the running handler (made only by the trampoline);
        // nginx reads it after the handler returns.
        unsafe { self.0.as_mut() }
    }
}

/// A variable registered with [`add_variable`] (it lives in the cycle).
pub struct VarDef(NonNull<ngx_http_variable_t>);

impl VarDef {
    /// Makes `V` the variable's handler, called with `data`.
    pub fn set_handler<V: Variable>(self, data: usize) {
        // SAFETY: the variable nginx returned lives in the cycle; configuration parsing is
        // single-threaded and nothing else refers to it during the call.
        let v = unsafe { &mut *self.0.as_ptr() };
        v.get_handler = Some(get_variable::<V>);
        v.data = data;
    }
}

/// Registers variable `name` (without `$`) with nginx's `NGX_HTTP_VAR_*` `flags`; `None` when
/// nginx refuses it (nginx logged why).
pub fn add_variable(cf: &mut ngx_conf_t, name: &[u8], flags: u32) -> Option<VarDef> {
    let mut s = borrowed(name);
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    NonNull::new(unsafe { ngx_http_add_variable(cf, &mut s, flags as ngx_uint_t) }).map(VarDef)
}

/// The index of variable `name` (without `$`), registering it as used (indexed).
pub fn variable_index(cf: &mut ngx_conf_t, name: &[u8]) -> Option<ngx_uint_t> {
    let mut s = borrowed(name);
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    ngx_uint_t::try_from(unsafe { ngx_http_get_variable_index(cf, &mut s) }).ok()
}
