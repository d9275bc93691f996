//! The upstrand family of the module: `upstrand NAME { ... }` blocks, the `$upstrand_NAME`
//! variables with their run-time failover, the status variables (`$upstrand_addr`, ...,
//! `$upstrand_path`) and `dynamic_upstrand`.
//!
//! Decisions and walk logic live in `upstrand_core::upstrand` (pure, unit-tested); the files here
//! only translate between nginx structures and those values:
//! - [`block`]: the `upstrand` block directive (configuration time),
//! - [`request`]: per-request walk state and `$upstrand_NAME` (`request/mod.rs`), the header/body
//!   filters that swallow, re-run (clone subrequests) and deliver answers (`request/filters.rs`),
//!   and the peer-init hook (`request/peer_init.rs`),
//! - [`vars`]: the status variables,
//! - [`dynamic`]: `dynamic_upstrand` and its location configuration.
//!
//! Everything that touches nginx goes through the crate's [`crate::ffi`] layer; the registry is
//! this family's part of the module's main configuration ([`crate::ffi::conf::ConfPart`]).

pub mod block;
pub mod dynamic;
mod request;
mod vars;

pub use request::ReqCtx;

use core::cell::RefCell;

use ngx::ffi::{ngx_conf_t, ngx_http_upstream_conf_t, ngx_uint_t};
use upstrand_core::upstrand::conf::UpstrandConf;
use upstrand_core::upstrand::select::UpstrandState;

use crate::ffi::request::install_filters;
use crate::ffi::request::UpstreamConf;
use crate::ffi::upstream::{PeerInitFn, Upstream};
use crate::ffi::Status;

/// One configured upstrand.
pub struct Upstrand {
    pub conf: UpstrandConf,
    /// Per-worker state (round-robin cursors, blacklist); created on first use in a worker.
    pub state: RefCell<Option<UpstrandState>>,
}

impl Upstrand {
    /// Runs `f` with this worker's state of the upstrand.
    pub fn with_state<T>(&self, f: impl FnOnce(&UpstrandConf, &mut UpstrandState) -> T) -> T {
        let mut slot = self.state.borrow_mut();
        let state = slot.get_or_insert_with(|| UpstrandState::new(&self.conf));
        f(&self.conf, state)
    }
}

/// Everything the upstrand family keeps for one configuration cycle: its part of the module's
/// main configuration (in the configuration pool, dropped with it).
#[derive(Default)]
pub struct Registry {
    pub upstrands: Vec<Upstrand>,
    /// Upstreams whose `peer.init` we wrapped, with the original function.
    pub wrapped: Vec<(Upstream, Option<PeerInitFn>)>,
    /// Variable indexes of `$upstream_<suffix>` for each of `STATUS_SUFFIXES` (read by the
    /// status variables), registered at postconfiguration.
    pub upstream_indexes: Vec<ngx_uint_t>,
    /// Per worker: for each location's `ngx_http_upstream_conf_t` used by a walk, a copy with
    /// `X-Accel-Redirect` ignored and `proxy_intercept_errors` off (made once, reused).
    pub walk_confs: RefCell<Vec<(UpstreamConf, Box<ngx_http_upstream_conf_t>)>>,
}

impl Registry {
    /// The upstrand called `name` (case-insensitive, as nginx variable names).
    pub fn find(&self, name: &[u8]) -> Option<&Upstrand> {
        self.upstrands
            .iter()
            .find(|u| u.conf.name.as_bytes().eq_ignore_ascii_case(name))
    }
}

/// Called from the module's preconfiguration: registers the status variables.
pub fn preconfiguration(cf: &mut ngx_conf_t) -> Status {
    vars::register(cf)
}

/// Called from the module's postconfiguration: when the configuration has upstrands, indexes the
/// `$upstream_*` variables the status variables read, installs the filters and the peer-init hook.
pub fn postconfiguration(cf: &mut ngx_conf_t, reg: &mut Registry) -> Status {
    if reg.upstrands.is_empty() {
        return Status::NGX_OK;
    }
    let Some(indexes) = vars::upstream_indexes(cf) else {
        return Status::NGX_ERROR;
    };
    reg.upstream_indexes = indexes;
    request::wrap_peer_init(cf, reg);
    install_filters::<request::WalkFilters>();
    Status::NGX_OK
}
