//! The `upstrand NAME { ... }` block directive.

use core::cell::RefCell;
use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_http_conf_ctx_t, ngx_http_upstream_main_conf_t,
    ngx_http_upstream_module, ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_regex_compile,
    ngx_regex_compile_t, ngx_regex_exec, ngx_str_t, NGX_MAX_CONF_ERRSTR,
};
use upstrand_core::upstrand::conf::{check_unique, Matcher, UpstrandBuilder};
use upstrand_core::upstrand::vars::is_reserved_suffix;

use super::{registry_for_conf, Upstrand};
use crate::conf::MainConf;
use crate::ffi_util::{borrowed, bytes, conf_args, conf_error, pool_copy};

/// Parsing state shared with the inner-directive handler.
struct BlockParse {
    builder: UpstrandBuilder,
}

/// Upstreams of the configuration so far that `proxy_pass http://NAME` can address by name
/// (explicit `upstream` blocks and upstreams created like them: port 0), in definition order.
///
/// # Safety
/// `cf` is the configuration nginx is parsing, inside `http {}`.
pub(super) unsafe fn named_upstreams(
    cf: *mut ngx_conf_t,
) -> Vec<(*mut ngx_http_upstream_srv_conf_t, &'static [u8])> {
    // SAFETY: inside http{} cf->ctx is the http conf ctx; the upstream module's main conf holds
    // an array of ngx_http_upstream_srv_conf_t pointers that live as long as the cycle.
    unsafe {
        let ctx = (*cf).ctx.cast::<ngx_http_conf_ctx_t>();
        let umcf = (*(*ctx).main_conf.add(ngx_http_upstream_module.ctx_index))
            .cast::<ngx_http_upstream_main_conf_t>();
        if umcf.is_null() {
            return Vec::new();
        }
        let arr = &(*umcf).upstreams;
        let elts = arr.elts.cast::<*mut ngx_http_upstream_srv_conf_t>();
        (0..arr.nelts)
            .map(|i| *elts.add(i))
            .filter(|u| !u.is_null() && (**u).port == 0)
            .map(|u| (u, bytes(&(*u).host)))
            .collect()
    }
}

/// Compiles `pattern` with nginx's regex engine (PCRE), case-sensitive, unanchored.
///
/// # Safety
/// `cf` is the configuration nginx is parsing.
unsafe fn compile(cf: *mut ngx_conf_t, pattern: &str) -> Result<Matcher, String> {
    let mut err = [0u8; NGX_MAX_CONF_ERRSTR as usize];
    // SAFETY: cf->pool is live; the pattern is copied into it because the compiled regex may
    // keep pointing at it; rc is fully initialised before use (zeroed C struct).
    unsafe {
        let mut rc: ngx_regex_compile_t = core::mem::zeroed();
        rc.pattern = pool_copy((*cf).pool, pattern.as_bytes()).ok_or("out of memory")?;
        rc.pool = (*cf).pool;
        rc.err = ngx_str_t {
            len: err.len(),
            data: err.as_mut_ptr(),
        };
        if ngx_regex_compile(&mut rc) != 0 {
            let len = rc.err.len.min(err.len());
            return Err(String::from_utf8_lossy(&err[..len]).into_owned());
        }
        let re = rc.regex;
        Ok(Box::new(move |name: &str| {
            let mut s = borrowed(name.as_bytes());
            // re is a compiled regex from the configuration pool; s borrows name for the call;
            // no captures are requested.
            let n: ngx_int_t = ngx_regex_exec(re, &mut s, ptr::null_mut(), 0);
            n >= 0
        }))
    }
}

fn text(arg: &[u8]) -> Result<&str, String> {
    core::str::from_utf8(arg)
        .map_err(|_| format!("invalid parameter \"{}\"", String::from_utf8_lossy(arg)))
}

/// Handler of each directive inside the block (`cf->handler`).
unsafe extern "C" fn upstrand_inner(
    cf: *mut ngx_conf_t,
    _dummy: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is the BlockParse that upstrand_block put into cf->handler_conf for the
    // duration of ngx_conf_parse; cf is the configuration being parsed.
    unsafe {
        let st = &mut *conf.cast::<BlockParse>();
        let raw = conf_args(cf);
        let mut args = Vec::with_capacity(raw.len());
        for a in &raw {
            match text(a) {
                Ok(t) => args.push(t),
                Err(e) => return conf_error(cf, &e),
            }
        }
        let known: Vec<String> = named_upstreams(cf)
            .into_iter()
            .map(|(_, n)| String::from_utf8_lossy(n).into_owned())
            .collect();
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        let mut compile_fn = |p: &str| compile(cf, p);
        match st.builder.directive(&args, &known, &mut compile_fn) {
            Ok(()) => NGX_CONF_OK,
            Err(e) => conf_error(cf, &e),
        }
    }
}

/// `upstrand NAME { ... }`
pub(super) unsafe extern "C" fn upstrand_block(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's main configuration (command registered with the main conf
    // offset); cf is the configuration being parsed; the saved copy of *cf is restored right
    // after the nested parse, as nginx's own block directives do.
    unsafe {
        let args = conf_args(cf);
        let name = match text(args[1]) {
            Ok(n) => n.to_string(),
            Err(_) => {
                let shown = String::from_utf8_lossy(args[1]).into_owned();
                return conf_error(cf, &format!("invalid upstrand name \"{shown}\""));
            }
        };
        if is_reserved_suffix(&name.to_ascii_lowercase()) {
            return conf_error(cf, &format!("invalid upstrand name \"{name}\": reserved"));
        }
        let Some(reg) = registry_for_conf(cf, conf.cast::<MainConf>()) else {
            return conf_error(cf, "out of memory");
        };
        if let Err(e) = check_unique(reg.upstrands.iter().map(|u| u.conf.name.as_str()), &name) {
            return conf_error(cf, &e);
        }
        let builder = match UpstrandBuilder::new(&name) {
            Ok(b) => b,
            Err(e) => return conf_error(cf, &e),
        };
        let mut st = BlockParse { builder };
        let saved = *cf;
        (*cf).handler = Some(upstrand_inner);
        (*cf).handler_conf = ptr::addr_of_mut!(st).cast::<c_void>();
        let rv = ngx_conf_parse(cf, ptr::null_mut());
        *cf = saved;
        if rv != NGX_CONF_OK {
            return rv;
        }
        let conf = match st.builder.finish() {
            Ok(c) => c,
            Err(e) => return conf_error(cf, &e),
        };
        reg.upstrands.push(Upstrand {
            conf,
            state: RefCell::new(None),
        });
        NGX_CONF_OK
    }
}
