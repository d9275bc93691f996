//! The per-request wrappers around the upstream's balancer (round robin or least_conn, with or
//! without keepalive on top): `peer.init` is replaced at configuration time for every upstream
//! the API can change; at request time the wrapper installs its own `get`/`free`/
//! `set_session`/`save_session` around the balancer's.
//!
//! What they guarantee:
//! - the balancer's per-request data (the round-robin `tried` bitmap, sized by the peer count
//!   when `init` ran) always matches the set it selects from: `init` and every `get` run with
//!   the zone's gate read-held, and a `get` that finds the generation changed since the
//!   request's `init` runs the balancer's `init` again before selecting; the request then has
//!   the tries a new request gets in the new set less the tries it already made to servers of
//!   the new set (by address: every try's address is kept in the request pool), within what
//!   `proxy_next_upstream_tries` still allows (`tries_in_new_set`). Its total tries stay bounded
//!   however many sets follow each other (the same servers with other weights give nothing
//!   back); servers it already tried may be tried again in the new set (the balancer's tried
//!   bitmap is new), within that count; with none left it ends (`NGX_BUSY`: 502);
//! - the peer's name and address that nginx keeps after `free` (`u->peer.name` for
//!   `$upstream_addr` and error log lines, `u->peer.sockaddr`) are copies in the request pool, so
//!   a retired peer can be freed as soon as its last connection ends;
//! - a request whose tries ran out in a `free` while the set changed (also because nginx's
//!   `free` ends every retry on reading the new list's `single` flag) continues in the new set
//!   by the same rule;
//! - a `free` frees retired peers that became idle (at most once per `SWEEP_EVERY_MS` per
//!   upstream over all workers, so a long connection to a removed server does not make every
//!   request take the list write locks).
//!
//! The fence: the callbacks are safe `extern "C" fn`s whose first step turns nginx's pointers
//! into handles ([`Ctx`] on the wrapper's state, [`Pc`] on the request's peer connection); the
//! handles' methods copy values in and out and hold no reference across a call into nginx (the
//! balancer's own functions write the same peer connection). Calls of the balancer's functions
//! are `unsafe` blocks at the call, forwarding nginx's arguments.

use core::ffi::c_void;
use core::mem::size_of;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_event_free_peer_pt, ngx_event_get_peer_pt, ngx_event_notify_peer_pt,
    ngx_event_save_peer_session_pt, ngx_event_set_peer_session_pt, ngx_http_request_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_palloc, ngx_peer_connection_t, ngx_pool_t,
    ngx_uint_t, sockaddr, NGX_BUSY, NGX_DONE, NGX_LOG_WARN,
};

use upstrand_core::live::plan::tries_in_new_set;
use upstrand_core::live::render::overdue_retired_line;

use super::zone::LiveUpstream;
use super::InitPeer;
use crate::ffi::log::log_str;
use crate::ffi::pool::{pool_copy, pool_new};
use crate::ffi::{NGX_ERROR, NGX_OK};

/// Per-request state of the wrapper (request pool; plain data).
#[derive(Clone, Copy)]
struct PeerCtx {
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
    live: LiveUpstream,
    orig_init: InitPeer,
    generation: u64,
    /// `proxy_next_upstream_tries` (and the like) of the request's upstream (0: no limit).
    cap: ngx_uint_t,
    /// Tries ended so far (calls of `free`).
    made: ngx_uint_t,
    /// The addresses of the tries made so far (newest first; request pool).
    tried: *mut Tried,
    get: ngx_event_get_peer_pt,
    free: ngx_event_free_peer_pt,
    set_session: ngx_event_set_peer_session_pt,
    save_session: ngx_event_save_peer_session_pt,
    /// The balancer's `notify` (nginx calls it with `peer.data`, which is the wrapper's).
    notify: ngx_event_notify_peer_pt,
    data: *mut c_void,
}

/// The address of one try (a chain in the request pool).
#[derive(Clone, Copy)]
struct Tried {
    /// The copy of the peer's `sockaddr` the peer connection got (request pool).
    sockaddr: *const u8,
    socklen: usize,
    next: *mut Tried,
}

