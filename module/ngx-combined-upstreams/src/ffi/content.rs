//! The request's handlers besides variables: content handlers (a location's `handler`): the
//! trampoline ([`ContentHandler`], [`set_content_handler`]), the request-body callback
//! ([`BodyReader`]) and the [`Req`] methods a handler answers with (method, URI, host,
//! listener, arguments, body, a sent answer; the live API's `upstreams_api` location is the
//! one user); the output filters (upstrand's): their trampolines ([`Filters`],
//! [`install_filters`]) and the body chain they pass on ([`Chain`]); and variables: their
//! registration ([`add_variable`], [`variable_index`], [`VarDef`]), the handler trampoline with
//! the value slot it fills ([`VarSlot`]'s raw store; its setters and the
//! [`super::variables::Variable`] trait are `variables.rs`).

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_conf_t, ngx_connection_local_sockaddr, ngx_http_add_variable,
    ngx_http_discard_request_body, ngx_http_finalize_request, ngx_http_get_variable_index,
    ngx_http_output_body_filter_pt, ngx_http_output_filter, ngx_http_output_header_filter_pt,
    ngx_http_read_client_request_body, ngx_http_request_t, ngx_http_send_header,
    ngx_http_top_body_filter, ngx_http_top_header_filter, ngx_http_upstream_srv_conf_t,
    ngx_http_variable_t, ngx_int_t, ngx_pcalloc, ngx_read_file, ngx_uint_t, ngx_variable_value_t,
    sockaddr_in, sockaddr_in6,
};
use ngx::http::{
    HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule, NgxHttpUpstreamModule,
};
use upstrand_core::live::Listener;

use super::pool::copy_str;
use super::request::Req;
use super::upstream::Upstream;
use super::variables::Variable;
use super::{borrowed, bytes, ConfFail, Status};

/// A location's content handler.
pub trait ContentHandler {
    /// Answers `r` (nginx's content handler result: a status, `NGX_DONE`, ...).
    fn handle(r: Req) -> Status;
}

extern "C" fn content<H: ContentHandler>(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    match unsafe { Req::from_ptr(r) } {
        Some(r) => H::handle(r).0,
        None => Status::NGX_ERROR.0,
    }
}

/// Makes `H` the content handler of the location being parsed.
pub fn set_content_handler<H: ContentHandler>(cf: &ngx_conf_t) -> Result<(), ConfFail> {
    let clcf = NgxHttpCoreModule::location_conf_mut(cf).ok_or(ConfFail::Logged)?;
    clcf.handler = Some(content::<H>);
    Ok(())
}

/// What runs once a request body was read ([`Req::read_body`]).
pub trait BodyReader {
    /// Answers `r`; the returned status finalizes the request.
    fn body_read(r: Req) -> Status;
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

/// Why [`Req::body`] gave no body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the limit.
    TooLarge,
    /// Its temporary file could not be read back.
    Unreadable,
}

impl Req {
    /// The request method (`NGX_HTTP_GET`, ...).
    pub fn method(self) -> u32 {
        self.get(|r| r.method as u32)
    }

    /// The URI after the location's prefix (`/#` when it does not start with it).
    pub fn rest_of_uri(self) -> Vec<u8> {
        self.get(|r| {
            let Some(clcf) = NgxHttpCoreModule::location_conf(r) else {
                return b"/#".to_vec();
            };
            // SAFETY: uri and the location name are nginx strings living as long as the request
            // and the configuration.
            let (uri, loc) = unsafe { (bytes(&r.uri), bytes(&clcf.name)) };
            let loc = loc.strip_prefix(b"=").unwrap_or(loc);
            let loc = loc.strip_suffix(b"/").unwrap_or(loc);
            uri.strip_prefix(loc).unwrap_or(b"/#").to_vec()
        })
    }

    /// The host the request names, as nginx validated it (`headers_in.server`: from `Host` or
    /// an absolute URI, without port, in lower case; empty when it names none).
    pub fn host(self) -> Vec<u8> {
        // SAFETY: headers_in.server is an nginx string of the request (empty or in its pool).
        self.get(|r| unsafe { bytes(&r.headers_in.server) }.to_vec())
    }

