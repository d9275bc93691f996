//! The HTTP handler of an `upstreams_api` location: routes `GET <loc>/`, `GET <loc>/NAME`
//! (`?slab` for the zone's slab figures) and `PUT <loc>/NAME`, and answers JSON.

use core::ptr;

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_http_core_loc_conf_t, ngx_http_core_module,
    ngx_http_discard_request_body, ngx_http_finalize_request, ngx_http_output_filter,
    ngx_http_read_client_request_body, ngx_http_request_t, ngx_http_send_header,
    ngx_http_upstream_main_conf_t, ngx_http_upstream_module, ngx_http_upstream_rr_peers_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_pcalloc, ngx_read_file, ngx_slab_pool_t,
    NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_PUT, NGX_HTTP_SPECIAL_RESPONSE,
};
use upstrand_core::live::render::{ListEntry, ListView};
use upstrand_core::live::{parse_put, route, ApiError, Route, MAX_BODY};

use super::{peers, with_entry, zone};
use crate::ffi_util::{bytes, pool_copy, NGX_ERROR, NGX_OK};

/// An answer: status and JSON body.
type Answer = (u16, String);

fn err(e: ApiError) -> Answer {
    (e.status, e.to_json())
}

/// The location's content handler.
///
/// # Safety
/// Called by nginx with a live request in an `upstreams_api` location.
pub unsafe extern "C" fn handle(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is live (nginx); see each helper.
    unsafe {
        let method = (*r).method as u32;
        let Some(rt) = route(rest_of_uri(r)) else {
            ngx_http_discard_request_body(r);
            return send(
                r,
                err(ApiError::new(
                    404,
                    "no such API resource: use <location>/ or <location>/NAME",
                )),
            );
        };
        match (method, &rt) {
            (NGX_HTTP_GET | NGX_HTTP_HEAD, _) => {
                let rc = ngx_http_discard_request_body(r);
                if rc != NGX_OK {
                    return rc;
                }
                let a = match rt {
                    Route::List => list(r),
                    Route::Upstream(name) => one(r, &name),
                };
                send(r, a)
            }
            (NGX_HTTP_PUT, Route::Upstream(_)) => {
                if (*r).headers_in.content_length_n > MAX_BODY as i64 {
                    ngx_http_discard_request_body(r);
                    return send(r, err(ApiError::body_too_large()));
                }
                let rc = ngx_http_read_client_request_body(r, Some(put_body_read));
                if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
                    return rc;
                }
                ngx::ffi::NGX_DONE as ngx_int_t
            }
            (_, Route::List) => {
                ngx_http_discard_request_body(r);
                send(r, err(ApiError::method("GET")))
            }
            (_, Route::Upstream(_)) => {
                ngx_http_discard_request_body(r);
                send(r, err(ApiError::method("GET or PUT")))
            }
        }
    }
}

/// The URI after the location's prefix.
unsafe fn rest_of_uri<'a>(r: *mut ngx_http_request_t) -> &'a [u8] {
    // SAFETY: r is live; its core loc conf is at the core module's index; uri and the
    // location name are nginx strings living as long as the request and the configuration.
    unsafe {
        let idx = (*ptr::addr_of!(ngx_http_core_module)).ctx_index;
        let clcf = *(*r).loc_conf.add(idx) as *mut ngx_http_core_loc_conf_t;
        let uri = bytes(&(*r).uri);
        let loc = bytes(&(*clcf).name);
        let loc = loc.strip_prefix(b"=").unwrap_or(loc);
        let loc = loc.strip_suffix(b"/").unwrap_or(loc);
        uri.strip_prefix(loc).unwrap_or(b"/#")
    }
}

/// The `upstream {}` blocks of the running configuration.
unsafe fn upstreams<'a>(r: *mut ngx_http_request_t) -> &'a [*mut ngx_http_upstream_srv_conf_t] {
    // SAFETY: r's main_conf holds the upstream module's main conf with its `upstreams` array.
    unsafe {
        let idx = (*ptr::addr_of!(ngx_http_upstream_module)).ctx_index;
        let umcf = *(*r).main_conf.add(idx) as *mut ngx_http_upstream_main_conf_t;
        let a = &(*umcf).upstreams;
        if a.nelts == 0 {
            return &[];
        }
        core::slice::from_raw_parts(a.elts as *const *mut ngx_http_upstream_srv_conf_t, a.nelts)
    }
}

/// What the registry says about the upstream `name`, when it may be changed live.
struct Target {
    name: String,
    zone: String,
    shared: *mut zone::Shared,
    primary: *mut ngx_http_upstream_rr_peers_t,
}

