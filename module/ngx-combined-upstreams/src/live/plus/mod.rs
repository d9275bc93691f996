//! The NGINX Plus-compatible API (`upstreams_api plus [write=on] [host=...];`): the
//! upstream part of NGINX Plus's REST API over the live state the native API reads and writes.
//!
//! - `mod.rs` (this file): the content handler: routing, the write-access rule (the native
//!   API's: `write=on` and an allowed `Host`), errors in Plus's shape.
//! - [`read`]: the `GET` answers.
//! - [`write`]: `POST`/`PATCH`/`DELETE` of servers, each applied as the native `PUT` with
//!   compare-and-set on the generation.
//!
//! Routes, JSON shapes, body validation and error codes are in `upstrand_core::plus`; the
//! operator's documentation is `docs/plus-api.md`.

pub mod read;
pub mod write;

use ngx::ffi::{
    ngx_int_t, NGX_HTTP_DELETE, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_PATCH, NGX_HTTP_POST,
    NGX_HTTP_SPECIAL_RESPONSE,
};
use upstrand_core::live::Access;
use upstrand_core::plus::route::{action, route, Action, Method};
use upstrand_core::plus::{PlusError, MAX_BODY};

use crate::ffi::conf::ConfPart;
use crate::ffi::request::ContentHandler;
use crate::ffi::request::Req;
use crate::ffi::Status;

/// An answer: status and JSON body, or an error.
pub type Answer = Result<(u16, String), PlusError>;

/// The content handler of `upstreams_api plus` locations.
pub struct Api;

impl ContentHandler for Api {
    fn handle(r: Req) -> Status {
        Status(handle(r))
    }
}

/// The access settings of the request's location (read-only when it has none).
fn access(r: Req) -> Access {
    super::ApiLocation::of_request(r)
        .and_then(|a| a.access.clone())
        .unwrap_or_default()
}

fn method(r: Req) -> Method {
    match r.method() {
        NGX_HTTP_GET | NGX_HTTP_HEAD => Method::Get,
        NGX_HTTP_POST => Method::Post,
        NGX_HTTP_PATCH => Method::Patch,
        NGX_HTTP_DELETE => Method::Delete,
        _ => Method::Other,
    }
}

/// Sends an answer; returns what the content handler returns to nginx.
fn send(r: Req, a: Answer) -> ngx_int_t {
    let (status, mut body) = match a {
        Ok(ok) => ok,
        Err(e) => (e.status, e.to_json(&r.request_id())),
    };
    body.push('\n');
    r.send_json(status, body.as_bytes()).0
}

/// Sends an error after discarding the body.
fn refuse(r: Req, e: PlusError) -> ngx_int_t {
    r.discard_body();
    send(r, Err(e))
}

fn handle(r: Req) -> ngx_int_t {
    let rt = match route(&r.rest_of_uri()) {
        Ok(rt) => rt,
        Err(e) => return refuse(r, e),
    };
    let access = access(r);
    let act = match action(method(r), &rt.resource, access.write) {
        Ok(a) => a,
        Err(e) => return refuse(r, e),
    };
    if act == Action::Read {
        let rc = r.discard_body();
        if rc != Status::NGX_OK {
            return rc.0;
        }
        return send(r, read::answer(r, &rt));
    }
    if let Err(e) = access.check_host(&r.host(), r.listener()) {
        // The native API's rule and text, worded for this location's writes.
        let text = e
            .message
            .replace("a PUT must", "a write must")
            .replace("for a PUT", "for a write")
            .replace("upstreams_api write=on", "upstreams_api plus write=on");
        return refuse(r, PlusError::new(403, "HostNotAllowed", text));
    }
    if r.content_length() > MAX_BODY as i64 {
        return refuse(
            r,
            PlusError::new(
                413,
                "BodyTooLarge",
                format!("request body larger than {MAX_BODY} bytes"),
            ),
        );
    }
    let rc = r.read_body::<write::Body>();
    if rc.0 >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
        return rc.0;
    }
    ngx::ffi::NGX_DONE as ngx_int_t
}
