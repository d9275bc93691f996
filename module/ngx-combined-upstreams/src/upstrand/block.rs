//! The `upstrand NAME { ... }` block directive.

use core::cell::RefCell;
use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_http_upstream_srv_conf_t, ngx_int_t,
    ngx_regex_compile, ngx_regex_compile_t, ngx_regex_exec, ngx_str_t, NGX_CONF_BLOCK,
    NGX_CONF_TAKE1, NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_MAX_CONF_ERRSTR,
};
use upstrand_core::upstrand::conf::{check_unique, Matcher, UpstrandBuilder};
use upstrand_core::upstrand::vars::is_reserved_suffix;

use super::{registry_for_conf, vars, Upstrand};
use crate::conf::MainConf;
use crate::ffi_util::{borrowed, bytes, command, conf_args, conf_result, pool_copy, ConfFail};
use crate::upstreams;

/// Directive table entry: `upstrand NAME { ... }` (http).
pub const COMMAND: ngx_command_t = command(
    c"upstrand",
    NGX_HTTP_MAIN_CONF | NGX_CONF_BLOCK | NGX_CONF_TAKE1,
    handler,
    NGX_HTTP_MAIN_CONF_OFFSET,
);

/// Upstreams of the configuration so far that `proxy_pass http://NAME` can address by name
/// (explicit `upstream` blocks and upstreams created like them: port 0), in definition order.
///
/// # Safety
/// `cf` is the configuration nginx is parsing, inside `http {}`.
pub(super) unsafe fn named_upstreams(
    cf: *mut ngx_conf_t,
) -> Vec<(*mut ngx_http_upstream_srv_conf_t, &'static [u8])> {
    // SAFETY: every entry of the upstream list is null or an upstream conf that lives as long
    // as the cycle (and so does its host name).
    unsafe {
        upstreams::all(cf)
            .iter()
            .copied()
            .filter(|u| !u.is_null() && (**u).port == 0)
            .map(|u| (u, bytes(&(*u).host)))
            .collect()
    }
}

/// Compiles `pattern` with nginx's regex engine (PCRE), case-sensitive, unanchored. The matcher
/// is used while the `upstream ~REGEX` directive is handled (the regex lives in the
/// configuration pool).
///
/// # Safety
/// `cf` is the configuration nginx is parsing.
unsafe fn compile(cf: *mut ngx_conf_t, pattern: &str) -> Result<Matcher, String> {
    let mut err = [0u8; NGX_MAX_CONF_ERRSTR as usize];
    // SAFETY: cf->pool is live; the pattern is copied into it because the compiled regex may
    // keep pointing at it; rc is a zeroed C struct whose used fields are set before the call;
    // err outlives the call that writes into it.
    let re = unsafe {
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
        rc.regex
    };
    Ok(Box::new(move |name: &str| {
        let mut s = borrowed(name.as_bytes());
        // SAFETY: re is a compiled regex in the configuration pool, alive while the directive
        // is handled; s borrows name for the call; no captures are requested.
        let n: ngx_int_t = unsafe { ngx_regex_exec(re, &mut s, ptr::null_mut(), 0) };
        n >= 0
    }))
}

fn text(arg: &[u8]) -> Result<&str, String> {
    core::str::from_utf8(arg)
        .map_err(|_| format!("invalid parameter \"{}\"", String::from_utf8_lossy(arg)))
}

/// Handler of each directive inside the block (`cf->handler`).
unsafe extern "C" fn inner_handler(
    cf: *mut ngx_conf_t,
    _dummy: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is the UpstrandBuilder that `handler` put into cf->handler_conf for the
    // duration of ngx_conf_parse; cf is the configuration being parsed.
    unsafe {
        conf_result(
            cf,
            inner_directive(cf, &mut *conf.cast::<UpstrandBuilder>()),
        )
    }
}

/// One directive inside the block, added to `builder`.
///
/// # Safety
/// `cf` is the configuration nginx is parsing, inside the block.
unsafe fn inner_directive(
    cf: *mut ngx_conf_t,
    builder: &mut UpstrandBuilder,
) -> Result<(), ConfFail> {
    // SAFETY: forwarded from the caller.
    let (raw, named) = unsafe { (conf_args(cf), named_upstreams(cf)) };
    let args = raw.iter().map(|a| text(a)).collect::<Result<Vec<_>, _>>()?;
    let known: Vec<String> = named
        .into_iter()
        .map(|(_, n)| String::from_utf8_lossy(n).into_owned())
        .collect();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    // SAFETY: cf is the configuration being parsed (caller).
    let mut compile_fn = |p: &str| unsafe { compile(cf, p) };
    Ok(builder.directive(&args, &known, &mut compile_fn)?)
}

/// `upstrand NAME { ... }`
unsafe extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's main configuration (command registered with the main conf
    // offset); cf is the configuration being parsed.
    unsafe { conf_result(cf, block(cf, conf.cast::<MainConf>())) }
}

/// Parses the block and registers the upstrand in the configuration's registry.
///
/// # Safety
/// `cf` is the configuration being parsed, at an `upstrand` directive; `mc` this module's main
/// configuration.
unsafe fn block(cf: *mut ngx_conf_t, mc: *mut MainConf) -> Result<(), ConfFail> {
    // SAFETY: forwarded from the caller; NGX_CONF_TAKE1 guarantees the name argument.
    let arg = unsafe { conf_args(cf)[1] };
    let Ok(name) = text(arg) else {
        let shown = String::from_utf8_lossy(arg);
        return Err(format!("invalid upstrand name \"{shown}\"").into());
    };
    if is_reserved_suffix(&name.to_ascii_lowercase()) {
        return Err(format!("invalid upstrand name \"{name}\": reserved").into());
    }
    // SAFETY: forwarded from the caller.
    let reg = unsafe { registry_for_conf(cf, mc) }.ok_or("out of memory")?;
    check_unique(reg.upstrands.iter().map(|u| u.conf.name.as_str()), name)?;
    let mut builder = UpstrandBuilder::new(name)?;
    // SAFETY: the saved copy of *cf is restored right after the nested parse, as nginx's own
    // block directives do; the builder outlives the parse that points at it.
    let rv = unsafe {
        let saved = *cf;
        (*cf).handler = Some(inner_handler);
        (*cf).handler_conf = ptr::addr_of_mut!(builder).cast::<c_void>();
        let rv = ngx_conf_parse(cf, ptr::null_mut());
        *cf = saved;
        rv
    };
    if rv != NGX_CONF_OK {
        return Err(ConfFail::Logged);
    }
    let conf = builder.finish()?;
    // SAFETY: cf is the configuration being parsed, inside http{} (caller).
    if !unsafe { vars::register_upstrand(cf, &conf.name, reg.upstrands.len()) } {
        return Err(ConfFail::Logged);
    }
    reg.upstrands.push(Upstrand {
        conf,
        state: RefCell::new(None),
    });
    Ok(())
}
