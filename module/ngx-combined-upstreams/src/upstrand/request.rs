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

use core::ffi::c_void;
use core::ptr;

use ngx::ffi::{
    ngx_chain_t, ngx_conf_t, ngx_current_msec, ngx_http_output_body_filter_pt,
    ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_http_subrequest,
    ngx_http_top_body_filter, ngx_http_top_header_filter, ngx_http_upstream_conf_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_list_t, ngx_str_t, ngx_uint_t,
    ngx_variable_value_t, random, NGX_HTTP_LOCK, NGX_HTTP_PATCH, NGX_HTTP_POST,
    NGX_HTTP_SUBREQUEST_CLONE, NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT, NGX_LOG_ERR,
};
use upstrand_core::upstrand::select::{member, whitelist_message, MemberRef, Step, Walk};
use upstrand_core::upstrand::status::{Answer, Origin};

use super::{Registry, Upstrand};
use crate::conf::MainConf;
use crate::ctx_index;
use crate::ffi_util::{
    bytes, log_request, pool_copy, pool_new, set_error_page, set_not_found, set_value_raw,
    NGX_ERROR, NGX_OK,
};

/// The log line for a second upstrand in one request.
const MULTIPLE_MESSAGE: &str =
    "accessing multiple upstrand variables in a single request is prohibited";

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
pub(super) struct ReqCtx {
    pub walk: *mut WalkCtx,
    pub role: Role,
    pub mode: Mode,
    /// The request this context belongs to.
    pub r: *mut ngx_http_request_t,
    /// The next participating request of the walk (chronological list).
    pub next: *mut ReqCtx,
}

/// The state of one walk, in the root request's pool (plain data: nothing to drop).
pub(super) struct WalkCtx {
    pub upstrand: *const Upstrand,
    pub walk: Walk,
    pub root: *mut ngx_http_request_t,
    pub non_idempotent: bool,
    /// A second upstrand was accessed in this request: everything answers 500.
    pub poisoned: bool,
    /// Every participating request, chronologically (steps, then the intercept): first and last
    /// of the list linked through [`ReqCtx::next`].
    pub first: *mut ReqCtx,
    pub last: *mut ReqCtx,
}

impl WalkCtx {
    /// The contexts of every participating request, chronologically.
    ///
    /// # Safety
    /// The walk and its contexts are live (they live as long as the request tree's pool).
    pub unsafe fn parts(&self) -> impl Iterator<Item = *mut ReqCtx> + '_ {
        let mut cur = self.first;
        core::iter::from_fn(move || {
            if cur.is_null() {
                return None;
            }
            let c = cur;
            // SAFETY: c is a live context of this walk (caller).
            cur = unsafe { (*c).next };
            Some(c)
        })
    }

    /// The name shown for a part in the status variables.
    pub fn part_name(&self, role: Role) -> &str {
        match role {
            // SAFETY: upstrand points into the registry, which outlives every request.
            Role::Step(m) => &member(unsafe { &(*self.upstrand).conf }, m).name,
            Role::Intercept => upstrand_core::upstrand::vars::INTERCEPTED,
        }
    }
}

unsafe fn slot(r: *mut ngx_http_request_t) -> *mut *mut c_void {
    // SAFETY: r is live and its ctx array has ngx_http_max_module entries (caller).
    unsafe { (*r).ctx.add(ctx_index()) }
}

/// The registry of the request's configuration (None when no upstrand is configured).
///
/// # Safety
/// `r` is a live request.
pub(super) unsafe fn registry<'a>(r: *mut ngx_http_request_t) -> Option<&'a Registry> {
    // SAFETY: r's main_conf array holds our MainConf at our ctx_index.
    unsafe {
        let mc = (*(*r).main_conf.add(ctx_index())).cast::<MainConf>();
        if mc.is_null() {
            return None;
        }
        (*mc).upstrand.map(|p| &*p.as_ptr())
    }
}

/// The context of `r` if it takes part in a walk; restores it after an internal redirect.
///
/// # Safety
/// `r` is a live request.
pub(super) unsafe fn find_ctx(r: *mut ngx_http_request_t) -> *mut ReqCtx {
    // SAFETY: r and its ancestors are live requests of one connection; ctx pointers in our slot
    // are ReqCtx values we allocated in the main request's pool.
    unsafe {
        let own = (*slot(r)).cast::<ReqCtx>();
        if !own.is_null() {
            return own;
        }
        let mut p = (*r).parent;
        while !p.is_null() {
            let pc = (*slot(p)).cast::<ReqCtx>();
            if !pc.is_null() {
                let w = &*(*pc).walk;
                return match w.parts().find(|c| (**c).r == r) {
                    Some(c) => {
                        *slot(r) = c.cast();
                        c
                    }
                    None => ptr::null_mut(),
                };
            }
            p = (*p).parent;
        }
        ptr::null_mut()
    }
}