/// The socket addresses of the chain of tries starting at `head`.
///
/// # Safety
/// `head` is null or a chain of [`Tried`] in the pool of a request that is alive while the
/// iterator is used.
unsafe fn tried_addrs<'a>(head: *mut Tried) -> impl Iterator<Item = &'a [u8]> + Clone {
    TriedIter(head).map(|t| {
        // SAFETY: see above; each copy holds `socklen` bytes.
        unsafe { core::slice::from_raw_parts(t.sockaddr, t.socklen) }
    })
}

/// Walks a chain of [`Tried`] (see [`tried_addrs`]).
#[derive(Clone, Copy)]
struct TriedIter(*mut Tried);

impl Iterator for TriedIter {
    type Item = Tried;
    fn next(&mut self) -> Option<Tried> {
        // SAFETY: the chain is live (see `tried_addrs`).
        let t = unsafe { self.0.as_ref() }.copied()?;
        self.0 = t.next;
        Some(t)
    }
}

/// The wrapper's state of one request: a [`PeerCtx`] in the request pool, installed as the peer
/// connection's `data` by [`init_peer`].
#[derive(Clone, Copy)]
struct Ctx(NonNull<PeerCtx>);

impl Ctx {
    /// # Safety
    /// `data` is null or the `data` nginx passes to a peer callback this wrapper installed (a
    /// `PeerCtx` in the pool of a request that is alive for the call).
    unsafe fn from_ptr(data: *mut c_void) -> Option<Ctx> {
        NonNull::new(data.cast::<PeerCtx>()).map(Ctx)
    }

    /// A copy of the state.
    fn get(self) -> PeerCtx {
        // SAFETY: see `from_ptr`; plain data, copied out.
        unsafe { self.0.as_ptr().read() }
    }

    /// Changes the state through `f`, which calls no nginx code.
    fn update(self, f: impl FnOnce(&mut PeerCtx)) {
        // SAFETY: see `from_ptr`; nginx is single-threaded and nothing else refers to the state
        // while `f` runs.
        f(unsafe { &mut *self.0.as_ptr() });
    }
}

/// The request's peer connection (`r->upstream->peer`).
#[derive(Clone, Copy)]
struct Pc(NonNull<ngx_peer_connection_t>);

