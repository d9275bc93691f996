//! The per-request wrappers around the upstream's balancer (round robin or least_conn, with or
//! without keepalive on top): `peer.init` is replaced at configuration time for every upstream
//! the API can change; at request time the wrapper installs its own `get`/`free`/
//! `set_session`/`save_session` around the balancer's.
//!
//! What they guarantee:
//! - the balancer's per-request data (the round-robin `tried` bitmap, sized by the peer count
//!   when `init` ran) always matches the set it selects from: `init` and every `get` run with
//!   the zone's gate read-held, and a `get` that finds the generation changed since the
//!   request's `init` runs the balancer's `init` again before selecting (the request keeps its
//!   remaining tries; servers it already tried may be tried again in the new set);
//! - the peer's name and address that nginx keeps after `free` (`u->peer.name` for
//!   `$upstream_addr` and error log lines, `u->peer.sockaddr`) are copies in the request pool, so
//!   a retired peer can be freed as soon as its last connection ends;
//! - a request whose set shrank to one server after its peer was selected keeps its remaining
//!   tries (nginx's `free` would end them, reading the list's new `single` flag);
//! - every `free` frees retired peers that became idle.

use core::ffi::c_void;
use core::mem::size_of;
use core::ptr;

use ngx::ffi::{
    ngx_event_free_peer_pt, ngx_event_get_peer_pt, ngx_event_save_peer_session_pt,
    ngx_event_set_peer_session_pt, ngx_http_request_t, ngx_http_upstream_rr_peers_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_palloc, ngx_peer_connection_t, ngx_uint_t,
    sockaddr, NGX_DONE,
};

use super::zone::{self, GateRead, Shared};
use crate::ffi_util::{pool_copy, pool_new, NGX_ERROR, NGX_OK};

/// Per-request state of the wrapper (request pool; plain data).
struct PeerCtx {
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
    shared: *mut Shared,
    orig_init: unsafe extern "C" fn(
        *mut ngx_http_request_t,
        *mut ngx_http_upstream_srv_conf_t,
    ) -> ngx_int_t,
    generation: u64,
    get: ngx_event_get_peer_pt,
    free: ngx_event_free_peer_pt,
    set_session: ngx_event_set_peer_session_pt,
    save_session: ngx_event_save_peer_session_pt,
    data: *mut c_void,
}

/// The `peer.init` installed for live upstreams.
///
/// # Safety
/// Called by nginx with a request and its upstream's configuration.
pub unsafe extern "C" fn init_peer(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    let Some((orig, shared)) = super::lookup_peer_init(us) else {
        return NGX_ERROR;
    };
    // SAFETY: nginx passes a live request with its upstream; orig is the balancer's init.
    unsafe {
        if shared.is_null() {
            return orig(r, us);
        }
        let gate = GateRead::take(shared);
        let generation = zone::generation(shared);
        let rc = orig(r, us);
        drop(gate);
        if rc != NGX_OK {
            return rc;
        }
        let u = (*r).upstream;
        let ctx = PeerCtx {
            r,
            us,
            shared,
            orig_init: orig,
            generation,
            get: None,
            free: None,
            set_session: None,
            save_session: None,
            data: ptr::null_mut(),
        };
        let Some(ctx) = pool_new((*r).pool, ctx) else {
            return NGX_ERROR;
        };
        take_over(ctx, ptr::addr_of_mut!((*u).peer));
        NGX_OK
    }
}

/// Saves the balancer's callbacks from `pc` into `ctx` and installs the wrapper's.
unsafe fn take_over(ctx: *mut PeerCtx, pc: *mut ngx_peer_connection_t) {
    // SAFETY: both live (caller).
    unsafe {
        (*ctx).get = (*pc).get;
        (*ctx).free = (*pc).free;
        (*ctx).set_session = (*pc).set_session;
        (*ctx).save_session = (*pc).save_session;
        (*ctx).data = (*pc).data;
        (*pc).get = Some(get_peer);
        (*pc).free = Some(free_peer);
        if (*ctx).set_session.is_some() {
            (*pc).set_session = Some(set_session);
        }
        if (*ctx).save_session.is_some() {
            (*pc).save_session = Some(save_session);
        }
        (*pc).data = ctx.cast();
    }
}

