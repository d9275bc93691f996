//! Run time: the walk of one request through an upstrand.
//!
//! The request that first evaluates `$upstrand_NAME` becomes the walk's *root*. Each upstream
//! of the walk is tried by one request (a *step*): the root itself, then clone subrequests
//! (`NGX_HTTP_SUBREQUEST_CLONE`: same method, URI, args, headers, body, location), each created
//! by the previous step from our header filter when its answer is in `next_upstream_statuses`.
//! A swallowed step's header is not passed on and its body buffers are marked consumed. The
//! final step's headers are copied into the root and sent down the header filter chain as the
//! root's; its body reaches the client through nginx's postpone filter. `intercept_statuses`
//! adds a last, ordinary subrequest to the failover URI whose answer is delivered the same way.
//!
//! Every participating request has a [`ReqCtx`] in its module-context slot; the walk keeps the
//! list of them so that a request whose context was wiped by an internal redirect (`try_files`,
//! `error_page` in the failover location) gets it back.
//!
//! Aliasing rule: walk state ([`WalkCtx`], [`ReqCtx`], in the request tree's pool) is reached
//! only through the handles [`Walk`] and [`Part`], whose methods copy values in and out and
//! never hand out a reference. Nothing borrows walk state across a call into nginx that can run
//! variable handlers (the filter chain, `ngx_http_subrequest`, `peer.init`): `add_header X
//! $upstrand_us1;` re-enters [`upstrand_value`] from the header filter chain, which marks the
//! walk poisoned, and the status variables read the walk.
//!
//! This file holds the walk state (the [`Walk`]/[`Part`] handles and the contexts behind them)
//! and the start of a walk ([`upstrand_value`]); `filters` moves a walk on from each answer and
//! delivers the final one, `peer_init` is the hook on member upstreams.

mod filters;
mod peer_init;

pub(super) use filters::WalkFilters;
pub(super) use peer_init::wrap_peer_init;

use core::ptr;

use ngx::ffi::{NGX_LOG_DEBUG, NGX_LOG_ERR};
use upstrand_core::upstrand::select::{
    member, multiple_message, whitelist_message, MemberRef, Walk as WalkState,
};
use upstrand_core::upstrand::trace;

use super::Upstrand;
use crate::ffi::pool::PoolCell;
use crate::ffi::request::Req;
use crate::ffi::variables::VarSlot;
use crate::ffi::{current_msec, random, Status};

/// What a participating request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Runs the request against this member.
    Step(MemberRef),
    /// The `intercept_statuses` subrequest.
    Intercept,
}

/// What the filters do with a participating request's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// No answer seen yet.
    Undecided,
    /// Pass through unchanged (the root's own answer is final).
    Pass,
    /// Swallow header and body (the walk moved on).
    Swallow,
    /// A subrequest whose answer is the root's response.
    Deliver,
}

/// Per-request context (in the request pool; plain data), the module's request context.
#[derive(Clone, Copy)]
pub struct ReqCtx {
    walk: Walk,
    role: Role,
    mode: Mode,
    /// The request this context belongs to.
    r: Req,
    /// The next participating request of the walk (chronological list).
    next: Option<Part>,
}

/// The state of one walk, in the root request's pool (plain data: nothing to drop).
#[derive(Clone, Copy)]
pub(super) struct WalkCtx {
    upstrand: &'static Upstrand,
    state: WalkState,
    root: Req,
    non_idempotent: bool,
    /// A second upstrand was accessed in this request: everything answers 500.
    poisoned: bool,
    /// Every participating request, chronologically (steps, then the intercept).
    first: Option<Part>,
    last: Option<Part>,
}

/// Handle on a walk. Made only by [`upstrand_value`] in the root request's pool (the request
/// tree's), so the walk lives as long as every request that can reach it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Walk(PoolCell<WalkCtx>);

impl Walk {
    fn read<T>(self, f: impl FnOnce(&WalkCtx) -> T) -> T {
        f(&self.0.get())
    }

    /// A copy of the walk's state.
    fn snapshot(self) -> WalkCtx {
        self.0.get()
    }

    fn write<T>(self, f: impl FnOnce(&mut WalkCtx) -> T) -> T {
        self.0.update(f)
    }

    /// The walk's upstrand (registry memory, which outlives every request of the cycle).
    pub(super) fn upstrand(self) -> &'static Upstrand {
        self.read(|w| w.upstrand)
    }

    fn root(self) -> Req {
        self.read(|w| w.root)
    }

    fn poisoned(self) -> bool {
        self.read(|w| w.poisoned)
    }

    /// The contexts of every participating request, chronologically.
    pub(super) fn parts(self) -> impl Iterator<Item = Part> {
        let mut cur = self.read(|w| w.first);
        core::iter::from_fn(move || {
            let c = cur?;
            cur = c.get().next;
            Some(c)
        })
    }

    /// Appends `p` to the list of participating requests.
    fn push(self, p: Part) {
        let last = self.write(|w| {
            let last = w.last.replace(p);
            if last.is_none() {
                w.first = Some(p);
            }
            last
        });
        if let Some(last) = last {
            last.update(|c| c.next = Some(p));
        }
    }
}

