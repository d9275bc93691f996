//! Access to nginx's upstream configuration (`ngx_http_upstream_module`'s structures) for the
//! directives that work inside `upstream {}`, for the upstrand family and the live API, and the
//! trampolines of the `init_upstream` / `peer.init` wrappers ([`InitUpstream`], [`PeerInit`]).
//!
//! [`Upstream`] is the fence: a handle on one `ngx_http_upstream_srv_conf_t` of the
//! configuration being parsed, made only from nginx's own upstream list (or from nginx's call of
//! a hook), whose safe methods each touch the structure briefly and hold no reference to it.

use core::ffi::{c_void, CStr};
use core::ptr::NonNull;
use core::{mem, ptr, slice};

use ngx::ffi::{
    ngx_array_create, ngx_array_push, ngx_conf_t, ngx_http_max_module, ngx_http_module_t,
    ngx_http_request_t, ngx_http_upstream_add, ngx_http_upstream_init_peer_pt,
    ngx_http_upstream_init_pt, ngx_http_upstream_init_round_robin, ngx_http_upstream_server_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_pcalloc, ngx_url_t, NGX_HTTP_MODULE,
    NGX_HTTP_UPSTREAM_BACKUP, NGX_HTTP_UPSTREAM_CREATE, NGX_HTTP_UPSTREAM_DOWN,
    NGX_HTTP_UPSTREAM_FAIL_TIMEOUT, NGX_HTTP_UPSTREAM_MAX_CONNS, NGX_HTTP_UPSTREAM_MAX_FAILS,
    NGX_HTTP_UPSTREAM_WEIGHT,
};
use ngx::http::{HttpModule, HttpModuleMainConf, HttpModuleServerConf, NgxHttpUpstreamModule};
use upstrand_core::upstreams::{find_by_name, UpstreamInfo};
use upstrand_core::{ConfError, ServerFlags};

use super::conf::ConfExt;
use super::peers::Peers;
use super::probe::Balancer;
use super::request::Req;
use super::{bytes, ConfFail, Status};

/// The flags nginx gives an explicit `upstream {}` block (plain round robin).
pub const ROUND_ROBIN_FLAGS: u32 = NGX_HTTP_UPSTREAM_CREATE
    | NGX_HTTP_UPSTREAM_WEIGHT
    | NGX_HTTP_UPSTREAM_MAX_CONNS
    | NGX_HTTP_UPSTREAM_MAX_FAILS
    | NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
    | NGX_HTTP_UPSTREAM_DOWN
    | NGX_HTTP_UPSTREAM_BACKUP;

/// One upstream configuration of the cycle (explicit block, singlet or implicit upstream).
/// Copyable: it is a pointer; its methods read or write the structure for the duration of the
/// call only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Upstream(NonNull<ngx_http_upstream_srv_conf_t>);

impl Upstream {
    /// # Safety
    /// `p` is null or points at an upstream configuration nginx made for the configuration
    /// being parsed (it lives as long as the cycle) and is only used from nginx's thread.
    pub unsafe fn from_ptr(p: *mut ngx_http_upstream_srv_conf_t) -> Option<Upstream> {
        NonNull::new(p).map(Upstream)
    }

    /// The pointer, for comparisons and nginx calls.
    pub fn as_ptr(self) -> *mut ngx_http_upstream_srv_conf_t {
        self.0.as_ptr()
    }

    fn with<T>(self, f: impl FnOnce(&ngx_http_upstream_srv_conf_t) -> T) -> T {
        // SAFETY: see `from_ptr`; the reference lives only during `f`, which calls no nginx code.
        f(unsafe { self.0.as_ref() })
    }

    fn with_mut<T>(self, f: impl FnOnce(&mut ngx_http_upstream_srv_conf_t) -> T) -> T {
        // SAFETY: see `from_ptr`; configuration parsing is single-threaded and the reference
        // lives only during `f`, which holds no other reference to this upstream.
        f(unsafe { &mut *self.0.as_ptr() })
    }

