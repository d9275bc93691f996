//! Access to nginx's upstream configuration (`ngx_http_upstream_module`'s structures) for the
//! directives that work inside `upstream {}`.

use core::ffi::{c_char, c_void};
use core::{mem, ptr, slice};

use ngx::ffi::{
    ngx_array_create, ngx_array_push, ngx_conf_t, ngx_http_conf_ctx_t, ngx_http_max_module,
    ngx_http_module_t, ngx_http_upstream_add, ngx_http_upstream_main_conf_t,
    ngx_http_upstream_module, ngx_http_upstream_server_t, ngx_http_upstream_srv_conf_t,
    ngx_pcalloc, ngx_url_t, NGX_HTTP_MODULE, NGX_HTTP_UPSTREAM_BACKUP, NGX_HTTP_UPSTREAM_CREATE,
    NGX_HTTP_UPSTREAM_DOWN, NGX_HTTP_UPSTREAM_FAIL_TIMEOUT, NGX_HTTP_UPSTREAM_MAX_CONNS,
    NGX_HTTP_UPSTREAM_MAX_FAILS, NGX_HTTP_UPSTREAM_WEIGHT,
};
use upstrand_core::{ConfError, ServerFlags};

use crate::ffi_util::{bytes, conf_args, conf_result, pool_copy, ConfFail};

/// The flags nginx gives an explicit `upstream {}` block (plain round robin).
pub const ROUND_ROBIN_FLAGS: u32 = NGX_HTTP_UPSTREAM_CREATE
    | NGX_HTTP_UPSTREAM_WEIGHT
    | NGX_HTTP_UPSTREAM_MAX_CONNS
    | NGX_HTTP_UPSTREAM_MAX_FAILS
    | NGX_HTTP_UPSTREAM_FAIL_TIMEOUT
    | NGX_HTTP_UPSTREAM_DOWN
    | NGX_HTTP_UPSTREAM_BACKUP;

/// The upstream whose block is being parsed.
///
/// # Safety
/// Only from a handler of a directive with context `NGX_HTTP_UPS_CONF`.
pub unsafe fn current(cf: *mut ngx_conf_t) -> *mut ngx_http_upstream_srv_conf_t {
    // SAFETY: inside `upstream {}`, cf->ctx is the block's ngx_http_conf_ctx_t whose srv_conf
    // slot of ngx_http_upstream_module holds the block's ngx_http_upstream_srv_conf_t.
    unsafe {
        let ctx = (*cf).ctx as *mut ngx_http_conf_ctx_t;
        let idx = (*ptr::addr_of!(ngx_http_upstream_module)).ctx_index;
        *(*ctx).srv_conf.add(idx) as *mut ngx_http_upstream_srv_conf_t
    }
}

/// The body of a handler of a directive inside `upstream {}` whose arguments the pure crate
/// parses: `parse` gets the arguments (without the directive name), then `apply` runs with the
/// upstream being parsed; a failure of either is logged as `[emerg]` (see
/// [`conf_result`]).
///
/// # Safety
/// Only from a handler of a directive with context `NGX_HTTP_UPS_CONF`; `apply` may assume
/// that its `cf` is that configuration and its upstream the one being parsed.
pub unsafe fn handle_directive<T>(
    cf: *mut ngx_conf_t,
    parse: fn(&[&[u8]]) -> Result<T, ConfError>,
    apply: unsafe fn(*mut ngx_conf_t, *mut ngx_http_upstream_srv_conf_t, T) -> Result<(), ConfFail>,
) -> *mut c_char {
    // SAFETY: as required of the caller; the arguments live in the configuration pool.
    unsafe {
        let result = match parse(&conf_args(cf)[1..]) {
            Ok(opts) => apply(cf, current(cf), opts),
            Err(e) => Err(e.into()),
        };
        conf_result(cf, result)
    }
}

/// Every upstream known so far (explicit blocks, singlets, implicit ones from `proxy_pass`).
///
/// # Safety
/// `cf` must be the configuration nginx is parsing, inside `http {}`.
pub unsafe fn all<'a>(cf: *mut ngx_conf_t) -> &'a [*mut ngx_http_upstream_srv_conf_t] {
    // SAFETY: inside http {}, cf->ctx's main_conf holds the upstream module's main conf, whose
    // `upstreams` is an array of ngx_http_upstream_srv_conf_t pointers.
    unsafe {
        let ctx = (*cf).ctx as *mut ngx_http_conf_ctx_t;
        let idx = (*ptr::addr_of!(ngx_http_upstream_module)).ctx_index;
        let umcf = *(*ctx).main_conf.add(idx) as *mut ngx_http_upstream_main_conf_t;
        let a = &(*umcf).upstreams;
        if a.nelts == 0 {
            return &[];
        }
        slice::from_raw_parts(a.elts as *const *mut ngx_http_upstream_srv_conf_t, a.nelts)
    }
}

/// The upstream named `name` (ASCII case-insensitive, like nginx); an explicit one wins over an
/// implicit one of the same host.
///
/// # Safety
/// As for [`all`].
pub unsafe fn find(cf: *mut ngx_conf_t, name: &[u8]) -> Option<*mut ngx_http_upstream_srv_conf_t> {
    let mut implicit = None;
    // SAFETY: as for `all`; every entry is a valid upstream conf.
    for &u in unsafe { all(cf) } {
        // SAFETY: see above.
        let (host, flags) = unsafe { (bytes(&(*u).host), (*u).flags) };
        if host.eq_ignore_ascii_case(name) {
            if flags & NGX_HTTP_UPSTREAM_CREATE as usize != 0 {
                return Some(u);
            }
            implicit.get_or_insert(u);
        }
    }
    implicit
}

