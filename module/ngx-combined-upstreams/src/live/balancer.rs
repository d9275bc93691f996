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
//! - every try is counted in its server's statistics (`ffi/counters.rs`): the selection after
//!   the balancer's `get`, the try's end (status class, bytes, times, failure) just before the
//!   balancer's `free`, through the peer the try holds (no lookup, no lock);
//! - a `free` frees retired peers that became idle (at most once per `SWEEP_EVERY_MS` per
//!   upstream over all workers, so a long connection to a removed server does not make every
//!   request take the list write locks).
//!
//! The wrapper is this file's [`LiveWrapper`] over the FFI layer's `PeerWrapper`
//! (`ffi/balancer.rs`: the balancer's saved callbacks; `ffi/upstream/mod.rs`: the trampolines,
//! the copies of the peer's name and address and the addresses of the tries in the request
//! pool).

use ngx::ffi::{ngx_uint_t, NGX_DONE, NGX_LOG_WARN, NGX_PEER_FAILED};
use upstrand_core::live::plan::tries_in_new_set;
use upstrand_core::live::render::overdue_retired_line;

use super::zone::LiveUpstream;
use crate::ffi::balancer::{wrap, PeerConn, PeerWrapper, Wrap};
use crate::ffi::counters::TryEnd;
use crate::ffi::peers::Peer;
use crate::ffi::request::Req;
use crate::ffi::upstream::{PeerInit, Upstream};
use crate::ffi::wall_msec;
use crate::ffi::Status;

/// Per-request state of the wrapper (request pool; plain data).
#[derive(Clone, Copy)]
pub struct LiveCtx {
    live: LiveUpstream,
    generation: u64,
    /// `proxy_next_upstream_tries` (and the like) of the request's upstream (0: no limit).
    cap: ngx_uint_t,
    /// Tries ended so far (calls of `free`).
    made: ngx_uint_t,
    /// The peer of the try in progress (from its `get` to its `free`, which the try holds it
    /// for): whose statistics counters the try's end goes to.
    peer: Option<Peer>,
}

/// The `peer.init` installed for live upstreams.
pub struct LivePeerInit;

impl PeerInit for LivePeerInit {
    fn init(r: Req, us: Upstream) -> Status {
        let Some((orig, live)) = super::lookup_peer_init(us) else {
            return Status::NGX_ERROR;
        };
        let Some(live) = live else {
            return orig.call(r, us);
        };
        let gate = live.state().gate_read();
        let generation = live.state().generation();
        let rc = orig.call(r, us);
        drop(gate);
        if rc != Status::NGX_OK {
            return rc;
        }
        let ctx = LiveCtx {
            live,
            generation,
            cap: r.next_upstream_tries(),
            made: 0,
            peer: None,
        };
        wrap::<LiveWrapper>(r, us, orig, ctx)
    }
}

/// The wrapper's `get` and `free`.
pub struct LiveWrapper;

impl PeerWrapper for LiveWrapper {
    type State = LiveCtx;

    fn get(w: Wrap<Self>, pc: PeerConn) -> Status {
        let c = w.state();
        // The gate is read-held from the generation check through the selection.
        let gate = c.live.state().gate_read();
        let now = c.live.state().generation();
        if now != c.generation {
            // The set changed since this request's balancer data was made: make it again.
            if w.reinit(pc) != Status::NGX_OK {
                return Status::NGX_ERROR;
            }
            // The balancer's init gave the tries of a new request in the new set.
            let fresh = pc.tries();
            let here = w.with_tried(|tried| c.live.tried_here(tried));
            let left = tries_in_new_set(fresh, here, c.cap, c.made);
            pc.set_tries(left);
            w.update_state(|c| c.generation = now);
            c.live.state().count_rebalanced();
            if left == 0 {
                // Nothing left to try in this set: the request ends as with no live server.
                return Status::NGX_BUSY;
            }
        }
        let rc = w.balancer_get(pc);
        drop(gate);
        if rc == Status::NGX_OK || rc.0 == NGX_DONE as isize {
            // Statistics: the chosen peer (before `record_try` points the name at a copy).
            let peer = pc.chosen_rr_peer();
            if let Some(ct) = peer.and_then(Peer::counters) {
                ct.selected(wall_msec());
            }
            w.update_state(|c| c.peer = peer);
            if !w.record_try(pc) {
                return Status::NGX_ERROR;
            }
        }
        rc
    }

    fn before_free(w: Wrap<Self>, _pc: PeerConn, state: ngx_uint_t) {
        // Counted before the balancer's `free`, while the try still holds the peer: after it,
        // a removed peer may be freed (with its counters) by any worker.
        let c = w.state();
        let Some(peer) = c.peer else { return };
        w.update_state(|c| c.peer = None);
        let Some(ct) = peer.counters() else { return };
        let failed = state & NGX_PEER_FAILED as ngx_uint_t != 0;
        // nginx's round-robin `free` is about to count this failure: the server becomes
        // unavailable when that brings `fails` to `max_fails` (never for a `single` list).
        let became_unavail = failed && {
            let (fails, max_fails, single) = peer.passive(c.live.primary);
            !single && max_fails != 0 && fails.saturating_add(1) >= max_fails
        };
        ct.ended(
            &TryEnd::of(w.request()),
            failed,
            became_unavail,
            wall_msec(),
        );
    }

    fn after_free(w: Wrap<Self>, pc: PeerConn) {
        let c = w.state();
        w.update_state(|c| c.made += 1);
        // A request whose tries ran out (nginx's round-robin `free` also ends every retry when
        // the list is `single` now) while the set changed since its balancer data was made
        // continues in the new set by the same rule as in `get` (which makes new balancer data
        // and counts again); it ends when the new set has no tries for it either.
        if pc.tries() == 0 && c.live.state().generation() != c.generation {
            let here = w.with_tried(|tried| c.live.tried_here(tried));
            pc.set_tries(tries_in_new_set(
                c.live.fresh_tries(),
                here,
                c.cap,
                c.made + 1,
            ));
        }
        if c.live.sweep_due() {
            warn_overdue(c.live, w.upstream(), pc);
        }
    }
}

/// Logs, once over all workers, the retired peers of the request's upstream whose connections
/// outlived `retired_warn` (`docs/live-api.md`, Limits).
fn warn_overdue(live: LiveUpstream, us: Upstream, pc: PeerConn) {
    let overdue = live.overdue_retired();
    if overdue.is_empty() {
        return;
    }
    let name = String::from_utf8_lossy(us.host());
    let line = overdue_retired_line(&name, &overdue, live.retired_warn_ms());
    pc.log(NGX_LOG_WARN, &line);
}
