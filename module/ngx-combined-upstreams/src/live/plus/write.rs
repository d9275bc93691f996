//! `POST .../servers`, `PATCH .../servers/ID` and `DELETE .../servers/ID` once the body was
//! read: each is planned on the set read now (`upstrand_core::plus::write::plan`) and applied
//! through the native `PUT`'s `LiveUpstream::apply` with that set's generation; when another
//! writer changed the set in between, it is planned again on the new set (at most
//! `WRITE_ATTEMPTS` times). An applied change is logged as the native `PUT`'s is.

use ngx::ffi::NGX_LOG_NOTICE;
use upstrand_core::plus::body;
use upstrand_core::plus::route::{route, Resource};
use upstrand_core::plus::write::{answer, plan, WriteOp};
use upstrand_core::plus::{is_generation_conflict, PlusError, MAX_BODY, WRITE_ATTEMPTS};

use super::read::live_view;
use super::{send, Answer};
use crate::ffi::request::Req;
use crate::ffi::request::{BodyError, BodyReader};
use crate::ffi::Status;

/// The write once its body was read.
pub struct Body;

impl BodyReader for Body {
    fn body_read(r: Req) -> Status {
        let a = match r.body(MAX_BODY) {
            Ok(body) => write(r, &body),
            Err(BodyError::TooLarge) => Err(PlusError::new(
                413,
                "BodyTooLarge",
                format!("request body larger than {MAX_BODY} bytes"),
            )),
            Err(BodyError::Unreadable) => Err(PlusError::new(
                400,
                "BodyReadError",
                "reading request body failed",
            )),
        };
        Status(send(r, a))
    }
}

fn write(r: Req, body: &[u8]) -> Answer {
    let rt = route(&r.rest_of_uri())?;
    let (name, op) = match rt.resource {
        Resource::Servers(name) => (name, WriteOp::Add(body::parse(body)?)),
        Resource::Server(name, id) if r.method() == ngx::ffi::NGX_HTTP_PATCH => {
            (name, WriteOp::Patch(id, body::parse(body)?))
        }
        Resource::Server(name, id) => (name, WriteOp::Delete(id)),
        _ => return Err(PlusError::method_not_supported()),
    };
    for _ in 0..WRITE_ATTEMPTS {
        let (t, now) = live_view(r, &name)?;
        let req = plan(&now, &op)?;
        match t.live.apply(&t.name, &t.zone, &req) {
            Ok(v) => {
                if v.changed {
                    r.log(NGX_LOG_NOTICE, &v.log_line(&r.client(), &t.name));
                }
                let (_, after) = live_view(r, &name)?;
                return answer(&op, &after);
            }
            Err(e) if is_generation_conflict(&e) => continue,
            Err(e) => return Err(PlusError::from_live(&e)),
        }
    }
    Err(PlusError::new(
        409,
        "UpstreamConflict",
        format!(
            "upstream \"{name}\" changed {WRITE_ATTEMPTS} times while this change was planned; nothing changed, retry"
        ),
    ))
}
