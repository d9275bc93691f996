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

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_chain_t, ngx_conf_t, ngx_current_msec, ngx_http_output_body_filter_pt,
    ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_http_subrequest,
    ngx_http_top_body_filter, ngx_http_top_header_filter, ngx_http_upstream_conf_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_list_t, ngx_str_t, ngx_uint_t, random,
    NGX_HTTP_SUBREQUEST_CLONE, NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT, NGX_LOG_DEBUG, NGX_LOG_ERR,
};
use upstrand_core::upstrand::select::{
    member, multiple_message, whitelist_message, MemberRef, Step, Walk as WalkState,
};
use upstrand_core::upstrand::status::Answer;
use upstrand_core::upstrand::trace;
use upstrand_core::upstreams::members_to_wrap;

use super::{Registry, Upstrand};
use crate::ffi_util::{NGX_ERROR, NGX_OK};
use crate::http::{Req, VarSlot};

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

/// Per-request context (in the request pool; plain data).
#[derive(Clone, Copy)]
pub(super) struct ReqCtx {
    walk: Walk,
    role: Role,
    mode: Mode,
    /// The request this context belongs to.
    r: Req,
    /// The next participating request of the walk (chronological list).
    next: Option<Part>,
}

/// The state of one walk, in the root request's pool (plain data: nothing to drop).
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

/// Handle on a walk. Made only by [`upstrand_value`] from a fresh pool allocation; the pool is
/// the request tree's, so the walk lives as long as every request that can reach it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Walk(NonNull<WalkCtx>);

impl Walk {
    fn read<T>(self, f: impl FnOnce(&WalkCtx) -> T) -> T {
        // SAFETY: see the type; `f` runs no nginx code, so nothing else touches the walk.
        f(unsafe { self.0.as_ref() })
    }

    fn write<T>(self, f: impl FnOnce(&mut WalkCtx) -> T) -> T {
        // SAFETY: as for `read`; single-threaded, and no other borrow of the walk is alive
        // while `f` runs (every borrow lives inside one of these methods).
        f(unsafe { &mut *self.0.as_ptr() })
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
        match self.read(|w| w.last) {
            None => self.write(|w| w.first = Some(p)),
            Some(last) => last.update(|c| c.next = Some(p)),
        }
        self.write(|w| w.last = Some(p));
    }
}

/// Handle on a participating request's context; made only by [`attach`] (pool memory of the
/// request tree, alive as long as the tree).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Part(NonNull<ReqCtx>);

impl Part {
    /// A copy of the context.
    pub(super) fn get(self) -> ReqCtx {
        // SAFETY: see the type; the context is plain data, copied out.
        unsafe { *self.0.as_ptr() }
    }

    fn update(self, f: impl FnOnce(&mut ReqCtx)) {
        // SAFETY: see the type; `f` runs no nginx code and no other borrow is alive.
        f(unsafe { &mut *self.0.as_ptr() });
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
    NonNull::new(r.ctx().cast::<ReqCtx>()).map(Part)
}

/// The registry of the request's configuration (None when no upstrand is configured).
pub(super) fn registry(r: Req) -> Option<&'static Registry> {
    r.main_conf()?.upstrand.as_deref()
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
            r.set_ctx(found.0.as_ptr().cast());
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
    let p = Part(r.alloc(ctx)?);
    r.set_ctx(p.0.as_ptr().cast());
    walk.push(p);
    Some(p)
}

fn rng(n: usize) -> usize {
    // SAFETY: libc random() has no preconditions.
    let x = unsafe { random() };
    (x as usize) % n.max(1)
}

fn now_ms() -> u64 {
    // SAFETY: nginx updates this global in the worker's own thread.
    unsafe { ngx_current_msec as u64 }
}

/// A second upstrand was accessed in the request tree of `walk`: poison the walk (every further
/// step answers 500) and log the C module's message.
fn poison(r: Req, walk: Walk, new: &Upstrand) {
    walk.write(|w| w.poisoned = true);
    let original = &walk.upstrand().conf.name;
    r.log(NGX_LOG_ERR, &multiple_message(original, &new.conf.name));
}

