//! The `peer.init` hook on member upstreams: requests of a walk run with `X-Accel-Redirect` and
//! `proxy_intercept_errors` turned off, and a poisoned walk fails with 500.

use ngx::ffi::{
    ngx_conf_t, ngx_http_upstream_conf_t, ngx_uint_t, NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT,
};
use upstrand_core::upstreams::members_to_wrap;

use super::find_ctx;
use crate::ffi::conf::ConfPart;
use crate::ffi::request::{Req, UpstreamConf};
use crate::ffi::upstream::{self as upstreams, PeerInit, Upstream};
use crate::ffi::Status;
use crate::upstrand::Registry;

/// Wraps `peer.init` of every upstream that is a member of some upstrand, so that requests of a
/// walk run with `X-Accel-Redirect` and `proxy_intercept_errors` turned off (an internal
/// redirect would break the walk) and a poisoned walk fails with 500. Called once from
/// postconfiguration, after the upstream module's init_main_conf set every `peer.init`.
pub(in crate::upstrand) fn wrap_peer_init(cf: &ngx_conf_t, reg: &mut Registry) {
    let list = upstreams::all(cf);
    let members = reg
        .upstrands
        .iter()
        .flat_map(|up| up.conf.normal.iter().chain(&up.conf.backup))
        .map(|m| m.name.as_str());
    let wrap = members_to_wrap(&upstreams::infos(&list), members);
    for u in wrap.into_iter().map(|i| list[i]) {
        reg.wrapped.push((u, u.peer_init_fn()));
        u.wrap_peer_init::<WalkPeerInit>();
    }
}

/// The walk variant of a location's upstream configuration (see [`Registry::walk_confs`]).
fn walk_conf(reg: &Registry, conf: UpstreamConf) -> *mut ngx_http_upstream_conf_t {
    let mut confs = reg.walk_confs.borrow_mut();
    if let Some((_, copy)) = confs.iter_mut().find(|(orig, _)| *orig == conf) {
        return &mut **copy;
    }
    let mut copy = Box::new(conf.get());
    copy.ignore_headers |= NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT as ngx_uint_t;
    copy.intercept_errors = 0;
    let p: *mut ngx_http_upstream_conf_t = &mut *copy;
    confs.push((conf, copy));
    p
}

/// The `peer.init` of member upstreams.
struct WalkPeerInit;

impl PeerInit for WalkPeerInit {
    fn init(req: Req, us: Upstream) -> Status {
        let Some(reg) = Registry::of_request(req) else {
            return Status::NGX_ERROR;
        };
        let Some(orig) = reg
            .wrapped
            .iter()
            .find(|(u, _)| *u == us)
            .and_then(|(_, f)| *f)
        else {
            return Status::NGX_ERROR;
        };
        if let Some(ctx) = find_ctx(req) {
            if ctx.walk().poisoned() {
                return Status::NGX_ERROR;
            }
            req.map_upstream_conf(|conf| walk_conf(reg, conf));
        }
        orig.call(req, us)
    }
}
