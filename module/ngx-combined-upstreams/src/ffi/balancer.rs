//! Per-request wrappers around an upstream's balancer: a feature's [`PeerWrapper`] installed by
//! [`wrap`] from its `peer.init` after the balancer's own `init` ran. The trampolines here take
//! nginx's `get`/`free`/`set_session`/`save_session`/`notify` calls, keep the balancer's
//! callbacks and data in the request pool ([`Wrap`]) and forward to them; the feature decides
//! around `get` and after `free` (`live/balancer.rs`).
//!
//! Handles: [`Wrap`] (the wrapper's state in the request pool, copied in and out) and
//! [`PeerConn`] (the request's peer connection, `r->upstream->peer`); neither holds a
//! reference across a call into nginx (the balancer's own functions write the same peer
//! connection). The addresses of the request's tries are kept in the request pool
//! ([`Wrap::record_try`], [`Wrap::with_tried`]), and the peer's name and address nginx keeps
//! after `free` are copies there, so a peer can go while nginx still shows its address.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::mem::size_of;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_event_free_peer_pt, ngx_event_get_peer_pt, ngx_event_notify_peer_pt,
    ngx_event_save_peer_session_pt, ngx_event_set_peer_session_pt, ngx_int_t,
    ngx_peer_connection_t, ngx_uint_t, sockaddr,
};

use super::log::log_str;
use super::peers::Peer;
use super::pool::{alloc, copy_str, PoolCell};
use super::request::Req;
use super::upstream::{PeerInitFn, Upstream};
use super::{bytes, Status};

/// A feature's wrapper of a balancer.
pub trait PeerWrapper: 'static {
    /// The feature's per-request state (plain data, in the request pool).
    type State: Copy;
    /// nginx asks for a peer: choose with [`Wrap::balancer_get`] (or refuse).
    fn get(w: Wrap<Self>, pc: PeerConn) -> Status
    where
        Self: Sized;
    /// Before the balancer's `free` of a try runs (the try still holds its peer), with nginx's
    /// `state` bits (`NGX_PEER_FAILED`, `NGX_PEER_NEXT`).
    fn before_free(w: Wrap<Self>, pc: PeerConn, state: ngx_uint_t)
    where
        Self: Sized;
    /// After the balancer's `free` of a try ran.
    fn after_free(w: Wrap<Self>, pc: PeerConn)
    where
        Self: Sized;
}

/// The wrapper's state of one request (request pool; plain data).
struct WrapCtx<S: Copy> {
    state: S,
    r: Req,
    us: Upstream,
    orig_init: PeerInitFn,
    /// The addresses of the tries made so far (newest first; request pool).
    tried: Option<NonNull<Tried>>,
    get: ngx_event_get_peer_pt,
    free: ngx_event_free_peer_pt,
    set_session: ngx_event_set_peer_session_pt,
    save_session: ngx_event_save_peer_session_pt,
    /// The balancer's `notify` (nginx calls it with `peer.data`, which is the wrapper's).
    notify: ngx_event_notify_peer_pt,
    data: *mut c_void,
}

impl<S: Copy> Clone for WrapCtx<S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: Copy> Copy for WrapCtx<S> {}

/// The address of one try (a chain in the request pool).
#[derive(Clone, Copy)]
struct Tried {
    /// The copy of the peer's `sockaddr` the peer connection got (request pool).
    sockaddr: *const u8,
    socklen: usize,
    next: Option<NonNull<Tried>>,
}

/// The socket addresses of a request's tries, newest first ([`Wrap::with_tried`]).
#[derive(Clone, Copy)]
pub struct TriedAddrs<'a>(Option<NonNull<Tried>>, PhantomData<&'a [u8]>);

impl<'a> Iterator for TriedAddrs<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        // SAFETY: the chain and the copies it points at are in the pool of the request whose
        // callback runs (`with_tried` bounds 'a by the call).
        let t = unsafe { self.0?.as_ptr().read() };
        self.0 = t.next;
        // SAFETY: as above; each copy holds `socklen` bytes.
        Some(unsafe { core::slice::from_raw_parts(t.sockaddr, t.socklen) })
    }
}

/// The wrapper's state of one request: made by [`wrap`], installed as the peer connection's
/// `data`.
pub struct Wrap<W: PeerWrapper>(PoolCell<WrapCtx<W::State>>);

impl<W: PeerWrapper> Clone for Wrap<W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W: PeerWrapper> Copy for Wrap<W> {}

impl<W: PeerWrapper> Wrap<W> {
    /// # Safety
    /// `data` is null or the `data` nginx passes to a peer callback that [`wrap::<W>`]
    /// installed (a `WrapCtx` in the pool of a request alive for the call).
    unsafe fn from_ptr(data: *mut c_void) -> Option<Wrap<W>> {
        let p = NonNull::new(data.cast::<WrapCtx<W::State>>())?;
        // SAFETY: guaranteed by the caller.
        Some(Wrap(unsafe { PoolCell::from_raw(p) }))
    }

    /// A copy of the feature's state.
    #[inline]
    pub fn state(self) -> W::State {
        self.0.get().state
    }

    /// Changes the feature's state.
    #[inline]
    pub fn update_state(self, f: impl FnOnce(&mut W::State)) {
        self.0.update(|c| f(&mut c.state));
    }

