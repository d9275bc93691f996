//! The HTTP handler of an `upstreams_api` location: routes `GET <loc>/`, `GET <loc>/NAME`
//! (`?slab` for the zone's slab figures) and `PUT <loc>/NAME`, and answers JSON. A `PUT` is
//! taken only with the location's `write=on` and a `Host` its access settings allow
//! (`upstrand_core::live::access`); each applied one is logged as a `notice`.
//!
//! The fence: the content handler and the body callback are safe `extern "C" fn`s that turn
//! nginx's request pointer into an [`ApiReq`] handle first; its methods read or write the
//! request for one call and keep no reference to it across calls into nginx.

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_connection_local_sockaddr, ngx_http_discard_request_body,
    ngx_http_finalize_request, ngx_http_output_filter, ngx_http_read_client_request_body,
    ngx_http_request_t, ngx_http_send_header, ngx_int_t, ngx_pcalloc, ngx_read_file, sockaddr_in,
    sockaddr_in6, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_PUT, NGX_HTTP_SPECIAL_RESPONSE,
    NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::{
    HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule, NgxHttpUpstreamModule,
};
use upstrand_core::live::render::{overdue_retired_line, ListEntry, ListView};
use upstrand_core::live::{parse_put, route, Access, ApiError, Listener, Route, MAX_BODY};

use super::with_entry;
use super::zone::LiveUpstream;
use crate::ffi::conf::ConfPart;
use crate::ffi::log::log_str;
use crate::ffi::pool::pool_copy;
use crate::ffi::request::Req;
use crate::ffi::upstream::Upstream;
use crate::ffi::{bytes, NGX_ERROR, NGX_OK};

/// An answer: status and JSON body.
type Answer = (u16, String);

fn err(e: ApiError) -> Answer {
    (e.status, e.to_json())
}

/// A request of an `upstreams_api` location.
#[derive(Clone, Copy)]
struct ApiReq(NonNull<ngx_http_request_t>);

impl ApiReq {
    /// # Safety
    /// `r` is null or the live request nginx passed to the running handler or callback.
    unsafe fn from_ptr(r: *mut ngx_http_request_t) -> Option<ApiReq> {
        NonNull::new(r).map(ApiReq)
    }

    fn as_ptr(self) -> *mut ngx_http_request_t {
        self.0.as_ptr()
    }

    /// Runs `f` on the request; `f` calls no nginx code.
    fn get<T>(self, f: impl FnOnce(&ngx_http_request_t) -> T) -> T {
        // SAFETY: see `from_ptr`; the reference lives only during `f`.
        f(unsafe { self.0.as_ref() })
    }

    fn method(self) -> u32 {
        self.get(|r| r.method as u32)
    }

    /// The URI after the location's prefix.
    fn rest_of_uri(self) -> Vec<u8> {
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

    /// The access settings of the request's location (read-only when it has none).
    fn access(self) -> Access {
        // SAFETY: the request is live (handle).
        let r = unsafe { Req::from_ptr(self.as_ptr()) };
        r.and_then(super::ApiLocation::of_request)
            .and_then(|a| a.access.clone())
            .unwrap_or_default()
    }

    /// The host the request names, as nginx validated it (`headers_in.server`: from `Host` or
    /// an absolute URI, without port, in lower case; empty when it names none).
    fn host(self) -> Vec<u8> {
        // SAFETY: headers_in.server is an nginx string of the request (empty or in its pool).
        self.get(|r| unsafe { bytes(&r.headers_in.server) }.to_vec())
    }

    /// The socket the request came in on.
    fn listener(self) -> Listener {
        const AF_UNIX: u16 = 1;
        const AF_INET: u16 = 2;
        const AF_INET6: u16 = 10;
        // SAFETY: the request's connection is live; ngx_connection_local_sockaddr fills
        // `local_sockaddr` with the accepting socket's address (getsockname on a wildcard
        // listener) and leaves it pointing at a socket address of `local_socklen` bytes; each
        // variant is read only when that length covers it.
        unsafe {
            let c = self.get(|r| r.connection);
            if c.is_null() || ngx_connection_local_sockaddr(c, ptr::null_mut(), 0) != NGX_OK {
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
    fn client(self) -> String {
        // SAFETY: the request's connection and its addr_text live as long as the request.
        self.get(|r| unsafe {
            if r.connection.is_null() {
                return String::new();
            }
            String::from_utf8_lossy(bytes(&(*r.connection).addr_text)).into_owned()
        })
    }

    /// Logs `msg` at `level` on the request's connection log.
    fn log(self, level: u32, msg: &str) {
        let log = self.get(|r| r.connection);
        // SAFETY: the request's connection and its log are live while the request is.
        unsafe { log_str((*log).log, level, msg) };
    }

    /// True when the query string has the argument `name` (without value).
    fn has_arg(self, name: &[u8]) -> bool {
        self.get(|r| {
            // SAFETY: args is an nginx string of the request.
            let args = unsafe { bytes(&r.args) };
            args.split(|b| *b == b'&').any(|a| a == name)
        })
    }

    /// The `upstream {}` blocks (and implicit upstreams) of the request's configuration.
    fn upstreams(self) -> Vec<Upstream> {
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
                    a.elts as *const *mut ngx::ffi::ngx_http_upstream_srv_conf_t,
                    a.nelts,
                )
                .iter()
                .filter_map(|p| Upstream::from_ptr(*p))
                .collect()
            }
        })
    }