impl Pc {
    /// # Safety
    /// `pc` is null or the peer connection of a request's upstream that is alive for as long as
    /// the handle is used (nginx's argument to a peer callback, or `&r->upstream->peer`).
    unsafe fn from_ptr(pc: *mut ngx_peer_connection_t) -> Option<Pc> {
        NonNull::new(pc).map(Pc)
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

    fn tries(self) -> ngx_uint_t {
        self.with(|pc| pc.tries)
    }

    fn set_tries(self, n: ngx_uint_t) {
        self.with(|pc| pc.tries = n);
    }

    /// Saves the balancer's callbacks and data into `ctx` and installs the wrapper's.
    fn take_over(self, ctx: Ctx) {
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
        let ours = notify.is_some_and(|f| ptr::fn_addr_eq(f, notify_peer as NotifyFn));
        ctx.update(|c| {
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
            pc.get = Some(get_peer);
            pc.free = Some(free_peer);
            if set_session.is_some() {
                pc.set_session = Some(set_session_peer);
            }
            if save_session.is_some() {
                pc.save_session = Some(save_session_peer);
            }
            if notify.is_some() {
                pc.notify = Some(notify_peer);
            }
            pc.data = ctx.0.as_ptr().cast();
        });
    }

    /// Points `name` and `sockaddr` at copies in the request pool `pool` (just after the
    /// balancer filled them from a peer it holds).
    fn detach_name(self, pool: *mut ngx_pool_t) -> bool {
        let (name, sa, socklen) = self.with(|pc| (pc.name, pc.sockaddr, pc.socklen));
        // SAFETY: pool is the request's live pool; name and sockaddr were just set by the
        // balancer from a peer it holds (conns counted), so they are valid to copy now.
        unsafe {
            if !name.is_null() {
                let Some(copy) = pool_copy(pool, crate::ffi::bytes(&*name)) else {
                    return false;
                };
                let Some(s) = pool_new(pool, copy) else {
                    return false;
                };
                self.with(|pc| pc.name = s);
            }
            if !sa.is_null() && socklen > 0 {
                let len = socklen as usize;
                let p = ngx_palloc(pool, len.max(size_of::<sockaddr>())).cast::<u8>();
                if p.is_null() {
                    return false;
                }
                ptr::copy_nonoverlapping(sa.cast::<u8>(), p, len);
                self.with(|pc| pc.sockaddr = p.cast());
            }
        }
        true
    }
}

/// The `peer.init` installed for live upstreams.
pub extern "C" fn init_peer(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    let Some((orig, live)) = super::lookup_peer_init(us) else {
        return NGX_ERROR;
    };
    let Some(live) = live else {
        // SAFETY: the balancer's own init, with nginx's arguments.
        return unsafe { orig(r, us) };
    };
    let gate = live.state().gate_read();
    let generation = live.state().generation();
    // SAFETY: as above.
    let rc = unsafe { orig(r, us) };
    drop(gate);
    if rc != NGX_OK {
        return rc;
    }
    // SAFETY: nginx calls peer.init with a live request whose upstream is set; no reference is
    // made.
    let (pool, pc, cap) = unsafe {
        let u = (*r).upstream;
        if u.is_null() {
            return NGX_ERROR;
        }
        let conf = (*u).conf;
        let cap = if conf.is_null() {
            0
        } else {
            (*conf).next_upstream_tries
        };
        ((*r).pool, Pc::from_ptr(ptr::addr_of_mut!((*u).peer)), cap)
    };
    let Some(pc) = pc else {
        return NGX_ERROR;
    };
    let ctx = PeerCtx {
        r,
        us,
        live,
        orig_init: orig,
        generation,
        cap,
        made: 0,
        tried: ptr::null_mut(),
        get: None,
        free: None,
        set_session: None,
        save_session: None,
        notify: None,
        data: ptr::null_mut(),
    };
    // SAFETY: the request's pool is live.
    let Some(ctx) = (unsafe { pool_new(pool, ctx) }).and_then(NonNull::new) else {
        return NGX_ERROR;
    };
    pc.take_over(Ctx(ctx));
    NGX_OK
}

extern "C" fn get_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx calls `get` with the request's peer connection and the data init_peer
    // installed with it.
    let (Some(ctx), Some(pc)) = (unsafe { (Ctx::from_ptr(data), Pc::from_ptr(pc)) }) else {
        return NGX_ERROR;
    };
    let c = ctx.get();
    // The gate is read-held from the generation check through the selection.
    let gate = c.live.state().gate_read();
    let now = c.live.state().generation();
    if now != c.generation {
        // The set changed since this request's balancer data was made: make it again.
        pc.with(|p| p.data = ptr::null_mut());
        // SAFETY: the balancer's own init, with the request and upstream nginx gave init_peer
        // (alive while the request's balancer callbacks run).
        if unsafe { (c.orig_init)(c.r, c.us) } != NGX_OK {
            return NGX_ERROR;
        }
        // The balancer's init gave the tries of a new request in the new set.
        let fresh = pc.tries();
        pc.take_over(ctx);
        // SAFETY: the chain is in the live request's pool.
        let here = c.live.tried_here(unsafe { tried_addrs(c.tried) });
        let left = tries_in_new_set(fresh, here, c.cap, c.made);
        pc.set_tries(left);
        ctx.update(|c| c.generation = now);
        c.live.state().count_rebalanced();
        if left == 0 {
            // Nothing left to try in this set: the request ends as with no live server.
            return NGX_BUSY as ngx_int_t;
        }
    }
    let c = ctx.get();
    let Some(get) = c.get else {
        return NGX_ERROR;
    };
    // SAFETY: the balancer's own get, with its own data.
    let rc = unsafe { get(pc.as_ptr(), c.data) };
    drop(gate);
    if rc == NGX_OK || rc == NGX_DONE as ngx_int_t {
        // SAFETY: c.r is the live request (see above).
        let pool = unsafe { (*c.r).pool };
        if !pc.detach_name(pool) {
            return NGX_ERROR;
        }
        let (sa, len) = pc.with(|p| (p.sockaddr, p.socklen));
        if !sa.is_null() {
            let t = Tried {
                sockaddr: sa.cast::<u8>().cast_const(),
                socklen: len as usize,
                next: c.tried,
            };
            // SAFETY: the request's pool is live.
            let Some(t) = (unsafe { pool_new(pool, t) }) else {
                return NGX_ERROR;
            };
            ctx.update(|c| c.tried = t);
        }
    }
    rc
}

