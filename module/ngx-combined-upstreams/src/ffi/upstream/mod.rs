//! nginx's upstream structures (`ngx_http_upstream_module`'s): an upstream configuration
//! ([`Upstream`]) for the directives that work inside `upstream {}`, the upstrand family and the
//! live API; the trampolines of its `init_upstream` / `peer.init` wrappers ([`InitUpstream`],
//! [`PeerInit`]) and the calls of the originals; and per request the peer connection
//! ([`PeerConn`], `r->upstream->peer`) with the balancer wrapper's trampolines
//! (`get`/`free`/`set_session`/`save_session`/`notify`, forwarding to the balancer's own
//! functions) on which `balancer.rs` is safe code. `list.rs` is safe code on [`Upstream`]'s
//! primitives here (plain fields, the upstream list, server flags).
//!
//! [`Upstream`] is the fence: a handle on one `ngx_http_upstream_srv_conf_t` of the
//! configuration being parsed, made only from nginx's own upstream list (or from nginx's call of
//! a hook), whose safe methods each touch the structure briefly and hold no reference to it.

mod list;

use core::ffi::{c_void, CStr};
use core::marker::PhantomData;
use core::ptr::NonNull;
use core::{mem, ptr, slice};

use ngx::ffi::{
    ngx_array_create, ngx_array_push, ngx_conf_t, ngx_http_request_t, ngx_http_upstream_init_pt,
    ngx_http_upstream_init_round_robin, ngx_http_upstream_server_t, ngx_http_upstream_srv_conf_t,
    ngx_int_t, ngx_peer_connection_t, ngx_uint_t, sockaddr, NGX_HTTP_MODULE,
};
use ngx::http::{HttpModuleMainConf, HttpModuleServerConf, NgxHttpUpstreamModule};

use super::balancer::{PeerWrapper, Wrap, WrapCtx};
use super::log::log_str;
use super::peers::{Peer, Peers};
use super::pool::{alloc, copy_str, PoolCell};
use super::probe::Balancer;
use super::request::Req;
use super::{bytes, ConfFail, Status};

pub use super::conf::create;
pub use list::{find, flags_of, handle_directive, infos, set_flags, InitUpstream, PeerInit};

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

// ---- a request's peer connection and the balancer wrapper's trampolines --------------------

/// The address of one try (a chain in the request pool).
#[derive(Clone, Copy)]
pub(in crate::ffi) struct Tried {
    /// The copy of the peer's `sockaddr` the peer connection got (request pool).
    sockaddr: *const u8,
    socklen: usize,
    next: Option<NonNull<Tried>>,
}

/// The socket addresses of a request's tries, newest first ([`Wrap::with_tried`]).
#[derive(Clone, Copy)]
pub struct TriedAddrs<'a>(
    pub(in crate::ffi) Option<NonNull<Tried>>,
    pub(in crate::ffi) PhantomData<&'a [u8]>,
);

impl<'a> Iterator for TriedAddrs<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        // SAFETY: the chain and the copies it points at are in the pool of the request whose
        // callback runs (`with_tried` bounds 'a by the call).
        let t = unsafe { self.0?.as_ptr().read() };
        self.0 = t.next;
        // SAFETY: as above; each copy holds `socklen` bytes.
        Some(unsafe { slice::from_raw_parts(t.sockaddr, t.socklen) })
    }
}

impl<W: PeerWrapper> Wrap<W> {
    /// # Safety
    /// `data` is null or the `data` nginx passes to a peer callback that
    /// [`super::balancer::wrap::<W>`] installed (a `WrapCtx` in the pool of a request alive for
    /// the call).
    unsafe fn from_ptr(data: *mut c_void) -> Option<Wrap<W>> {
        let p = NonNull::new(data.cast::<WrapCtx<W::State>>())?;
        // SAFETY: guaranteed by the caller.
        Some(Wrap(unsafe { PoolCell::from_raw(p) }))
    }

    /// The balancer's `get`, with its own data.
    #[inline]
    pub fn balancer_get(self, pc: PeerConn) -> Status {
        let c = self.0.get();
        let Some(get) = c.get else {
            return Status::NGX_ERROR;
        };
        // SAFETY: the balancer's own get, with the request's peer connection and its data.
        Status(unsafe { get(pc.as_ptr(), c.data) })
    }

    /// After a successful `get`: points the peer connection's `name` and `sockaddr` at copies
    /// in the request pool and records the try's address; false when out of memory.
    pub fn record_try(self, pc: PeerConn) -> bool {
        let c = self.0.get();
        let pool = c.r.pool();
        let (name, sa, socklen) = pc.with(|p| (p.name, p.sockaddr, p.socklen));
        // SAFETY: name and sockaddr were just set by the balancer from a peer it holds (conns
        // counted), so they are valid to copy now.
        if let Some(name) = unsafe { name.as_ref() } {
            // SAFETY: as above.
            let Some(copy) = copy_str(&pool, unsafe { bytes(name) }) else {
                return false;
            };
            let Some(s) = alloc(&pool, copy) else {
                return false;
            };
            pc.with(|p| p.name = s.as_ptr());
        }
        if !sa.is_null() && socklen > 0 {
            let len = socklen as usize;
            let p = pool.alloc(len.max(mem::size_of::<sockaddr>())).cast::<u8>();
            if p.is_null() {
                return false;
            }
            // SAFETY: p has room for len bytes; sa holds len bytes (see above).
            unsafe { ptr::copy_nonoverlapping(sa.cast::<u8>(), p, len) };
            pc.with(|pc| pc.sockaddr = p.cast());
        }
        let (sa, len) = pc.with(|p| (p.sockaddr, p.socklen));
        if !sa.is_null() {
            let t = Tried {
                sockaddr: sa.cast::<u8>().cast_const(),
                socklen: len as usize,
                next: c.tried,
            };
            let Some(t) = alloc(&pool, t) else {
                return false;
            };
            self.0.update(|c| c.tried = Some(t));
        }
        true
    }
}