    fn content_length(self) -> i64 {
        self.get(|r| r.headers_in.content_length_n)
    }

    fn discard_body(self) -> ngx_int_t {
        // SAFETY: the request is live (handle).
        unsafe { ngx_http_discard_request_body(self.as_ptr()) }
    }

    /// Reads the body, then nginx calls [`put_body_read`].
    fn read_body(self) -> ngx_int_t {
        // SAFETY: the request is live (handle).
        unsafe { ngx_http_read_client_request_body(self.as_ptr(), Some(put_body_read)) }
    }

    /// The request body (memory buffers and buffers in the body's temporary file).
    fn body(self) -> Result<Vec<u8>, ApiError> {
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
                    if out.len() + len > MAX_BODY {
                        return Err(ApiError::body_too_large());
                    }
                    let start = out.len();
                    out.resize(start + len, 0);
                    let n =
                        ngx_read_file((*b).file, out.as_mut_ptr().add(start), len, (*b).file_pos);
                    if n != len as isize {
                        return Err(ApiError::new(
                            500,
                            "could not read the request body back from its temporary file",
                        ));
                    }
                } else if !(*b).pos.is_null() {
                    let len = (*b).last.offset_from((*b).pos) as usize;
                    if out.len() + len > MAX_BODY {
                        return Err(ApiError::body_too_large());
                    }
                    out.extend_from_slice(core::slice::from_raw_parts((*b).pos, len));
                }
                cl = (*cl).next;
            }
        }
        Ok(out)
    }

    /// Sends `status` with a JSON body; returns what the content handler returns to nginx.
    fn send(self, (status, body): Answer) -> ngx_int_t {
        let r = self.as_ptr();
        let mut body = body.into_bytes();
        body.push(b'\n');
        // SAFETY: the request is live (handle); the body is copied into its pool before it is
        // sent; the buffer and chain live until the output filter returns (nginx copies what it
        // keeps: the memory is the pool's).
        unsafe {
            let Some(copy) = pool_copy((*r).pool, &body) else {
                return NGX_ERROR;
            };
            let ho = ptr::addr_of_mut!((*r).headers_out);
            (*ho).status = status as usize;
            (*ho).content_length_n = body.len() as i64;
            let ct = b"application/json";
            (*ho).content_type_len = ct.len();
            (*ho).content_type = crate::ffi::borrowed(ct);
            let rc = ngx_http_send_header(r);
            if rc == NGX_ERROR || rc > NGX_OK || (*r).header_only() != 0 {
                return rc;
            }
            let b = ngx_pcalloc((*r).pool, core::mem::size_of::<ngx_buf_t>()).cast::<ngx_buf_t>();
            if b.is_null() {
                return NGX_ERROR;
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
            ngx_http_output_filter(r, ptr::addr_of_mut!(out))
        }
    }
}

/// The location's content handler.
pub extern "C" fn handle(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the content handler with a live request.
    let Some(r) = (unsafe { ApiReq::from_ptr(r) }) else {
        return NGX_ERROR;
    };
    let Some(rt) = route(&r.rest_of_uri()) else {
        r.discard_body();
        return r.send(err(ApiError::new(
            404,
            "no such API resource: use <location>/ or <location>/NAME",
        )));
    };
    match (r.method(), &rt) {
        (NGX_HTTP_GET | NGX_HTTP_HEAD, _) => {
            let rc = r.discard_body();
            if rc != NGX_OK {
                return rc;
            }
            let a = match rt {
                Route::List => list(r),
                Route::Upstream(name) => one(r, &name),
            };
            r.send(a)
        }
        (NGX_HTTP_PUT, Route::Upstream(_)) => {
            let access = r.access();
            let refused = if access.write {
                access.check_host(&r.host(), r.listener()).err()
            } else {
                Some(ApiError::read_only())
            };
            if let Some(e) = refused {
                r.discard_body();
                return r.send(err(e));
            }
            if r.content_length() > MAX_BODY as i64 {
                r.discard_body();
                return r.send(err(ApiError::body_too_large()));
            }
            let rc = r.read_body();
            if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
                return rc;
            }
            ngx::ffi::NGX_DONE as ngx_int_t
        }
        (_, Route::List) => {
            r.discard_body();
            r.send(err(ApiError::method("GET")))
        }
        (_, Route::Upstream(_)) => {
            r.discard_body();
            let allowed = if r.access().write {
                "GET or PUT"
            } else {
                "GET (this location is read-only)"
            };
            r.send(err(ApiError::method(allowed)))
        }
    }
}