/// Value of `$upstrand_NAME` for upstrand `up` in request `r`.
pub(super) fn upstrand_value(r: Req, v: &mut VarSlot, up: &'static Upstrand) -> ngx_int_t {
    if let Some(ctx) = find_ctx(r) {
        let walk = ctx.walk();
        if walk.poisoned() {
            v.not_found();
        } else if !ptr::eq(walk.upstrand(), up) {
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
        return NGX_OK;
    }
    if let Some(other) = tree_walk(r) {
        poison(r, other, up);
        v.not_found();
        return NGX_OK;
    }
    // A new walk with r as its root.
    let Some(begin) =
        up.with_state(|conf, state| WalkState::begin(conf, state, now_ms(), &mut rng))
    else {
        v.not_found();
        return NGX_OK;
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
    let Some(walk) = r.alloc(ctx).map(Walk) else {
        return NGX_ERROR;
    };
    if attach(r, walk, Role::Step(first), Mode::Undecided).is_none() {
        return NGX_ERROR;
    }
    r.set_error_page();
    v.set_static(part_name(up, Role::Step(first)).as_bytes());
    NGX_OK
}

// ---- filters ----------------------------------------------------------------------------

static mut NEXT_HEADER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY: ngx_http_output_body_filter_pt = None;

/// Puts our filters on top of both chains (module order places us just above the copy filter).
///
/// # Safety
/// Called from postconfiguration, single-threaded, before any request.
pub(super) unsafe fn install_filters() {
    // SAFETY: nginx configures filters single-threaded in postconfiguration; the chain heads are
    // plain globals of nginx.
    unsafe {
        NEXT_HEADER = ngx_http_top_header_filter;
        ngx_http_top_header_filter = Some(header_filter);
        NEXT_BODY = ngx_http_top_body_filter;
        ngx_http_top_body_filter = Some(body_filter);
    }
}

fn next_header(r: Req) -> ngx_int_t {
    // SAFETY: NEXT_HEADER was set in postconfiguration before any request (and is only read
    // since); the next filter takes the live request.
    unsafe {
        match *ptr::addr_of!(NEXT_HEADER) {
            Some(f) => f(r.as_ptr()),
            None => NGX_ERROR,
        }
    }
}

fn next_body(r: Req, chain: *mut ngx_chain_t) -> ngx_int_t {
    // SAFETY: as for next_header; the chain is the one nginx passed to our body filter.
    unsafe {
        match *ptr::addr_of!(NEXT_BODY) {
            Some(f) => f(r.as_ptr(), chain),
            None => NGX_ERROR,
        }
    }
}

/// Re-points `dst.last` when it still points at `src`'s embedded first part (after a struct
/// copy of an `ngx_list_t`).
///
/// # Safety
/// Both lists are live.
unsafe fn fix_list(dst: *mut ngx_list_t, src: *mut ngx_list_t) {
    // SAFETY: both lists are live (caller).
    unsafe {
        if (*dst).last == ptr::addr_of_mut!((*src).part) {
            (*dst).last = ptr::addr_of_mut!((*dst).part);
        }
    }
}

/// Makes the answer of subrequest `r` the root's response: copy the headers and send them down
/// the chain as the root's.
fn deliver(r: Req, root: Req) -> ngx_int_t {
    let (r, root_p) = (r.as_ptr(), root.as_ptr());
    // SAFETY: r and root are live requests of one tree; headers_out is plain data with lists
    // allocated in the shared pool; nothing else runs meanwhile.
    unsafe {
        (*root_p).headers_out = (*r).headers_out;
        fix_list(
            ptr::addr_of_mut!((*root_p).headers_out.headers),
            ptr::addr_of_mut!((*r).headers_out.headers),
        );
        fix_list(
            ptr::addr_of_mut!((*root_p).headers_out.trailers),
            ptr::addr_of_mut!((*r).headers_out.trailers),
        );
        (*root_p).err_status = 0;
    }
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
    // The subrequest keeps pointing at its URI: copy it into the pool.
    let Some(mut uri_s) = r.copy(uri) else {
        return false;
    };
    let mut args_s = args.unwrap_or(ngx_str_t {
        len: 0,
        data: ptr::null_mut(),
    });
    let args_p = if args.is_some() {
        ptr::addr_of_mut!(args_s)
    } else {
        ptr::null_mut()
    };
    let flags = if clone {
        NGX_HTTP_SUBREQUEST_CLONE as ngx_uint_t
    } else {
        0
    };
    let mut sr: *mut ngx_http_request_t = ptr::null_mut();
    // SAFETY: r is live and in its header filter; uri_s and args point into the tree's pool;
    // sr is initialised by ngx_http_subrequest; no walk state is borrowed during the call.
    let sr = unsafe {
        if ngx_http_subrequest(
            r.as_ptr(),
            &mut uri_s,
            args_p,
            &mut sr,
            ptr::null_mut(),
            flags,
        ) != NGX_OK
        {
            return false;
        }
        let Some(sr) = Req::from_ptr(sr) else {
            return false;
        };
        // The subrequest got a struct copy of r's headers_in.
        fix_list(
            ptr::addr_of_mut!((*sr.as_ptr()).headers_in.headers),
            ptr::addr_of_mut!((*r.as_ptr()).headers_in.headers),
        );
        sr
    };
    attach(sr, walk, role, mode).is_some()
}

extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls the filter with the live request whose header is being sent.
    let Some(r) = (unsafe { Req::from_ptr(r) }) else {
        return NGX_ERROR;
    };
    let Some(ctx) = find_ctx(r) else {
        return next_header(r);
    };
    let c = ctx.get();
    let walk = c.walk;
    if walk.poisoned() {
        ctx.set_mode(Mode::Pass);
        return next_header(r);
    }
    if c.role == Role::Intercept {
        ctx.set_mode(Mode::Deliver);
        return deliver(r, walk.root());
    }
    let Role::Step(current) = c.role else {
        return next_header(r);
    };
    if c.mode != Mode::Undecided {
        return next_header(r);
    }
    let up = walk.upstrand();
    let answer = Answer {
        status: r.status(),
        origin: r.origin(),
    };
    let non_idempotent = walk.read(|w| w.non_idempotent);
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
    let root = walk.root();
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
        return NGX_OK;
    }
    // nginx logged why (e.g. "subrequests cycle"): this answer stays the final one.
    log_walk(r, || trace::spawn_failed(&up.conf.name, here));
    final_answer(r, ctx)
}