    /// The socket the request came in on.
    pub fn listener(self) -> Listener {
        const AF_UNIX: u16 = 1;
        const AF_INET: u16 = 2;
        const AF_INET6: u16 = 10;
        let c = self.get(|r| r.connection);
        // SAFETY: the request's connection is live; ngx_connection_local_sockaddr fills
        // `local_sockaddr` with the accepting socket's address (getsockname on a wildcard
        // listener) and leaves it pointing at a socket address of `local_socklen` bytes; each
        // variant is read only when that length covers it.
        unsafe {
            if c.is_null()
                || ngx_connection_local_sockaddr(c, ptr::null_mut(), 0) != Status::NGX_OK.0
            {
                return Listener::Unknown;
            }
            let (sa, len) = ((*c).local_sockaddr, (*c).local_socklen as usize);
            if sa.is_null() {
                return Listener::Unknown;
            }
            match (*sa).sa_family {
                AF_UNIX => Listener::Unix,
                AF_INET if len >= core::mem::size_of::<sockaddr_in>() => {
                    let s = &*(sa as *const sockaddr_in);
                    Listener::Inet(std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)).into())
                }
                AF_INET6 if len >= core::mem::size_of::<sockaddr_in6>() => {
                    let s = &*(sa as *const sockaddr_in6);
                    Listener::Inet(std::net::Ipv6Addr::from(s.sin6_addr.__in6_u.__u6_addr8).into())
                }
                _ => Listener::Unknown,
            }
        }
    }

    /// nginx's text of the client's address (`unix:` on a unix socket).
    pub fn client(self) -> String {
        // SAFETY: the request's connection and its addr_text live as long as the request.
        self.get(|r| unsafe {
            if r.connection.is_null() {
                return String::new();
            }
            String::from_utf8_lossy(bytes(&(*r.connection).addr_text)).into_owned()
        })
    }

    /// True when the query string has the argument `name` (without value).
    pub fn has_arg(self, name: &[u8]) -> bool {
        self.get(|r| {
            // SAFETY: args is an nginx string of the request.
            let args = unsafe { bytes(&r.args) };
            args.split(|b| *b == b'&').any(|a| a == name)
        })
    }

    /// The `upstream {}` blocks (and implicit upstreams) of the request's configuration.
    pub fn upstreams(self) -> Vec<Upstream> {
        self.get(|r| {
            let Some(umcf) = NgxHttpUpstreamModule::main_conf(r) else {
                return Vec::new();
            };
            let a = &umcf.upstreams;
            if a.nelts == 0 || a.elts.is_null() {
                return Vec::new();
            }
            // SAFETY: `upstreams` is nginx's array of upstream configuration pointers of the
            // running configuration; each is null or an upstream living as long as it.
            unsafe {
                core::slice::from_raw_parts(
                    a.elts as *const *mut ngx_http_upstream_srv_conf_t,
                    a.nelts,
                )
                .iter()
                .filter_map(|p| Upstream::from_ptr(*p))
                .collect()
            }
        })
    }

    /// `Content-Length` of the request (-1 when absent).
    pub fn content_length(self) -> i64 {
        self.get(|r| r.headers_in.content_length_n)
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
        let mut cl = self.get(|r| {
            let rb = r.request_body;
            if rb.is_null() {
                return ptr::null_mut();
            }
            // SAFETY: request_body is the request's body, read by nginx.
            unsafe { (*rb).bufs }
        });
        // SAFETY: the body chain was filled by nginx; memory buffers hold pos..last, file
        // buffers file_pos..file_last of their file.
        unsafe {
            while !cl.is_null() {
                let b: *mut ngx_buf_t = (*cl).buf;
                if (*b).in_file() != 0 && !(*b).file.is_null() {
                    let len = ((*b).file_last - (*b).file_pos) as usize;
                    if out.len() + len > limit {
                        return Err(BodyError::TooLarge);
                    }
                    let start = out.len();
                    out.resize(start + len, 0);
                    let n =
                        ngx_read_file((*b).file, out.as_mut_ptr().add(start), len, (*b).file_pos);
                    if n != len as isize {
                        return Err(BodyError::Unreadable);
                    }
                } else if !(*b).pos.is_null() {
                    let len = (*b).last.offset_from((*b).pos) as usize;
                    if out.len() + len > limit {
                        return Err(BodyError::TooLarge);
                    }
                    out.extend_from_slice(core::slice::from_raw_parts((*b).pos, len));
                }
                cl = (*cl).next;
            }
        }
        Ok(out)
    }

    /// Sends `status` with `body` as `application/json`; returns what the content handler
    /// returns to nginx.
    pub fn send_json(self, status: u16, body: &[u8]) -> Status {
        let r = self.as_ptr();
        let Some(copy) = copy_str(&self.pool(), body) else {
            return Status::NGX_ERROR;
        };
        // SAFETY: the request is live (handle); the body was copied into its pool; the buffer
        // and chain live until the output filter returns (nginx copies what it keeps: the
        // memory is the pool's).
        unsafe {
            let ho = ptr::addr_of_mut!((*r).headers_out);
            (*ho).status = status as usize;
            (*ho).content_length_n = body.len() as i64;
            let ct = b"application/json";
            (*ho).content_type_len = ct.len();
            (*ho).content_type = borrowed(ct);
            let rc = ngx_http_send_header(r);
            if rc == Status::NGX_ERROR.0 || rc > Status::NGX_OK.0 || (*r).header_only() != 0 {
                return Status(rc);
            }
            let b = ngx_pcalloc((*r).pool, core::mem::size_of::<ngx_buf_t>()).cast::<ngx_buf_t>();
            if b.is_null() {
                return Status::NGX_ERROR;
            }
            (*b).pos = copy.data;
            (*b).last = copy.data.add(copy.len);
            (*b).set_memory(1);
            (*b).set_last_buf(u32::from(r == (*r).main));
            (*b).set_last_in_chain(1);
            let mut out = ngx_chain_t {
                buf: b,
                next: ptr::null_mut(),
            };
            Status(ngx_http_output_filter(r, ptr::addr_of_mut!(out)))
        }
    }
}