unsafe extern "C" fn get_peer(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    let ctx = data.cast::<PeerCtx>();
    // SAFETY: data is the PeerCtx installed by init_peer for this request; pc is its upstream's
    // peer connection. The gate is read-held from the generation check through the selection.
    unsafe {
        let gate = GateRead::take((*ctx).shared);
        let now = zone::generation((*ctx).shared);
        if now != (*ctx).generation {
            // The set changed since this request's balancer data was made: make it again.
            let u = (*(*ctx).r).upstream;
            let tries = (*pc).tries;
            (*u).peer.data = ptr::null_mut();
            if ((*ctx).orig_init)((*ctx).r, (*ctx).us) != NGX_OK {
                return NGX_ERROR;
            }
            take_over(ctx, pc);
            (*pc).tries = tries;
            (*ctx).generation = now;
            zone::count_rebalanced((*ctx).shared);
        }
        let Some(get) = (*ctx).get else {
            return NGX_ERROR;
        };
        let rc = get(pc, (*ctx).data);
        drop(gate);
        if (rc == NGX_OK || rc == NGX_DONE as ngx_int_t) && !detach_name(ctx, pc) {
            return NGX_ERROR;
        }
        rc
    }
}

/// Points `pc.name` and `pc.sockaddr` at copies in the request pool.
unsafe fn detach_name(ctx: *mut PeerCtx, pc: *mut ngx_peer_connection_t) -> bool {
    // SAFETY: pc was just filled by the balancer from a peer it holds (conns counted), so the
    // peer's name and address are valid to copy here.
    unsafe {
        let pool = (*(*ctx).r).pool;
        if !(*pc).name.is_null() {
            let Some(copy) = pool_copy(pool, crate::ffi_util::bytes(&*(*pc).name)) else {
                return false;
            };
            let Some(s) = pool_new(pool, copy) else {
                return false;
            };
            (*pc).name = s;
        }
        if !(*pc).sockaddr.is_null() && (*pc).socklen > 0 {
            let len = (*pc).socklen as usize;
            let p = ngx_palloc(pool, len.max(size_of::<sockaddr>())).cast::<u8>();
            if p.is_null() {
                return false;
            }
            ptr::copy_nonoverlapping((*pc).sockaddr.cast::<u8>(), p, len);
            (*pc).sockaddr = p.cast();
        }
        true
    }
}

unsafe extern "C" fn free_peer(
    pc: *mut ngx_peer_connection_t,
    data: *mut c_void,
    state: ngx_uint_t,
) {
    let ctx = data.cast::<PeerCtx>();
    // SAFETY: as get_peer; the balancer's free gets the data its own get used.
    unsafe {
        let tries = (*pc).tries;
        if let Some(free) = (*ctx).free {
            free(pc, (*ctx).data, state);
        }
        // nginx's round-robin `free` ends every retry (tries = 0) when the list is `single` now;
        // when the set became a single server after this request's peer was selected, the
        // request still has its other tries (the next `get` makes new balancer data).
        if (*pc).tries == 0 && tries > 1 && zone::generation((*ctx).shared) != (*ctx).generation {
            (*pc).tries = tries - 1;
        }
        if zone::has_retiring((*ctx).shared) {
            zone::sweep(
                (*ctx).shared,
                (*(*ctx).us)
                    .peer
                    .data
                    .cast::<ngx_http_upstream_rr_peers_t>(),
            );
        }
    }
}

unsafe extern "C" fn set_session(pc: *mut ngx_peer_connection_t, data: *mut c_void) -> ngx_int_t {
    let ctx = data.cast::<PeerCtx>();
    // SAFETY: as get_peer.
    unsafe {
        match (*ctx).set_session {
            Some(f) => f(pc, (*ctx).data),
            None => NGX_OK,
        }
    }
}

unsafe extern "C" fn save_session(pc: *mut ngx_peer_connection_t, data: *mut c_void) {
    let ctx = data.cast::<PeerCtx>();
    // SAFETY: as get_peer.
    unsafe {
        if let Some(f) = (*ctx).save_session {
            f(pc, (*ctx).data);
        }
    }
}
