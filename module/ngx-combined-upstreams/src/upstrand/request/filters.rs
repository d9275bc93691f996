//! The header and body filters of walks: each step's answer either moves the walk on (a clone
//! subrequest for the next member, or the intercept subrequest) and is swallowed, or is the
//! walk's response and is passed on (the root's own) or delivered as the root's.

use ngx::ffi::ngx_str_t;
use upstrand_core::upstrand::select::Step;
use upstrand_core::upstrand::status::Answer;
use upstrand_core::upstrand::trace;

use super::{attach, find_ctx, log_walk, part_name, rng, Mode, Part, Role, Walk};
use crate::ffi::request::Req;
use crate::ffi::request::{next_body, next_header, Chain, Filters};
use crate::ffi::{current_msec, Status};

/// Makes the answer of subrequest `r` the root's response: copy the headers and send them down
/// the chain as the root's.
fn deliver(r: Req, root: Req) -> Status {
    root.take_headers_out(r);
    next_header(root)
}

/// Starts the next part of the walk as a subrequest of `r`.
fn spawn(
    r: Req,
    walk: Walk,
    uri: &[u8],
    args: Option<ngx_str_t>,
    clone: bool,
    role: Role,
    mode: Mode,
) -> bool {
    // No walk state is borrowed during the call.
    let Some(sr) = r.subrequest(uri, args, clone) else {
        return false;
    };
    attach(sr, walk, role, mode).is_some()
}

/// The header and body filters of walks.
pub(in crate::upstrand) struct WalkFilters;

impl Filters for WalkFilters {
    fn header(r: Req) -> Status {
        header_filter(r)
    }

    fn body(r: Req, chain: Chain) -> Status {
        body_filter(r, chain)
    }
}

// Out of line: the filter trampoline stays a thin call, and this body is optimised on its own
// (callgrind.sh: inlined into the trampoline it cost more instructions per request).
#[inline(never)]
fn header_filter(r: Req) -> Status {
    let Some(ctx) = find_ctx(r) else {
        return next_header(r);
    };
    let c = ctx.get();
    let walk = c.walk;
    // One copy of the walk for the fields read below (root, upstrand and non_idempotent never
    // change; poisoned is read before any call into nginx).
    let w = walk.snapshot();
    if w.poisoned {
        ctx.set_mode(Mode::Pass);
        return next_header(r);
    }
    if c.role == Role::Intercept {
        ctx.set_mode(Mode::Deliver);
        return deliver(r, w.root);
    }
    let Role::Step(current) = c.role else {
        return next_header(r);
    };
    if c.mode != Mode::Undecided {
        return next_header(r);
    }
    let up = w.upstrand;
    let answer = Answer {
        status: r.status(),
        origin: r.origin(),
    };
    let non_idempotent = w.non_idempotent;
    let step = walk.write(|w| {
        // The time limit counts from the first contact with an upstream (nginx stamps
        // `peer.start_time` right before connecting, after a buffered request body was read).
        if let Some(t) = r.upstream_start_time() {
            w.state.contacted(t);
        }
        up.with_state(|conf, state| {
            w.state.on_answer(
                conf,
                state,
                answer,
                non_idempotent,
                current_msec(),
                &mut rng,
            )
        })
    });
    let here = part_name(up, Role::Step(current));
    let root = w.root;
    let (next_role, uri, clone) = match step {
        Step::Final {
            intercept: None,
            reason,
        } => {
            log_walk(r, || {
                trace::stopped(&up.conf.name, here, answer, reason, None)
            });
            return final_answer(r, ctx);
        }
        Step::Final {
            intercept: Some(i),
            reason,
        } => {
            let uri = up.conf.intercepts[i].uri.as_str();
            log_walk(r, || {
                trace::stopped(&up.conf.name, here, answer, reason, Some(uri))
            });
            (Role::Intercept, uri.as_bytes().to_vec(), false)
        }
        Step::Next(m) => {
            log_walk(r, || {
                let to = part_name(up, Role::Step(m));
                trace::moved(&up.conf.name, here, answer, to, m.cycle)
            });
            (Role::Step(m), root.uri(), true)
        }
    };
    let args = clone.then(|| root.args());
    let mode = if clone {
        Mode::Undecided
    } else {
        Mode::Deliver
    };
    ctx.set_mode(Mode::Swallow);
    if spawn(r, walk, &uri, args, clone, next_role, mode) {
        return Status::NGX_OK;
    }
    // nginx logged why (e.g. "subrequests cycle"): this answer stays the final one.
    log_walk(r, || trace::spawn_failed(&up.conf.name, here));
    final_answer(r, ctx)
}

/// The current answer of `r` is the walk's response.
fn final_answer(r: Req, ctx: Part) -> Status {
    let root = ctx.walk().root();
    if r == root {
        ctx.set_mode(Mode::Pass);
        next_header(r)
    } else {
        ctx.set_mode(Mode::Deliver);
        deliver(r, root)
    }
}

#[inline(never)]
fn body_filter(req: Req, chain: Chain) -> Status {
    let Some(ctx) = find_ctx(req) else {
        return next_body(req, chain);
    };
    let c = ctx.get();
    match c.mode {
        Mode::Swallow => {
            chain.consume();
            req.drop_unbuffered_output();
            Status::NGX_OK
        }
        Mode::Deliver => {
            if c.walk.root() == req.main() {
                chain.promote_last_in_chain();
            }
            next_body(req, chain)
        }
        Mode::Undecided | Mode::Pass => next_body(req, chain),
    }
}