/// What the registry says about the upstream `name`, when it may be changed live.
struct Target {
    name: String,
    zone: String,
    live: LiveUpstream,
}

fn target(r: ApiReq, name: &str) -> Result<Target, ApiError> {
    let Some(u) = r
        .upstreams()
        .into_iter()
        .find(|u| u.is_block() && u.host() == name.as_bytes())
    else {
        return Err(ApiError::unknown_upstream(name));
    };
    with_entry(u.as_ptr(), |e| {
        let Some(zone) = e.zone.clone() else {
            return Err(ApiError::no_zone(name));
        };
        if e.balancer.live.is_none() {
            return Err(ApiError::balancer_refused(name, &e.balancer.name));
        }
        if e.resolves_names {
            return Err(ApiError::resolves_names(name));
        }
        let Some(live) = e.live() else {
            return Err(ApiError::new(
                500,
                format!("upstream \"{name}\": its zone has no live state"),
            ));
        };
        Ok(Target {
            name: e.name.clone(),
            zone,
            live,
        })
    })
    .unwrap_or_else(|| {
        Err(ApiError::new(
            500,
            format!("upstream \"{name}\" was not registered"),
        ))
    })
}

fn list(r: ApiReq) -> Answer {
    let mut upstreams = Vec::new();
    for u in r.upstreams().into_iter().filter(|u| u.is_block()) {
        // Only what a PUT can change (`resolve` upstreams have no live state).
        let e = with_entry(u.as_ptr(), |e| {
            let live = e.live()?;
            if live.state().superseded() {
                return Some(Err(ApiError::superseded(&e.name)));
            }
            (e.zone.is_some() && e.balancer.live.is_some())
                .then(|| ListEntry {
                    name: e.name.clone(),
                    balancer: e.balancer.name.clone(),
                    zone: e.zone.clone().unwrap_or_default(),
                    generation: live.state().generation(),
                })
                .map(Ok)
        });
        match e {
            Some(Some(Ok(e))) => upstreams.push(e),
            Some(Some(Err(e))) => return err(e),
            _ => {}
        }
    }
    let write = r.access().write;
    (200, ListView { write, upstreams }.to_json())
}

fn one(r: ApiReq, name: &str) -> Answer {
    let t = match target(r, name) {
        Ok(t) => t,
        Err(e) => return err(e),
    };
    if t.live.state().superseded() {
        return err(ApiError::superseded(&t.name));
    }
    if r.has_arg(b"slab") {
        return (200, t.live.slab(&t.zone).to_json());
    }
    let view = t.live.view();
    let overdue = t.live.overdue_retired();
    if !overdue.is_empty() {
        let warn_ms = t.live.retired_warn_ms();
        r.log(
            NGX_LOG_WARN,
            &overdue_retired_line(&t.name, &overdue, warn_ms),
        );
    }
    (200, view.to_json())
}

extern "C" fn put_body_read(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls this once the body was read, with the request alive.
    let Some(r) = (unsafe { ApiReq::from_ptr(r) }) else {
        return;
    };
    let a = match r.body() {
        Ok(body) => put(r, &body),
        Err(e) => err(e),
    };
    let rc = r.send(a);
    // SAFETY: the request is live; finalizing it is this callback's job.
    unsafe { ngx_http_finalize_request(r.as_ptr(), rc) };
}

fn put(r: ApiReq, body: &[u8]) -> Answer {
    let Some(Route::Upstream(name)) = route(&r.rest_of_uri()) else {
        return err(ApiError::new(404, "no such API resource"));
    };
    let t = match target(r, &name) {
        Ok(t) => t,
        Err(e) => return err(e),
    };
    let req = match parse_put(body) {
        Ok(q) => q,
        Err(e) => return err(e),
    };
    match t.live.apply(&t.name, &t.zone, &req) {
        Ok(v) => {
            if v.changed {
                r.log(NGX_LOG_NOTICE, &v.log_line(&r.client(), &t.name));
            }
            (200, v.to_json())
        }
        Err(e) => err(e),
    }
}
