//! Safe code on [`Upstream`]'s primitives (`mod.rs`): the fields of an upstream configuration
//! that are plain values (port, flags, the balancer's hooks, its zone), the wrapper traits of
//! its hooks ([`InitUpstream`], [`PeerInit`]), the upstream list as the pure crate sees it
//! ([`infos`], [`find`]), a directive inside `upstream {}` ([`handle_directive`]) and a server
//! entry's flags.

use core::ffi::c_void;
use core::ptr::NonNull;

use ngx::ffi::{
    ngx_conf_t, ngx_http_upstream_init_peer_pt, ngx_http_upstream_init_pt,
    ngx_http_upstream_server_t, NGX_HTTP_UPSTREAM_CREATE,
};
use ngx::http::HttpModuleServerConf;
use upstrand_core::upstreams::{find_by_name, UpstreamInfo};
use upstrand_core::{ConfError, ServerFlags};

use super::{all, current, init_upstream, peer_init, InitUpstreamFn, PeerInitFn, Upstream};
use crate::ffi::conf::ConfExt;
use crate::ffi::request::Req;
use crate::ffi::{ConfFail, Status};

impl Upstream {
    /// `port` of the upstream (0 for explicit blocks and singlets).
    pub fn port(self) -> u16 {
        self.with(|u| u.port)
    }

    /// nginx's flags (`NGX_HTTP_UPSTREAM_*`) of the upstream's balancer.
    pub fn flags(self) -> u32 {
        self.with(|u| u.flags as u32)
    }

    /// True when nginx keeps a server list for it (an implicit upstream of a host name has none).
    pub fn has_server_list(self) -> bool {
        self.with(|u| !u.servers.is_null())
    }

    /// The server configuration of module `M` of the upstream (None for implicit upstreams).
    pub fn srv_conf<M: HttpModuleServerConf>(self) -> Option<&'static mut M::ServerConf> {
        self.with(M::server_conf_mut)
    }

    /// The upstream's `peer.init_upstream`, to call from a wrapper.
    pub fn init_upstream_fn(self) -> InitUpstreamFn {
        InitUpstreamFn(self.init_upstream())
    }

    /// Makes `I` the upstream's `peer.init_upstream`.
    pub fn wrap_init_upstream<I: InitUpstream>(self) {
        self.set_init_upstream(Some(init_upstream::<I>));
    }

    /// The upstream's `peer.init`, to call from a wrapper (None before its balancer's
    /// `init_upstream` ran).
    pub fn peer_init_fn(self) -> Option<PeerInitFn> {
        self.peer_init().map(PeerInitFn)
    }

    /// Makes `P` the upstream's `peer.init`.
    pub fn wrap_peer_init<P: PeerInit>(self) {
        self.set_peer_init(Some(peer_init::<P>));
    }

    /// The upstream's `peer.init_upstream`.
    pub fn init_upstream(self) -> ngx_http_upstream_init_pt {
        self.with(|u| u.peer.init_upstream)
    }

    /// Replaces the upstream's `peer.init_upstream`.
    pub fn set_init_upstream(self, f: ngx_http_upstream_init_pt) {
        self.with_mut(|u| u.peer.init_upstream = f);
    }

    /// The upstream's `peer.init` (set by its balancer's `init_upstream`).
    pub fn peer_init(self) -> ngx_http_upstream_init_peer_pt {
        self.with(|u| u.peer.init)
    }

    /// Replaces the upstream's `peer.init`.
    pub fn set_peer_init(self, f: ngx_http_upstream_init_peer_pt) {
        self.with_mut(|u| u.peer.init = f);
    }

    /// The balancer's data (`peer.data`: the round-robin peer list for nginx's own balancers).
    pub fn peer_data(self) -> *mut c_void {
        self.with(|u| u.peer.data)
    }

    /// The upstream's shared-memory zone (`zone NAME SIZE;`), when it has one.
    pub fn shm_zone(self) -> Option<NonNull<ngx::ffi::ngx_shm_zone_t>> {
        self.with(|u| NonNull::new(u.shm_zone))
    }

    /// True for an `upstream {}` block or singlet (an implicit upstream made by `proxy_pass
    /// http://host` has no server configurations).
    pub fn is_block(self) -> bool {
        self.with(|u| !u.srv_conf.is_null())
    }
}

/// The plain view of upstreams that `upstrand_core::upstreams` decides on.
pub fn infos(list: &[Upstream]) -> Vec<UpstreamInfo<'static>> {
    list.iter()
        .map(|u| UpstreamInfo {
            name: u.host(),
            port: u.port(),
            explicit: u.flags() & NGX_HTTP_UPSTREAM_CREATE != 0,
        })
        .collect()
}

/// The upstream `add_upstream NAME` refers to (see `upstrand_core::upstreams::find_by_name`).
pub fn find(cf: &ngx_conf_t, name: &[u8]) -> Option<Upstream> {
    let list = all(cf);
    find_by_name(&infos(&list), name).map(|i| list[i])
}

/// The body of a handler of a directive inside `upstream {}` whose arguments the pure crate
/// parses: `parse` gets the arguments (without the directive name), then `apply` runs with the
/// upstream being parsed.
pub fn handle_directive<T>(
    cf: &mut ngx_conf_t,
    parse: fn(&[&[u8]]) -> Result<T, ConfError>,
    apply: fn(&mut ngx_conf_t, Upstream, T) -> Result<(), ConfFail>,
) -> Result<(), ConfFail> {
    let args = cf.args();
    let opts = parse(args.get(1..).unwrap_or_default())?;
    match current(cf) {
        Some(host) => apply(cf, host, opts),
        None => Err(ConfFail::Logged),
    }
}

/// The flags of a server entry, as plain values.
pub fn flags_of(s: &ngx_http_upstream_server_t) -> ServerFlags {
    ServerFlags {
        weight: s.weight as u64,
        backup: s.backup() != 0,
        down: s.down != 0,
    }
}

/// Applies plain flags to a server entry.
pub fn set_flags(s: &mut ngx_http_upstream_server_t, f: ServerFlags) {
    s.weight = f.weight as _;
    s.set_backup(f.backup as _);
    s.down = f.down as _;
}

/// A wrapper of an upstream's `peer.init_upstream` (runs at the end of `http {}`).
pub trait InitUpstream {
    /// Initialises `u` (call the original through [`InitUpstreamFn::call`]).
    fn init(cf: &mut ngx_conf_t, u: Upstream) -> Status;
}

/// A wrapper of an upstream's `peer.init` (runs when a request connects to the upstream).
pub trait PeerInit {
    /// Initialises the balancer of request `r` for upstream `us` (call the original through
    /// [`PeerInitFn::call`]).
    fn init(r: Req, us: Upstream) -> Status;
}