/// The request's peer connection (`r->upstream->peer`).
#[derive(Clone, Copy)]
pub struct PeerConn(NonNull<ngx_peer_connection_t>);

impl PeerConn {
    /// # Safety
    /// `pc` is null or the peer connection of a request's upstream that is alive for as long as
    /// the handle is used (nginx's argument to a peer callback, or `&r->upstream->peer`).
    pub(in crate::ffi) unsafe fn from_ptr(pc: *mut ngx_peer_connection_t) -> Option<PeerConn> {
        NonNull::new(pc).map(PeerConn)
    }

    fn as_ptr(self) -> *mut ngx_peer_connection_t {
        self.0.as_ptr()
    }

    /// Runs `f` on the peer connection; `f` calls no nginx code.
    pub(in crate::ffi) fn with<T>(self, f: impl FnOnce(&mut ngx_peer_connection_t) -> T) -> T {
        // SAFETY: see `from_ptr`; nginx is single-threaded and no other reference to the peer
        // connection is used while `f` runs.
        f(unsafe { &mut *self.as_ptr() })
    }

    /// The peer the balancer chose, right after a successful `get` (before
    /// [`Wrap::record_try`] points `name` at a copy): only for balancers that keep a zone's
    /// round-robin list (round robin, least_conn, with or without keepalive), which point
    /// `pc->name` at the chosen peer's `name` (checked against `pc->sockaddr`).
    pub fn chosen_rr_peer(self) -> Option<Peer> {
        let (name, sa) = self.with(|p| (p.name, p.sockaddr));
        // SAFETY: called by the live wrapper, installed only on those balancers, right after
        // their successful `get` (see `Peer::chosen`).
        unsafe { Peer::chosen(name, sa) }
    }

    /// Logs `msg` at `level` on the peer connection's log (the request's).
    pub fn log(self, level: u32, msg: &str) {
        let log = self.with(|pc| pc.log);
        // SAFETY: the peer connection's log is the request's, live during its callbacks.
        if let Some(log) = unsafe { log.as_ref() } {
            log_str(log, level, msg);
        }
    }
}

pub(in crate::ffi) extern "C" fn get_peer<W: PeerWrapper>(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
) -> ngx_int_t {
    // SAFETY: nginx calls `get` with the request's peer connection and the data `wrap`
    // installed with it.
    match unsafe { (Wrap::<W>::from_ptr(data), PeerConn::from_ptr(pc)) } {
        (Some(w), Some(pc)) => W::get(w, pc).0,
        _ => Status::NGX_ERROR.0,
    }
}

pub(in crate::ffi) extern "C" fn free_peer<W: PeerWrapper>(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
    state: ngx_uint_t,
) {
    // SAFETY: as in get_peer.
    let (Some(w), Some(pc)) = (unsafe { (Wrap::<W>::from_ptr(data), PeerConn::from_ptr(pc)) })
    else {
        return;
    };
    W::before_free(w, pc, state);
    let c = w.0.get();
    if let Some(free) = c.free {
        // SAFETY: the balancer's own free, with the data its get used.
        unsafe { free(pc.as_ptr(), c.data, state) };
    }
    W::after_free(w, pc);
}

pub(in crate::ffi) extern "C" fn set_session_peer<W: PeerWrapper>(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
) -> ngx_int_t {
    // SAFETY: as in get_peer.
    let Some(w) = (unsafe { Wrap::<W>::from_ptr(data) }) else {
        return Status::NGX_ERROR.0;
    };
    let c = w.0.get();
    match c.set_session {
        // SAFETY: the balancer's own set_session, with nginx's peer connection and its data.
        Some(f) => unsafe { f(pc, c.data) },
        None => Status::NGX_OK.0,
    }
}

pub(in crate::ffi) extern "C" fn save_session_peer<W: PeerWrapper>(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
) {
    // SAFETY: as in get_peer.
    let Some(w) = (unsafe { Wrap::<W>::from_ptr(data) }) else {
        return;
    };
    let c = w.0.get();
    if let Some(f) = c.save_session {
        // SAFETY: the balancer's own save_session, with nginx's peer connection and its data.
        unsafe { f(pc, c.data) };
    }
}

/// The type of a peer connection's `notify`.
pub(in crate::ffi) type NotifyFn =
    unsafe extern "C" fn(*mut ngx_peer_connection_t, *mut c_void, ngx_uint_t);

pub(in crate::ffi) extern "C" fn notify_peer<W: PeerWrapper>(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
    type_: ngx_uint_t,
) {
    // SAFETY: as in get_peer.
    let Some(w) = (unsafe { Wrap::<W>::from_ptr(data) }) else {
        return;
    };
    let c = w.0.get();
    if let Some(f) = c.notify {
        // SAFETY: the balancer's own notify, with nginx's peer connection, its data and type.
        unsafe { f(pc, c.data, type_) };
    }
}