/// The servers of an upstream (empty when it has no server list).
///
/// # Safety
/// `u` must be a valid upstream conf; the slice is invalidated by a push to the same list.
pub unsafe fn servers<'a>(
    u: *mut ngx_http_upstream_srv_conf_t,
) -> &'a [ngx_http_upstream_server_t] {
    // SAFETY: `servers` is null or an ngx_array_t of ngx_http_upstream_server_t.
    unsafe {
        let a = (*u).servers;
        if a.is_null() || (*a).nelts == 0 {
            return &[];
        }
        slice::from_raw_parts((*a).elts as *const ngx_http_upstream_server_t, (*a).nelts)
    }
}

/// Appends a copy of `server` to the server list of `u` (created if missing); out of memory is
/// [`ConfFail::Logged`].
///
/// # Safety
/// `cf` is the configuration being parsed and `u` a valid upstream conf of it.
pub unsafe fn push_server(
    cf: *mut ngx_conf_t,
    u: *mut ngx_http_upstream_srv_conf_t,
    server: &ngx_http_upstream_server_t,
) -> Result<(), ConfFail> {
    // SAFETY: the list is an ngx_array_t of ngx_http_upstream_server_t from the config pool;
    // ngx_array_push returns room for one element or null.
    unsafe {
        if (*u).servers.is_null() {
            (*u).servers =
                ngx_array_create((*cf).pool, 4, mem::size_of::<ngx_http_upstream_server_t>());
            if (*u).servers.is_null() {
                return Err(ConfFail::Logged);
            }
        }
        let slot = ngx_array_push((*u).servers) as *mut ngx_http_upstream_server_t;
        if slot.is_null() {
            return Err(ConfFail::Logged);
        }
        slot.write(*server);
    }
    Ok(())
}

/// The flags of a server entry, as plain values.
pub fn flags_of(s: &ngx_http_upstream_server_t) -> ServerFlags {
    ServerFlags {
        weight: s.weight as u64,
        backup: s.backup() != 0,
        down: s.down != 0,
    }
}

/// Applies plain flags to a server entry.
pub fn set_flags(s: &mut ngx_http_upstream_server_t, f: ServerFlags) {
    s.weight = f.weight as _;
    s.set_backup(f.backup as _);
    s.down = f.down as _;
}

/// The address text of a server as written in its `server` line (for a server of an implicit
/// upstream, which has none, the text of its first address).
///
/// # Safety
/// `s` must be a server entry of the configuration being parsed.
pub unsafe fn server_name<'a>(s: &ngx_http_upstream_server_t) -> &'a [u8] {
    // SAFETY: name and addrs come from the configuration pool.
    unsafe {
        let n = bytes(&s.name);
        if n.is_empty() && !s.addrs.is_null() && s.naddrs > 0 {
            return bytes(&(*s.addrs).name);
        }
        n
    }
}

/// Registers a new explicit round-robin upstream `name`, as if `upstream NAME {}` appeared at the
/// current line: nginx's own checks apply (`duplicate upstream "NAME"` is logged by nginx). Every
/// HTTP module gets a fresh server configuration for it, like for an `upstream {}` block.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing, inside `http {}`.
pub unsafe fn create(
    cf: *mut ngx_conf_t,
    name: &[u8],
) -> Option<*mut ngx_http_upstream_srv_conf_t> {
    // SAFETY: mirrors what nginx's `upstream` block handler does: ngx_url_t zeroed with the host
    // set, ngx_http_upstream_add with the CREATE flag, then one srv conf per HTTP module.
    unsafe {
        let mut url: ngx_url_t = mem::zeroed();
        url.host = pool_copy((*cf).pool, name)?;
        url.set_no_resolve(1);
        url.set_no_port(1);
        let u = ngx_http_upstream_add(cf, &mut url, ROUND_ROBIN_FLAGS as _);
        if u.is_null() {
            return None;
        }
        let max = *ptr::addr_of!(ngx_http_max_module);
        let srv_conf =
            ngx_pcalloc((*cf).pool, mem::size_of::<*mut c_void>() * max) as *mut *mut c_void;
        if srv_conf.is_null() {
            return None;
        }
        let cycle = (*cf).cycle;
        for i in 0..(*cycle).modules_n {
            let m = *(*cycle).modules.add(i);
            if m.is_null() || (*m).type_ != NGX_HTTP_MODULE as usize {
                continue;
            }
            let mctx = (*m).ctx as *const ngx_http_module_t;
            if let Some(create_srv_conf) = (*mctx).create_srv_conf {
                let c = create_srv_conf(cf);
                if c.is_null() {
                    return None;
                }
                *srv_conf.add((*m).ctx_index) = c;
            }
        }
        let idx = (*ptr::addr_of!(ngx_http_upstream_module)).ctx_index;
        *srv_conf.add(idx) = u.cast();
        (*u).srv_conf = srv_conf;
        (*u).servers =
            ngx_array_create((*cf).pool, 4, mem::size_of::<ngx_http_upstream_server_t>());
        if (*u).servers.is_null() {
            return None;
        }
        Some(u)
    }
}
