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

use core::ptr;

use ngx::ffi::{
    ngx_conf_t, ngx_http_upstream_conf_t, ngx_str_t, ngx_uint_t, NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT,
    NGX_LOG_DEBUG, NGX_LOG_ERR,
};
use upstrand_core::upstrand::select::{
    member, multiple_message, whitelist_message, MemberRef, Step, Walk as WalkState,
};
use upstrand_core::upstrand::status::Answer;
use upstrand_core::upstrand::trace;
use upstrand_core::upstreams::members_to_wrap;

use super::{Registry, Upstrand};
use crate::ffi::conf::ConfPart;
use crate::ffi::pool::PoolCell;
use crate::ffi::request::{next_body, next_header, Chain, Filters, Req, UpstreamConf};
use crate::ffi::upstream::{self as upstreams, PeerInit, Upstream};
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

fn now_ms() -> u64 {
    current_msec()
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
        up.with_state(|conf, state| WalkState::begin(conf, state, now_ms(), &mut rng))
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

// ---- filters ----------------------------------------------------------------------------

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
pub(super) struct WalkFilters;

impl Filters for WalkFilters {
    fn header(r: Req) -> Status {
        header_filter(r)
    }

    fn body(r: Req, chain: Chain) -> Status {
        body_filter(r, chain)
    }
}

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
            w.state
                .on_answer(conf, state, answer, non_idempotent, now_ms(), &mut rng)
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

// ---- peer-init hook ---------------------------------------------------------------------

/// Wraps `peer.init` of every upstream that is a member of some upstrand, so that requests of a
/// walk run with `X-Accel-Redirect` and `proxy_intercept_errors` turned off (an internal
/// redirect would break the walk) and a poisoned walk fails with 500. Called once from
/// postconfiguration, after the upstream module's init_main_conf set every `peer.init`.
pub(super) fn wrap_peer_init(cf: &ngx_conf_t, reg: &mut Registry) {
    let list = upstreams::all(cf);
    let members = reg
        .upstrands
        .iter()
        .flat_map(|up| up.conf.normal.iter().chain(&up.conf.backup))
        .map(|m| m.name.as_str());
    let wrap = members_to_wrap(&upstreams::infos(&list), members);
    for u in wrap.into_iter().map(|i| list[i]) {
        reg.wrapped.push((u, u.peer_init_fn()));
        u.wrap_peer_init::<WalkPeerInit>();
    }
}

/// The walk variant of a location's upstream configuration (see [`Registry::walk_confs`]).
fn walk_conf(reg: &Registry, conf: UpstreamConf) -> *mut ngx_http_upstream_conf_t {
    let mut confs = reg.walk_confs.borrow_mut();
    if let Some((_, copy)) = confs.iter_mut().find(|(orig, _)| *orig == conf) {
        return &mut **copy;
    }
    let mut copy = Box::new(conf.get());
    copy.ignore_headers |= NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT as ngx_uint_t;
    copy.intercept_errors = 0;
    let p: *mut ngx_http_upstream_conf_t = &mut *copy;
    confs.push((conf, copy));
    p
}

/// The `peer.init` of member upstreams.
struct WalkPeerInit;

impl PeerInit for WalkPeerInit {
    fn init(req: Req, us: Upstream) -> Status {
        let Some(reg) = Registry::of_request(req) else {
            return Status::NGX_ERROR;
        };
        let Some(orig) = reg
            .wrapped
            .iter()
            .find(|(u, _)| *u == us)
            .and_then(|(_, f)| *f)
        else {
            return Status::NGX_ERROR;
        };
        if let Some(ctx) = find_ctx(req) {
            if ctx.walk().poisoned() {
                return Status::NGX_ERROR;
            }
            req.map_upstream_conf(|conf| walk_conf(reg, conf));
        }
        orig.call(req, us)
    }
}