    /// Runs the balancer's `init` again (fresh per-request data, e.g. after its peer set
    /// changed) and takes its callbacks over again.
    pub fn reinit(self, pc: PeerConn) -> Status {
        let c = self.0.get();
        pc.with(|p| p.data = ptr::null_mut());
        let rc = c.orig_init.call(c.r, c.us);
        if rc != Status::NGX_OK {
            return rc;
        }
        pc.take_over(self);
        Status::NGX_OK
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
            let p = pool.alloc(len.max(size_of::<sockaddr>())).cast::<u8>();
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

    /// The request.
    pub fn request(self) -> Req {
        self.0.get().r
    }

    /// The upstream the request is connected to.
    pub fn upstream(self) -> Upstream {
        self.0.get().us
    }

    /// Runs `f` with the socket addresses of the request's tries so far (newest first).
    pub fn with_tried<R>(self, f: impl for<'a> FnOnce(TriedAddrs<'a>) -> R) -> R {
        f(TriedAddrs(self.0.get().tried, PhantomData))
    }
}

/// The request's peer connection (`r->upstream->peer`).
#[derive(Clone, Copy)]
pub struct PeerConn(NonNull<ngx_peer_connection_t>);

impl PeerConn {
    /// # Safety
    /// `pc` is null or the peer connection of a request's upstream that is alive for as long as
    /// the handle is used (nginx's argument to a peer callback, or `&r->upstream->peer`).
    unsafe fn from_ptr(pc: *mut ngx_peer_connection_t) -> Option<PeerConn> {
        NonNull::new(pc).map(PeerConn)
    }

    fn as_ptr(self) -> *mut ngx_peer_connection_t {
        self.0.as_ptr()
    }

    /// Runs `f` on the peer connection; `f` calls no nginx code.
    fn with<T>(self, f: impl FnOnce(&mut ngx_peer_connection_t) -> T) -> T {
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

    /// The tries the request has left.
    pub fn tries(self) -> ngx_uint_t {
        self.with(|pc| pc.tries)
    }

    /// Logs `msg` at `level` on the peer connection's log (the request's).
    pub fn log(self, level: u32, msg: &str) {
        let log = self.with(|pc| pc.log);
        // SAFETY: the peer connection's log is the request's, live during its callbacks.
        if let Some(log) = unsafe { log.as_ref() } {
            log_str(log, level, msg);
        }
    }

    /// Sets the tries the request has left.
    pub fn set_tries(self, n: ngx_uint_t) {
        self.with(|pc| pc.tries = n);
    }

    /// Saves the balancer's callbacks and data into `w` and installs the wrapper's.
    fn take_over<W: PeerWrapper>(self, w: Wrap<W>) {
        let (get, free, set_session, save_session, notify, data) = self.with(|pc| {
            (
                pc.get,
                pc.free,
                pc.set_session,
                pc.save_session,
                pc.notify,
                pc.data,
            )
        });
        // A balancer `init` run again keeps a `notify` it does not set: still the wrapper's.
        let ours = notify.is_some_and(|f| ptr::fn_addr_eq(f, notify_peer::<W> as NotifyFn));
        w.0.update(|c| {
            c.get = get;
            c.free = free;
            c.set_session = set_session;
            c.save_session = save_session;
            if !ours {
                c.notify = notify;
            }
            c.data = data;
        });
        self.with(|pc| {
            pc.get = Some(get_peer::<W>);
            pc.free = Some(free_peer::<W>);
            if set_session.is_some() {
                pc.set_session = Some(set_session_peer::<W>);
            }
            if save_session.is_some() {
                pc.save_session = Some(save_session_peer::<W>);
            }
            if notify.is_some() {
                pc.notify = Some(notify_peer::<W>);
            }
            pc.data = w.0.as_ptr().cast();
        });
    }
}

impl Req {
    /// `proxy_next_upstream_tries` (and the like) of the request's upstream (0: no limit, or
    /// no upstream).
    pub fn next_upstream_tries(self) -> ngx_uint_t {
        self.get(|r| {
            // SAFETY: r->upstream is null or the request's live upstream, whose conf is null or
            // its location's configuration.
            unsafe { r.upstream.as_ref().and_then(|u| u.conf.as_ref()) }
                .map_or(0, |conf| conf.next_upstream_tries)
        })
    }

    /// The request's peer connection (None without an upstream).
    fn peer_conn(self) -> Option<PeerConn> {
        self.get(|r| {
            let u = r.upstream;
            if u.is_null() {
                return None;
            }
            // SAFETY: r->upstream is the request's live upstream; no reference is made.
            unsafe { PeerConn::from_ptr(ptr::addr_of_mut!((*u).peer)) }
        })
    }
}

/// Installs `W` around the balancer on `r`'s peer connection, just after the balancer's
/// `init` (`orig_init`, which [`Wrap::reinit`] runs again) ran for `r` and `us`.
pub fn wrap<W: PeerWrapper>(
    r: Req,
    us: Upstream,
    orig_init: PeerInitFn,
    state: W::State,
) -> Status {
    let Some(pc) = r.peer_conn() else {
        return Status::NGX_ERROR;
    };
    let ctx = WrapCtx {
        state,
        r,
        us,
        orig_init,
        tried: None,
        get: None,
        free: None,
        set_session: None,
        save_session: None,
        notify: None,
        data: ptr::null_mut(),
    };
    let Some(cell) = r.alloc_cell(ctx) else {
        return Status::NGX_ERROR;
    };
    pc.take_over(Wrap::<W>(cell));
    Status::NGX_OK
}

extern "C" fn get_peer<W: PeerWrapper>(
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

extern "C" fn free_peer<W: PeerWrapper>(
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

extern "C" fn set_session_peer<W: PeerWrapper>(
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

extern "C" fn save_session_peer<W: PeerWrapper>(pc: *mut ngx_peer_connection_t, data: *mut c_void) {
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

type NotifyFn = unsafe extern "C" fn(*mut ngx_peer_connection_t, *mut c_void, ngx_uint_t);

extern "C" fn notify_peer<W: PeerWrapper>(
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