/// The walk of `r`'s request tree, if any (through `r` itself or one of its ancestors).
unsafe fn tree_walk(r: *mut ngx_http_request_t) -> *mut WalkCtx {
    // SAFETY: as in find_ctx.
    unsafe {
        let mut p = r;
        while !p.is_null() {
            let pc = (*slot(p)).cast::<ReqCtx>();
            if !pc.is_null() {
                return (*pc).walk;
            }
            p = (*p).parent;
        }
        ptr::null_mut()
    }
}

/// Allocates a context for `r` and records it in the walk.
unsafe fn attach(
    r: *mut ngx_http_request_t,
    w: *mut WalkCtx,
    role: Role,
    mode: Mode,
) -> Option<*mut ReqCtx> {
    let ctx = ReqCtx {
        walk: w,
        role,
        mode,
        r,
        next: ptr::null_mut(),
    };
    // SAFETY: r's pool is live (the tree's shared pool); w is a live walk of the same tree.
    unsafe {
        let c = pool_new((*r).pool, ctx)?;
        *slot(r) = c.cast();
        if (*w).last.is_null() {
            (*w).first = c;
        } else {
            (*(*w).last).next = c;
        }
        (*w).last = c;
        Some(c)
    }
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

/// Sets `v` to the member name of a step (names live in the registry for the whole cycle).
unsafe fn set_member(v: *mut ngx_variable_value_t, w: &WalkCtx, m: MemberRef) {
    let name = w.part_name(Role::Step(m));
    // SAFETY: the name bytes live in the registry, which outlives the request; nginx only reads.
    unsafe { set_value_raw(v, name.as_ptr().cast_mut(), name.len()) };
}

/// Value of `$upstrand_NAME` for upstrand `up` in request `r`.
///
/// # Safety
/// `r` is a live request; `v` the variable slot nginx passed; `up` from the registry.
pub(super) unsafe fn upstrand_value(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    up: &Upstrand,
) -> ngx_int_t {
    // SAFETY: r, v are live (caller); walks and contexts are ours, allocated in the pool of the
    // request tree and alive while it is.
    unsafe {
        let ctx = find_ctx(r);
        if !ctx.is_null() {
            let w = &mut *(*ctx).walk;
            if w.poisoned {
                set_not_found(v);
                return NGX_OK;
            }
            if !ptr::eq(w.upstrand, up) {
                w.poisoned = true;
                log_request(r, NGX_LOG_ERR, MULTIPLE_MESSAGE);
                set_not_found(v);
                return NGX_OK;
            }
            match (*ctx).role {
                Role::Step(m) => {
                    set_error_page(r);
                    set_member(v, w, m);
                }
                Role::Intercept => set_not_found(v),
            }
            return NGX_OK;
        }
        let other = tree_walk(r);
        if !other.is_null() {
            (*other).poisoned = true;
            log_request(r, NGX_LOG_ERR, MULTIPLE_MESSAGE);
            set_not_found(v);
            return NGX_OK;
        }
        // A new walk with r as its root.
        let begin = up.with_state(|conf, state| Walk::begin(conf, state, now_ms(), &mut rng));
        let Some(begin) = begin else {
            set_not_found(v);
            return NGX_OK;
        };
        if begin.whitelisted {
            log_request(r, NGX_LOG_ERR, &whitelist_message(&up.conf.name));
        }
        let first = begin.walk.current(&up.conf);
        let method = (*r).method;
        let non_idempotent =
            method & (NGX_HTTP_POST | NGX_HTTP_LOCK | NGX_HTTP_PATCH) as ngx_uint_t != 0;
        let walk = WalkCtx {
            upstrand: up,
            walk: begin.walk,
            root: r,
            non_idempotent,
            poisoned: false,
            first: ptr::null_mut(),
            last: ptr::null_mut(),
        };
        let Some(w) = pool_new((*r).pool, walk) else {
            return NGX_ERROR;
        };
        if attach(r, w, Role::Step(first), Mode::Undecided).is_none() {
            return NGX_ERROR;
        }
        set_error_page(r);
        set_member(v, &*w, first);
        NGX_OK
    }
}

// ---- filters ----------------------------------------------------------------------------

static mut NEXT_HEADER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY: ngx_http_output_body_filter_pt = None;

/// Puts our filters on top of both chains (module order places us just above the copy filter).
///
/// # Safety
/// Called from postconfiguration, single-threaded.
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

unsafe fn next_header(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: NEXT_HEADER was set in postconfiguration before any request; r is live.
    unsafe {
        match NEXT_HEADER {
            Some(f) => f(r),
            None => NGX_ERROR,
        }
    }
}

unsafe fn next_body(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    // SAFETY: NEXT_BODY was set in postconfiguration before any request; r is live.
    unsafe {
        match NEXT_BODY {
            Some(f) => f(r, chain),
            None => NGX_ERROR,
        }
    }
}

/// True when nginx produced the status itself (no backend status line in the last try).
unsafe fn generated(r: *mut ngx_http_request_t) -> bool {
    // SAFETY: r is live; r->upstream is either null or the request's upstream.
    unsafe {
        let u = (*r).upstream;
        u.is_null() || (*u).headers_in.status_n == 0
    }
}

/// Re-points `dst.last` when it still points at `src`'s embedded first part (after a struct
/// copy of an `ngx_list_t`).
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
unsafe fn deliver(r: *mut ngx_http_request_t, w: &WalkCtx) -> ngx_int_t {
    // SAFETY: r and w.root are live requests of one tree; headers_out is plain data with lists
    // allocated in the shared pool.
    unsafe {
        let root = w.root;
        (*root).headers_out = (*r).headers_out;
        fix_list(
            ptr::addr_of_mut!((*root).headers_out.headers),
            ptr::addr_of_mut!((*r).headers_out.headers),
        );
        fix_list(
            ptr::addr_of_mut!((*root).headers_out.trailers),
            ptr::addr_of_mut!((*r).headers_out.trailers),
        );
        (*root).err_status = 0;
        next_header(root)
    }
}

/// Starts the next part of the walk as a subrequest of `r`.
unsafe fn spawn(
    r: *mut ngx_http_request_t,
    w: *mut WalkCtx,
    uri: &[u8],
    args: Option<ngx_str_t>,
    clone: bool,
    role: Role,
    mode: Mode,
) -> bool {
    // SAFETY: r is live and in its header filter; the URI is copied into the pool (the
    // subrequest keeps pointing at it); sr is initialised by ngx_http_subrequest.
    unsafe {
        let Some(mut uri_s) = pool_copy((*r).pool, uri) else {
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
        let mut sr: *mut ngx_http_request_t = ptr::null_mut();
        let flags = if clone {
            NGX_HTTP_SUBREQUEST_CLONE as ngx_uint_t
        } else {
            0
        };
        if ngx_http_subrequest(r, &mut uri_s, args_p, &mut sr, ptr::null_mut(), flags) != NGX_OK
            || sr.is_null()
        {
            return false;
        }
        // The subrequest got a struct copy of r's headers_in.
        fix_list(
            ptr::addr_of_mut!((*sr).headers_in.headers),
            ptr::addr_of_mut!((*r).headers_in.headers),
        );
        attach(sr, w, role, mode).is_some()
    }
}

unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: r is the live request nginx is sending a header for; contexts and walks are ours.
    unsafe {
        let ctx = find_ctx(r);
        if ctx.is_null() {
            return next_header(r);
        }
        let c = &mut *ctx;
        let w = &mut *c.walk;
        if w.poisoned {
            c.mode = Mode::Pass;
            return next_header(r);
        }
        if c.role == Role::Intercept {
            c.mode = Mode::Deliver;
            return deliver(r, w);
        }
        if c.mode != Mode::Undecided {
            return next_header(r);
        }
        let up = &*w.upstrand;
        let status = u16::try_from((*r).headers_out.status).unwrap_or(0);
        let origin = if generated(r) {
            Origin::Generated
        } else {
            Origin::Backend
        };
        let answer = Answer { status, origin };
        let non_idempotent = w.non_idempotent;
        let walk = &mut w.walk;
        let step = up.with_state(|conf, state| {
            walk.on_answer(conf, state, answer, non_idempotent, now_ms(), &mut rng)
        });
        let (next_role, uri, clone) = match step {
            Step::Final {
                intercept: None, ..
            } => return final_answer(r, ctx),
            Step::Final {
                intercept: Some(i), ..
            } => (Role::Intercept, up.conf.intercepts[i].uri.as_bytes(), false),
            Step::Next(m) => {
                let root = w.root;
                (Role::Step(m), bytes(&(*root).uri), true)
            }
        };
        let args = if clone { Some((*w.root).args) } else { None };
        let mode = if clone {
            Mode::Undecided
        } else {
            Mode::Deliver
        };
        c.mode = Mode::Swallow;
        if spawn(r, c.walk, uri, args, clone, next_role, mode) {
            return NGX_OK;
        }
        // nginx logged why (e.g. "subrequests cycle"): this answer stays the final one.
        final_answer(r, ctx)
    }
}

/// The current answer of `r` is the walk's response.
unsafe fn final_answer(r: *mut ngx_http_request_t, ctx: *mut ReqCtx) -> ngx_int_t {
    // SAFETY: r is live and ctx its context (caller).
    unsafe {
        let c = &mut *ctx;
        let w = &*c.walk;
        if r == w.root {
            c.mode = Mode::Pass;
            next_header(r)
        } else {
            c.mode = Mode::Deliver;
            deliver(r, w)
        }
    }
}

unsafe extern "C" fn body_filter(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    // SAFETY: r is live; chain is the chain nginx passes down, its links and buffers are valid.
    unsafe {
        let ctx = find_ctx(r);
        if ctx.is_null() {
            return next_body(r, chain);
        }
        match (*ctx).mode {
            Mode::Swallow => {
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
                NGX_OK
            }
            Mode::Deliver => {
                let w = &*(*ctx).walk;
                if w.root == (*r).main {
                    let mut cl = chain;
                    while !cl.is_null() {
                        let b = (*cl).buf;
                        if !b.is_null() && (*b).last_in_chain() != 0 {
                            (*b).set_last_buf(1);
                        }
                        cl = (*cl).next;
                    }
                }
                next_body(r, chain)
            }
            Mode::Undecided | Mode::Pass => next_body(r, chain),
        }
    }
}

// ---- peer-init hook ---------------------------------------------------------------------

/// Wraps `peer.init` of every upstream that is a member of some upstrand, so that requests of a
/// walk run with `X-Accel-Redirect` and `proxy_intercept_errors` turned off (an internal
/// redirect would break the walk) and a poisoned walk fails with 500.
///
/// # Safety
/// `cf` is the parsed configuration; called once from postconfiguration.
pub(super) unsafe fn wrap_peer_init(cf: *mut ngx_conf_t, reg: &mut Registry) {
    let mut names: Vec<Vec<u8>> = Vec::new();
    for up in &reg.upstrands {
        for m in up.conf.normal.iter().chain(&up.conf.backup) {
            let n = m.name.as_bytes().to_ascii_lowercase();
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    // SAFETY: cf is valid; upstream srv confs live as long as the cycle and their peer.init
    // was set by the upstream module's init_main_conf, which ran before postconfiguration.
    unsafe {
        for (uscf, host) in super::block::named_upstreams(cf) {
            let lower = host.to_ascii_lowercase();
            if !names.contains(&lower) || reg.wrapped.iter().any(|(u, _)| *u == uscf) {
                continue;
            }
            // Only the first upstream of a name is what proxy_pass finds.
            names.retain(|n| *n != lower);
            reg.wrapped.push((uscf, (*uscf).peer.init));
            (*uscf).peer.init = Some(peer_init);
        }
    }
}

/// The walk variant of a location's upstream configuration (see [`Registry::walk_confs`]).
///
/// # Safety
/// `conf` points at a location's `ngx_http_upstream_conf_t`, which lives as long as the cycle.
unsafe fn walk_conf(
    reg: &Registry,
    conf: *mut ngx_http_upstream_conf_t,
) -> *mut ngx_http_upstream_conf_t {
    let mut confs = reg.walk_confs.borrow_mut();
    if let Some((_, copy)) = confs.iter_mut().find(|(orig, _)| ptr::eq(*orig, conf)) {
        return &mut **copy;
    }
    // SAFETY: conf is valid (caller); the struct is plain data, copied by value.
    let mut copy = Box::new(unsafe { *conf });
    copy.ignore_headers |= NGX_HTTP_UPSTREAM_IGN_XA_REDIRECT as ngx_uint_t;
    copy.intercept_errors = 0;
    let p: *mut ngx_http_upstream_conf_t = &mut *copy;
    confs.push((conf, copy));
    p
}

unsafe extern "C" fn peer_init(
    r: *mut ngx_http_request_t,
    us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: r is the live request being connected to upstream us; the registry holds the
    // original peer.init for us; the walk variant of the location's upstream conf lives in the
    // registry (per worker) for the whole cycle.
    unsafe {
        let Some(reg) = registry(r) else {
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
        let ctx = find_ctx(r);
        if !ctx.is_null() {
            if (*(*ctx).walk).poisoned {
                return NGX_ERROR;
            }
            let u = (*r).upstream;
            if !u.is_null() && !(*u).conf.is_null() {
                (*u).conf = walk_conf(reg, (*u).conf);
            }
        }
        orig(r, us)
    }
}