/// The current answer of `r` is the walk's response.
fn final_answer(r: Req, ctx: Part) -> ngx_int_t {
    let root = ctx.walk().root();
    if r == root {
        ctx.set_mode(Mode::Pass);
        next_header(r)
    } else {
        ctx.set_mode(Mode::Deliver);
        deliver(r, root)
    }
}

extern "C" fn body_filter(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    // SAFETY: nginx calls the filter with the live request whose body is being sent.
    let Some(req) = (unsafe { Req::from_ptr(r) }) else {
        return NGX_ERROR;
    };
    let Some(ctx) = find_ctx(req) else {
        return next_body(req, chain);
    };
    let c = ctx.get();
    match c.mode {
        Mode::Swallow => {
            // SAFETY: chain is the chain nginx passes down: its links and buffers are valid;
            // r->upstream is null or the request's live upstream.
            unsafe {
                let mut cl = chain;
                while !cl.is_null() {
                    let b = (*cl).buf;
                    if !b.is_null() {
                        (*b).pos = (*b).last;
                        if (*b).in_file() != 0 {
                            (*b).file_pos = (*b).file_last;
                        }
                    }
                    cl = (*cl).next;
                }
                let u = (*r).upstream;
                if !u.is_null() && (*u).buffering() == 0 {
                    (*u).out_bufs = ptr::null_mut();
                }
            }
            NGX_OK
        }
        Mode::Deliver => {
            if c.walk.root() == req.main() {
                // SAFETY: as above.
                unsafe {
                    let mut cl = chain;
                    while !cl.is_null() {
                        let b = (*cl).buf;
                        if !b.is_null() && (*b).last_in_chain() != 0 {
                            (*b).set_last_buf(1);
                        }
                        cl = (*cl).next;
                    }
                }
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
    let list = crate::upstreams::all(cf);
    let members = reg
        .upstrands
        .iter()
        .flat_map(|up| up.conf.normal.iter().chain(&up.conf.backup))
        .map(|m| m.name.as_str());
    let wrap = members_to_wrap(&crate::upstreams::infos(&list), members);
    for u in wrap.into_iter().map(|i| list[i]) {
        reg.wrapped.push((u.as_ptr(), u.peer_init()));
        u.set_peer_init(Some(peer_init));
    }
}

/// The walk variant of a location's upstream configuration (see [`Registry::walk_confs`]):
/// `conf` is a location's `ngx_http_upstream_conf_t` (it lives as long as the cycle).
fn walk_conf(reg: &Registry, conf: *mut ngx_http_upstream_conf_t) -> *mut ngx_http_upstream_conf_t {
    let mut confs = reg.walk_confs.borrow_mut();
    if let Some((_, copy)) = confs.iter_mut().find(|(orig, _)| ptr::eq(*orig, conf)) {
        return &mut **copy;
    }
    // SAFETY: conf is the request's upstream configuration (from `map_upstream_conf`): plain
    // data, copied by value.
    let mut copy = Box::new(unsafe { *conf });
    copy.ignore_headers |= NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT as ngx_uint_t;
    copy.intercept_errors = 0;
    let p: *mut ngx_http_upstream_conf_t = &mut *copy;
    confs.push((conf, copy));
    p
}

extern "C" fn peer_init(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls peer.init with the live request being connected to upstream `us`.
    let Some(req) = (unsafe { Req::from_ptr(r) }) else {
        return NGX_ERROR;
    };
    let Some(reg) = registry(req) else {
        return NGX_ERROR;
    };
    let Some(orig) = reg
        .wrapped
        .iter()
        .find(|(u, _)| *u == us)
        .and_then(|(_, f)| *f)
    else {
        return NGX_ERROR;
    };
    if let Some(ctx) = find_ctx(req) {
        if ctx.walk().poisoned() {
            return NGX_ERROR;
        }
        req.map_upstream_conf(|conf| walk_conf(reg, conf));
    }
    // SAFETY: the original peer.init of `us` takes exactly what nginx passed to us.
    unsafe { orig(r, us) }
}
