//! The HTTP handler of an `upstreams_api` location: routes `GET <loc>/`, `GET <loc>/NAME`
//! (`?slab` for the zone's slab figures) and `PUT <loc>/NAME`, and answers JSON. A `PUT` is
//! taken only with the location's `write=on` and a `Host` its access settings allow
//! (`upstrand_core::live::access`); each applied one is logged as a `notice`.
//!
//! The content handler and the body callback are implementations of the FFI layer's
//! `ContentHandler` / `BodyReader`; the request is a [`Req`] handle whose methods read or write
//! it for one call.

use ngx::ffi::{
    ngx_int_t, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_PUT, NGX_HTTP_SPECIAL_RESPONSE,
    NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use upstrand_core::live::render::{overdue_retired_line, ListEntry, ListView};
use upstrand_core::live::{parse_put, route, Access, ApiError, Route, MAX_BODY};

use super::with_entry;
use super::zone::LiveUpstream;
use crate::ffi::conf::ConfPart;
use crate::ffi::request::Req;
use crate::ffi::request::{BodyError, BodyReader, ContentHandler};
use crate::ffi::Status;

/// An answer: status and JSON body.
type Answer = (u16, String);

fn err(e: ApiError) -> Answer {
    (e.status, e.to_json())
}

/// A request of an `upstreams_api` location.
type ApiReq = Req;

impl Req {
    /// The access settings of the request's location (read-only when it has none).
    fn access(self) -> Access {
        super::ApiLocation::of_request(self)
            .and_then(|a| a.access.clone())
            .unwrap_or_default()
    }

    /// Sends `status` with a JSON body; returns what the content handler returns to nginx.
    fn send(self, (status, body): Answer) -> ngx_int_t {
        let mut body = body.into_bytes();
        body.push(b'\n');
        self.send_json(status, &body).0
    }
}

/// The content handler of `upstreams_api` locations.
pub struct Api;

impl ContentHandler for Api {
    fn handle(r: Req) -> Status {
        Status(handle(r))
    }
}

/// The location's content handler.
fn handle(r: ApiReq) -> ngx_int_t {
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
            if rc != Status::NGX_OK {
                return rc.0;
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
            let rc = r.read_body::<PutBody>();
            if rc.0 >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
                return rc.0;
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
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) zone: String,
    pub(crate) live: LiveUpstream,
    pub(crate) probe: Option<std::sync::Arc<upstrand_core::live::probe::ProbeConf>>,
}

/// The upstream `name` when it may be changed live (shared with the Plus API, `live/plus/`).
pub(crate) fn target(r: ApiReq, name: &str) -> Result<Target, ApiError> {
    let Some(u) = r
        .upstreams()
        .into_iter()
        .find(|u| u.is_block() && u.host() == name.as_bytes())
    else {
        return Err(ApiError::unknown_upstream(name));
    };
    target_of(u, name)
}

/// [`target`] of the upstream block `u` named `name`.
pub(crate) fn target_of(u: crate::ffi::upstream::Upstream, name: &str) -> Result<Target, ApiError> {
    with_entry(u.as_ptr(), |e| {
        let Some(zone) = e.zone.clone() else {
            return Err(ApiError::no_zone(name));
        };
        if e.balancer.live().is_none() {
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
            probe: e.probe.clone(),
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
            (e.zone.is_some() && e.balancer.live().is_some())
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
    let mut view = t.live.view();
    if let Some(p) = &t.probe {
        super::health::decorate(&mut view, t.live, p);
    }
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

/// The `PUT` once its body was read.
struct PutBody;

impl BodyReader for PutBody {
    fn body_read(r: Req) -> Status {
        let a = match r.body(MAX_BODY) {
            Ok(body) => put(r, &body),
            Err(BodyError::TooLarge) => err(ApiError::body_too_large()),
            Err(BodyError::Unreadable) => err(ApiError::new(
                500,
                "could not read the request body back from its temporary file",
            )),
        };
        Status(r.send(a))
    }
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