unsafe fn target(r: *mut ngx_http_request_t, name: &str) -> Result<Target, ApiError> {
    // SAFETY: r is live; the upstreams are the running configuration's.
    unsafe {
        for &u in upstreams(r) {
            if (*u).srv_conf.is_null() || bytes(&(*u).host) != name.as_bytes() {
                continue;
            }
            let t = with_entry(u, |e| {
                let Some(zone) = e.zone.clone() else {
                    return Err(ApiError::no_zone(name));
                };
                if e.balancer.live.is_none() {
                    return Err(ApiError::balancer_refused(name, &e.balancer.name));
                }
                if e.resolves_names {
                    return Err(ApiError::resolves_names(name));
                }
                if e.shared.is_null() {
                    return Err(ApiError::new(
                        500,
                        format!("upstream \"{name}\": its zone has no live state"),
                    ));
                }
                Ok(Target {
                    name: e.name.clone(),
                    zone,
                    shared: e.shared,
                    primary: (*u).peer.data.cast(),
                })
            });
            return t.unwrap_or_else(|| {
                Err(ApiError::new(
                    500,
                    format!("upstream \"{name}\" was not registered"),
                ))
            });
        }
        Err(ApiError::unknown_upstream(name))
    }
}

unsafe fn list(r: *mut ngx_http_request_t) -> Answer {
    let mut upstreams_v = Vec::new();
    // SAFETY: as target.
    unsafe {
        for &u in upstreams(r) {
            if (*u).srv_conf.is_null() {
                continue;
            }
            let e = with_entry(u, |e| {
                // Only what a PUT can change (`resolve` upstreams have no live state).
                (e.zone.is_some() && e.balancer.live.is_some() && !e.shared.is_null()).then(|| {
                    ListEntry {
                        name: e.name.clone(),
                        balancer: e.balancer.name.clone(),
                        zone: e.zone.clone().unwrap_or_default(),
                        generation: zone::generation(e.shared),
                    }
                })
            });
            if let Some(Some(e)) = e {
                upstreams_v.push(e);
            }
        }
    }
    (
        200,
        ListView {
            upstreams: upstreams_v,
        }
        .to_json(),
    )
}

unsafe fn one(r: *mut ngx_http_request_t, name: &str) -> Answer {
    // SAFETY: as target; the target's pointers are the running configuration's zone.
    unsafe {
        let t = match target(r, name) {
            Ok(t) => t,
            Err(e) => return err(e),
        };
        if bytes(&(*r).args)
            .split(|b| *b == b'&')
            .any(|a| a == b"slab")
        {
            let pool: *mut ngx_slab_pool_t = peers::shpool(t.primary);
            return (200, zone::slab(pool, &t.zone).to_json());
        }
        (200, zone::view(t.shared, t.primary).to_json())
    }
}

unsafe extern "C" fn put_body_read(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls this once the body was read, with the request alive.
    unsafe {
        let a = match read_body(r) {
            Ok(body) => put(r, &body),
            Err(e) => err(e),
        };
        ngx_http_finalize_request(r, send(r, a));
    }
}

unsafe fn put(r: *mut ngx_http_request_t, body: &[u8]) -> Answer {
    // SAFETY: as target.
    unsafe {
        let Some(Route::Upstream(name)) = route(rest_of_uri(r)) else {
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
        match zone::apply(t.shared, t.primary, &t.name, &t.zone, &req) {
            Ok(v) => (200, v.to_json()),
            Err(e) => err(e),
        }
    }
}

/// The request body (memory buffers and buffers in the body's temporary file).
unsafe fn read_body(r: *mut ngx_http_request_t) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    // SAFETY: the body chain was filled by nginx; memory buffers hold pos..last, file buffers
    // file_pos..file_last of their file.
    unsafe {
        let rb = (*r).request_body;
        if rb.is_null() {
            return Ok(out);
        }
        let mut cl = (*rb).bufs;
        while !cl.is_null() {
            let b: *mut ngx_buf_t = (*cl).buf;
            if (*b).in_file() != 0 && !(*b).file.is_null() {
                let len = ((*b).file_last - (*b).file_pos) as usize;
                if out.len() + len > MAX_BODY {
                    return Err(ApiError::body_too_large());
                }
                let start = out.len();
                out.resize(start + len, 0);
                let n = ngx_read_file((*b).file, out.as_mut_ptr().add(start), len, (*b).file_pos);
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
unsafe fn send(r: *mut ngx_http_request_t, (status, body): Answer) -> ngx_int_t {
    // SAFETY: r is live; the body is copied into the request pool before it is sent.
    unsafe {
        let mut body = body.into_bytes();
        body.push(b'\n');
        let Some(copy) = pool_copy((*r).pool, &body) else {
            return NGX_ERROR;
        };
        let ho = ptr::addr_of_mut!((*r).headers_out);
        (*ho).status = status as usize;
        (*ho).content_length_n = body.len() as i64;
        let ct = b"application/json";
        (*ho).content_type_len = ct.len();
        (*ho).content_type = crate::ffi_util::borrowed(ct);
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