    /// The name (`upstream NAME`, or `HOST` of an implicit upstream).
    pub fn host(self) -> &'static [u8] {
        // SAFETY: the host name lives in the configuration pool, as long as the cycle.
        self.with(|u| unsafe { bytes(&u.host) })
    }

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

    /// A copy of the servers so far (pushing to the list afterwards does not change it).
    pub fn servers(self) -> Vec<ngx_http_upstream_server_t> {
        self.with(|u| {
            let a = u.servers;
            // SAFETY: `servers` is null or an ngx_array_t of ngx_http_upstream_server_t.
            unsafe {
                if a.is_null() || (*a).nelts == 0 {
                    return Vec::new();
                }
                slice::from_raw_parts((*a).elts as *const ngx_http_upstream_server_t, (*a).nelts)
                    .to_vec()
            }
        })
    }

    /// Appends a copy of `server` (the list is created if missing); out of memory is
    /// [`ConfFail::Logged`].
    pub fn push_server(
        self,
        cf: &ngx_conf_t,
        server: &ngx_http_upstream_server_t,
    ) -> Result<(), ConfFail> {
        self.with_mut(|u| {
            // SAFETY: the list is an ngx_array_t of ngx_http_upstream_server_t in the
            // configuration pool; ngx_array_push returns room for one element or null.
            unsafe {
                if u.servers.is_null() {
                    u.servers =
                        ngx_array_create(cf.pool, 4, mem::size_of::<ngx_http_upstream_server_t>());
                    if u.servers.is_null() {
                        return Err(ConfFail::Logged);
                    }
                }
                let slot = ngx_array_push(u.servers) as *mut ngx_http_upstream_server_t;
                if slot.is_null() {
                    return Err(ConfFail::Logged);
                }
                slot.write(*server);
            }
            Ok(())
        })
    }

    /// Where the upstream was defined: `FILE`, `LINE` (empty for one without a file).
    pub fn file_line(self) -> (String, usize) {
        self.with(|u| {
            let file = if u.file_name.is_null() {
                String::new()
            } else {
                // SAFETY: file_name is nginx's NUL-terminated configuration file name.
                unsafe { CStr::from_ptr(u.file_name.cast()) }
                    .to_string_lossy()
                    .into_owned()
            };
            (file, u.line)
        })
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

    /// The server configuration of the HTTP module `m` (null for an implicit upstream or a
    /// module that is not an HTTP module).
    pub fn module_srv_conf(self, m: &ngx::ffi::ngx_module_t) -> *mut c_void {
        if m.type_ != NGX_HTTP_MODULE as usize {
            return ptr::null_mut();
        }
        self.with(|u| {
            if u.srv_conf.is_null() {
                return ptr::null_mut();
            }
            // SAFETY: `srv_conf` has one slot per HTTP module (nginx creates them all for every
            // upstream block), and m is an HTTP module of this configuration.
            unsafe { *u.srv_conf.add(m.ctx_index) }
        })
    }
}

/// The round-robin list in `peer.data` of the upstream `b` classified, when its balancer keeps
/// one there (round robin or least_conn, with or without keepalive: `b.live()` is set); in the
/// configuration pool until the zone exists, the zone's list after nginx's zone `init` ran.
pub fn rr_list(b: &Balancer) -> Option<Peers> {
    let up = b.upstream()?;
    b.live()?;
    // SAFETY: a `Balancer` is made only by `Probes::classify` (its fields are private to
    // probe.rs), which sets `live` only for the balancers whose `init_upstream` puts nginx's
    // round-robin list in peer.data (nginx's zone init re-points it at the zone's copy),
    // alive as long as the configuration.
    unsafe { Peers::from_ptr(up.peer_data().cast()) }
}

/// The upstream whose block is being parsed (inside `upstream {}`).
pub fn current(cf: &ngx_conf_t) -> Option<Upstream> {
    let u = NgxHttpUpstreamModule::server_conf_mut(cf)?;
    // SAFETY: inside `upstream {}` the upstream module's server slot is the block's upstream.
    unsafe { Upstream::from_ptr(u) }
}

/// Every upstream known so far (explicit blocks, singlets, implicit ones from `proxy_pass`), in
/// definition order.
pub fn all(cf: &ngx_conf_t) -> Vec<Upstream> {
    let Some(umcf) = NgxHttpUpstreamModule::main_conf(cf) else {
        return Vec::new();
    };
    let a = &umcf.upstreams;
    if a.nelts == 0 || a.elts.is_null() {
        return Vec::new();
    }
    // SAFETY: `upstreams` is nginx's array of upstream configuration pointers of this cycle.
    let list = unsafe {
        slice::from_raw_parts(a.elts as *const *mut ngx_http_upstream_srv_conf_t, a.nelts)
    };
    list.iter()
        // SAFETY: every entry is null or an upstream configuration of this cycle.
        .filter_map(|p| unsafe { Upstream::from_ptr(*p) })
        .collect()
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

/// A copy of `s` whose name is its address text when it has none (a server of an implicit
/// upstream).
pub fn named_server(s: &ngx_http_upstream_server_t) -> ngx_http_upstream_server_t {
    let mut copy = *s;
    if copy.name.len == 0 && !copy.addrs.is_null() && copy.naddrs > 0 {
        // SAFETY: addrs of a server entry of this cycle points at naddrs addresses.
        copy.name = unsafe { (*copy.addrs).name };
    }
    copy
}

/// The address text of a server as written in its `server` line (for a server of an implicit
/// upstream, which has none, the text of its first address).
pub fn server_name(s: &ngx_http_upstream_server_t) -> &'static [u8] {
    // SAFETY: name and addrs of a server entry of this cycle live in the configuration pool.
    unsafe {
        let n = bytes(&s.name);
        if n.is_empty() && !s.addrs.is_null() && s.naddrs > 0 {
            return bytes(&(*s.addrs).name);
        }
        n
    }
}