// ---- filters ----------------------------------------------------------------------------

/// The module's header and body filters.
pub trait Filters {
    /// A response header is being sent for `r`; pass it on with [`next_header`] (or not).
    fn header(r: Req) -> Status;
    /// Body buffers of `r` are being sent; pass them on with [`next_body`] (or not).
    fn body(r: Req, chain: Chain) -> Status;
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
    match unsafe { Req::from_ptr(r) } {
        Some(r) => F::header(r).0,
        None => Status::NGX_ERROR.0,
    }
}

extern "C" fn body_filter<F: Filters>(
    r: *mut ngx_http_request_t,
    chain: *mut ngx_chain_t,
) -> ngx_int_t {
    // SAFETY: nginx calls the filter with the live request whose body is being sent and the
    // chain it passes down.
    match unsafe { Req::from_ptr(r) } {
        Some(r) => F::body(r, Chain(chain)).0,
        None => Status::NGX_ERROR.0,
    }
}

/// Calls the next header filter with `r`.
#[inline]
pub fn next_header(r: Req) -> Status {
    // SAFETY: NEXT_HEADER was set in postconfiguration before any request (and is only read
    // since); the next filter takes the live request.
    unsafe {
        match *ptr::addr_of!(NEXT_HEADER) {
            Some(f) => Status(f(r.as_ptr())),
            None => Status::NGX_ERROR,
        }
    }
}

/// Calls the next body filter with `r` and `chain`.
#[inline]
pub fn next_body(r: Req, chain: Chain) -> Status {
    // SAFETY: as for next_header; the chain is the one nginx passed to the body filter.
    unsafe {
        match *ptr::addr_of!(NEXT_BODY) {
            Some(f) => Status(f(r.as_ptr(), chain.0)),
            None => Status::NGX_ERROR,
        }
    }
}

/// The chain of body buffers nginx passed to the body filter (made only by the trampoline).
#[derive(Clone, Copy, Debug)]
pub struct Chain(*mut ngx_chain_t);

impl Chain {
    /// Runs `f` on every buffer of the chain; `f` calls no nginx code.
    fn each_buf(self, mut f: impl FnMut(&mut ngx::ffi::ngx_buf_t)) {
        let mut cl = self.0;
        // SAFETY: the chain nginx passes down: its links and buffers are valid during the
        // filter call, and nothing else refers to them while `f` runs.
        unsafe {
            while !cl.is_null() {
                if let Some(b) = (*cl).buf.as_mut() {
                    f(b);
                }
                cl = (*cl).next;
            }
        }
    }

    /// Marks every buffer consumed (`pos = last`, `file_pos = file_last` for file buffers).
    pub fn consume(self) {
        self.each_buf(|b| {
            b.pos = b.last;
            if b.in_file() != 0 {
                b.file_pos = b.file_last;
            }
        });
    }

    /// Promotes `last_in_chain` to `last_buf` (a subrequest's last buffer becomes the end of
    /// the response).
    pub fn promote_last_in_chain(self) {
        self.each_buf(|b| {
            if b.last_in_chain() != 0 {
                b.set_last_buf(1);
            }
        });
    }
}

// ---- variables ----------------------------------------------------------------------------

pub(in crate::ffi) extern "C" fn get_variable<V: Variable>(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls a variable handler with the live request and the value slot to fill.
    match unsafe { (Req::from_ptr(r), VarSlot::from_ptr(v)) } {
        (Some(r), Some(mut v)) => V::get(r, &mut v, data).0,
        _ => Status::NGX_ERROR.0,
    }
}

/// The value slot nginx passed to a variable handler.
pub struct VarSlot(NonNull<ngx_variable_value_t>);

impl VarSlot {
    /// # Safety
    /// `v` is null or the value slot nginx passed to the running variable handler.
    unsafe fn from_ptr(v: *mut ngx_variable_value_t) -> Option<VarSlot> {
        NonNull::new(v).map(VarSlot)
    }

    pub(in crate::ffi) fn set(&mut self, data: *mut u8, len: usize, found: bool) {
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
}

// ---- variables ----------------------------------------------------------------------------

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
    let v = unsafe { ngx_http_add_variable(cf, &mut s, flags as ngx_uint_t) };
    NonNull::new(v).map(VarDef)
}

/// The index of variable `name` (without `$`), registering it as used (indexed).
pub fn variable_index(cf: &mut ngx_conf_t, name: &[u8]) -> Option<ngx_uint_t> {
    let mut s = borrowed(name);
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    let i = unsafe { ngx_http_get_variable_index(cf, &mut s) };
    ngx_uint_t::try_from(i).ok()
}
