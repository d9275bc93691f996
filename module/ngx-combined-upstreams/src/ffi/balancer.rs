//! Per-request wrappers around an upstream's balancer: a feature's [`PeerWrapper`] installed by
//! [`wrap`] from its `peer.init` after the balancer's own `init` ran. The wrapper keeps the
//! balancer's callbacks and data in the request pool ([`Wrap`]) and installs its own in the
//! peer connection ([`PeerConn::take_over`]); the feature decides around `get` and after `free`
//! (`live/balancer.rs`). Safe code on `upstream/mod.rs`, which holds the peer connection's
//! primitives, the trampolines nginx calls (`get`/`free`/`set_session`/`save_session`/
//! `notify`, forwarding to the balancer's own) and the calls of the balancer's functions
//! ([`Wrap::balancer_get`], [`Wrap::record_try`]).
//!
//! Handles: [`Wrap`] (the wrapper's state in the request pool, copied in and out) and
//! [`PeerConn`] (the request's peer connection, `r->upstream->peer`); neither holds a
//! reference across a call into nginx (the balancer's own functions write the same peer
//! connection). The addresses of the request's tries are kept in the request pool
//! ([`Wrap::record_try`], [`Wrap::with_tried`]), and the peer's name and address nginx keeps
//! after `free` are copies there, so a peer can go while nginx still shows its address.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_event_free_peer_pt, ngx_event_get_peer_pt, ngx_event_notify_peer_pt,
    ngx_event_save_peer_session_pt, ngx_event_set_peer_session_pt, ngx_uint_t,
};

use super::pool::PoolCell;
use super::request::Req;
use super::upstream::{
    free_peer, get_peer, notify_peer, save_session_peer, set_session_peer, NotifyFn, PeerInitFn,
    Tried, Upstream,
};
use super::Status;

pub use super::upstream::{PeerConn, TriedAddrs};

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
pub(in crate::ffi) struct WrapCtx<S: Copy> {
    state: S,
    pub(in crate::ffi) r: Req,
    us: Upstream,
    orig_init: PeerInitFn,
    /// The addresses of the tries made so far (newest first; request pool).
    pub(in crate::ffi) tried: Option<NonNull<Tried>>,
    pub(in crate::ffi) get: ngx_event_get_peer_pt,
    pub(in crate::ffi) free: ngx_event_free_peer_pt,
    pub(in crate::ffi) set_session: ngx_event_set_peer_session_pt,
    pub(in crate::ffi) save_session: ngx_event_save_peer_session_pt,
    /// The balancer's `notify` (nginx calls it with `peer.data`, which is the wrapper's).
    pub(in crate::ffi) notify: ngx_event_notify_peer_pt,
    pub(in crate::ffi) data: *mut c_void,
}

impl<S: Copy> Clone for WrapCtx<S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: Copy> Copy for WrapCtx<S> {}

/// The wrapper's state of one request: made by [`wrap`], installed as the peer connection's
/// `data`.
pub struct Wrap<W: PeerWrapper>(pub(in crate::ffi) PoolCell<WrapCtx<W::State>>);

impl<W: PeerWrapper> Clone for Wrap<W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W: PeerWrapper> Copy for Wrap<W> {}

impl<W: PeerWrapper> Wrap<W> {
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

impl PeerConn {
    /// The tries the request has left.
    pub fn tries(self) -> ngx_uint_t {
        self.with(|pc| pc.tries)
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