/// Registers a new explicit round-robin upstream `name`, as if `upstream NAME {}` appeared at the
/// current line: nginx's own checks apply (`duplicate upstream "NAME"` is logged by nginx). Every
/// HTTP module gets a fresh server configuration for it, like for an `upstream {}` block.
pub fn create(cf: &mut ngx_conf_t, name: &[u8]) -> Option<Upstream> {
    let host = cf.copy_str(name)?;
    // SAFETY: mirrors what nginx's `upstream` block handler does: ngx_url_t zeroed with the host
    // set, ngx_http_upstream_add with the CREATE flag, then one srv conf per HTTP module (each
    // module's create_srv_conf called with this configuration).
    unsafe {
        let mut url: ngx_url_t = mem::zeroed();
        url.host = host;
        url.set_no_resolve(1);
        url.set_no_port(1);
        let u = ngx_http_upstream_add(cf, &mut url, ROUND_ROBIN_FLAGS as _);
        if u.is_null() {
            return None;
        }
        let max = *ptr::addr_of!(ngx_http_max_module);
        let srv_conf =
            ngx_pcalloc(cf.pool, mem::size_of::<*mut c_void>() * max) as *mut *mut c_void;
        if srv_conf.is_null() {
            return None;
        }
        let cycle = cf.cycle;
        for i in 0..(*cycle).modules_n {
            let m = *(*cycle).modules.add(i);
            if m.is_null() || (*m).type_ != NGX_HTTP_MODULE as usize {
                continue;
            }
            let mctx = (*m).ctx as *const ngx_http_module_t;
            if let Some(create_srv_conf) = (*mctx).create_srv_conf {
                let c = create_srv_conf(cf);
                if c.is_null() {
                    return None;
                }
                *srv_conf.add((*m).ctx_index) = c;
            }
        }
        *srv_conf.add(NgxHttpUpstreamModule::module().ctx_index) = u.cast();
        (*u).srv_conf = srv_conf;
        (*u).servers = ngx_array_create(cf.pool, 4, mem::size_of::<ngx_http_upstream_server_t>());
        if (*u).servers.is_null() {
            return None;
        }
        Upstream::from_ptr(u)
    }
}

/// A wrapper of an upstream's `peer.init_upstream` (runs at the end of `http {}`).
pub trait InitUpstream {
    /// Initialises `u` (call the original through [`InitUpstreamFn::call`]).
    fn init(cf: &mut ngx_conf_t, u: Upstream) -> Status;
}

extern "C" fn init_upstream<I: InitUpstream>(
    cf: *mut ngx_conf_t,
    u: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls init_upstream at the end of http {} with the configuration and one of
    // its upstream configurations; nothing else refers to the configuration during the call.
    match unsafe { (cf.as_mut(), Upstream::from_ptr(u)) } {
        (Some(cf), Some(u)) => I::init(cf, u).0,
        _ => Status::NGX_ERROR.0,
    }
}

/// An upstream's `peer.init_upstream` as its balancer set it (None: round robin).
#[derive(Clone, Copy, Debug, Default)]
pub struct InitUpstreamFn(ngx_http_upstream_init_pt);

impl InitUpstreamFn {
    /// Runs it for `u`, the upstream it was read from, as nginx would have.
    pub fn call(self, cf: &mut ngx_conf_t, u: Upstream) -> Status {
        // SAFETY: the balancer's init_upstream (or nginx's round robin) expects exactly the
        // configuration being parsed and the upstream it belongs to.
        Status(unsafe {
            match self.0 {
                Some(init) => init(cf, u.as_ptr()),
                None => ngx_http_upstream_init_round_robin(cf, u.as_ptr()),
            }
        })
    }
}

/// A wrapper of an upstream's `peer.init` (runs when a request connects to the upstream).
pub trait PeerInit {
    /// Initialises the balancer of request `r` for upstream `us` (call the original through
    /// [`PeerInitFn::call`]).
    fn init(r: Req, us: Upstream) -> Status;
}

extern "C" fn peer_init<P: PeerInit>(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls peer.init with the live request being connected to upstream `us` (an
    // upstream of the request's configuration).
    match unsafe { (Req::from_ptr(r), Upstream::from_ptr(us)) } {
        (Some(r), Some(us)) => P::init(r, us).0,
        _ => Status::NGX_ERROR.0,
    }
}

/// An upstream's `peer.init` as its balancer set it.
#[derive(Clone, Copy, Debug)]
pub struct PeerInitFn(
    unsafe extern "C" fn(*mut ngx_http_request_t, *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t,
);

impl PeerInitFn {
    /// Runs it for request `r` and `us`, the upstream it was read from.
    #[inline]
    pub fn call(self, r: Req, us: Upstream) -> Status {
        // SAFETY: the balancer's peer.init takes a live request being connected to its
        // upstream, as nginx passed them to the wrapper.
        Status(unsafe { (self.0)(r.as_ptr(), us.as_ptr()) })
    }
}