extern "C" fn free_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void, state: ngx_uint_t) {
    // SAFETY: as in get_peer.
    let (Some(ctx), Some(pc)) = (unsafe { (Ctx::from_ptr(data), Pc::from_ptr(pc)) }) else {
        return;
    };
    let c = ctx.get();
    if let Some(free) = c.free {
        // SAFETY: the balancer's own free, with the data its get used.
        unsafe { free(pc.as_ptr(), c.data, state) };
    }
    ctx.update(|c| c.made += 1);
    // A request whose tries ran out (nginx's round-robin `free` also ends every retry when the
    // list is `single` now) while the set changed since its balancer data was made continues in
    // the new set by the same rule as in `get` (which makes new balancer data and counts again);
    // it ends when the new set has no tries for it either.
    if pc.tries() == 0 && c.live.state().generation() != c.generation {
        // SAFETY: the chain is in the live request's pool.
        let here = c.live.tried_here(unsafe { tried_addrs(c.tried) });
        pc.set_tries(tries_in_new_set(
            c.live.fresh_tries(),
            here,
            c.cap,
            c.made + 1,
        ));
    }
    if c.live.sweep_due() {
        warn_overdue(c.live, c.us, pc);
    }
}

/// Logs, once over all workers, the retired peers of the request's upstream whose connections
/// outlived `retired_warn` (issue 20; `docs/live-api.md`, Limits).
fn warn_overdue(live: LiveUpstream, us: *mut ngx_http_upstream_srv_conf_t, pc: Pc) {
    let overdue = live.overdue_retired();
    if overdue.is_empty() {
        return;
    }
    // SAFETY: `us` is the request's upstream configuration, alive with the configuration.
    let name = unsafe { crate::ffi::upstream::Upstream::from_ptr(us) }
        .map(|u| String::from_utf8_lossy(u.host()).into_owned())
        .unwrap_or_default();
    let line = overdue_retired_line(&name, &overdue, live.retired_warn_ms());
    let log = pc.with(|pc| pc.log);
    // SAFETY: the peer connection's log is the request's, live during its `free`.
    if let Some(log) = unsafe { log.as_ref() } {
        log_str(log, NGX_LOG_WARN, &line);
    }
}

extern "C" fn set_session_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: as in get_peer.
    let Some(ctx) = (unsafe { Ctx::from_ptr(data) }) else {
        return NGX_ERROR;
    };
    let c = ctx.get();
    match c.set_session {
        // SAFETY: the balancer's own set_session, with nginx's peer connection and its data.
        Some(f) => unsafe { f(pc, c.data) },
        None => NGX_OK,
    }
}

extern "C" fn save_session_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) {
    // SAFETY: as in get_peer.
    let Some(ctx) = (unsafe { Ctx::from_ptr(data) }) else {
        return;
    };
    let c = ctx.get();
    if let Some(f) = c.save_session {
        // SAFETY: the balancer's own save_session, with nginx's peer connection and its data.
        unsafe { f(pc, c.data) };
    }
}

type NotifyFn = unsafe extern "C" fn(*mut ngx_peer_connection_t, *mut c_void, ngx_uint_t);

extern "C" fn notify_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void, type_: ngx_uint_t) {
    // SAFETY: as in get_peer.
    let Some(ctx) = (unsafe { Ctx::from_ptr(data) }) else {
        return;
    };
    let c = ctx.get();
    if let Some(f) = c.notify {
        // SAFETY: the balancer's own notify, with nginx's peer connection, its data and type.
        unsafe { f(pc, c.data, type_) };
    }
}