/// Handle on a participating request's context; made only by [`attach`] (pool memory of the
/// request tree, alive as long as the tree).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Part(PoolCell<ReqCtx>);

impl Part {
    /// A copy of the context.
    pub(super) fn get(self) -> ReqCtx {
        self.0.get()
    }

    fn update(self, f: impl FnOnce(&mut ReqCtx)) {
        self.0.update(f);
    }

    fn set_mode(self, mode: Mode) {
        self.update(|c| c.mode = mode);
    }

    pub(super) fn walk(self) -> Walk {
        self.get().walk
    }

    pub(super) fn role(self) -> Role {
        self.get().role
    }

    pub(super) fn req(self) -> Req {
        self.get().r
    }
}

/// The name shown for a part in the status variables.
pub(super) fn part_name(up: &Upstrand, role: Role) -> &str {
    match role {
        Role::Step(m) => &member(&up.conf, m).name,
        Role::Intercept => upstrand_core::upstrand::vars::INTERCEPTED,
    }
}

/// Logs a walk decision at `debug` level (`error_log ... debug`); `line` is only formatted
/// when the request's log has HTTP debugging on.
fn log_walk(r: Req, line: impl FnOnce() -> String) {
    if r.debug_enabled() {
        r.log(NGX_LOG_DEBUG, &line());
    }
}

/// The context in `r`'s slot, if it is ours.
fn own_ctx(r: Req) -> Option<Part> {
    r.ctx::<ReqCtx>().map(Part)
}

/// The context of `r` if it takes part in a walk; restores it after an internal redirect.
pub(super) fn find_ctx(r: Req) -> Option<Part> {
    if let Some(own) = own_ctx(r) {
        return Some(own);
    }
    let mut p = r.parent();
    while let Some(parent) = p {
        if let Some(pc) = own_ctx(parent) {
            let found = pc.walk().parts().find(|c| c.req() == r)?;
            r.set_ctx(found.0);
            return Some(found);
        }
        p = parent.parent();
    }
    None
}

/// The walk of `r`'s request tree, if any (through `r` itself or one of its ancestors).
fn tree_walk(r: Req) -> Option<Walk> {
    let mut p = Some(r);
    while let Some(req) = p {
        if let Some(c) = own_ctx(req) {
            return Some(c.walk());
        }
        p = req.parent();
    }
    None
}

/// Allocates a context for `r` and records it in the walk.
#[inline]
fn attach(r: Req, walk: Walk, role: Role, mode: Mode) -> Option<Part> {
    let ctx = ReqCtx {
        walk,
        role,
        mode,
        r,
        next: None,
    };
    let p = Part(r.alloc_cell(ctx)?);
    r.set_ctx(p.0);
    walk.push(p);
    Some(p)
}

fn rng(n: usize) -> usize {
    (random() as usize) % n.max(1)
}

/// A second upstrand was accessed in the request tree of `walk`: poison the walk (every further
/// step answers 500) and log the C module's message.
fn poison(r: Req, walk: Walk, new: &Upstrand) {
    walk.write(|w| w.poisoned = true);
    let original = &walk.upstrand().conf.name;
    r.log(NGX_LOG_ERR, &multiple_message(original, &new.conf.name));
}

/// Value of `$upstrand_NAME` for upstrand `up` in request `r`.
pub(super) fn upstrand_value(r: Req, v: &mut VarSlot, up: &'static Upstrand) -> Status {
    if let Some(ctx) = find_ctx(r) {
        let walk = ctx.walk();
        let w = walk.snapshot();
        if w.poisoned {
            v.not_found();
        } else if !ptr::eq(w.upstrand, up) {
            poison(r, walk, up);
            v.not_found();
        } else {
            match ctx.role() {
                Role::Step(m) => {
                    r.set_error_page();
                    v.set_static(part_name(up, Role::Step(m)).as_bytes());
                }
                Role::Intercept => v.not_found(),
            }
        }
        return Status::NGX_OK;
    }
    if let Some(other) = tree_walk(r) {
        poison(r, other, up);
        v.not_found();
        return Status::NGX_OK;
    }
    // A new walk with r as its root.
    let Some(begin) =
        up.with_state(|conf, state| WalkState::begin(conf, state, current_msec(), &mut rng))
    else {
        v.not_found();
        return Status::NGX_OK;
    };
    if begin.whitelisted {
        r.log(NGX_LOG_ERR, &whitelist_message(&up.conf.name));
    }
    let first = begin.walk.current(&up.conf);
    log_walk(r, || {
        trace::started(&up.conf.name, part_name(up, Role::Step(first)), first.cycle)
    });
    let ctx = WalkCtx {
        upstrand: up,
        state: begin.walk,
        root: r,
        non_idempotent: r.non_idempotent_method(),
        poisoned: false,
        first: None,
        last: None,
    };
    let Some(walk) = r.alloc_cell(ctx).map(Walk) else {
        return Status::NGX_ERROR;
    };
    if attach(r, walk, Role::Step(first), Mode::Undecided).is_none() {
        return Status::NGX_ERROR;
    }
    r.set_error_page();
    v.set_static(part_name(up, Role::Step(first)).as_bytes());
    Status::NGX_OK
}
