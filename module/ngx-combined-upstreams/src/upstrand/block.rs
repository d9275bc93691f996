//! The `upstrand NAME { ... }` block directive.

use core::cell::RefCell;
use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_int_t, ngx_regex_compile, ngx_regex_compile_t,
    ngx_regex_exec, ngx_str_t, NGX_CONF_BLOCK, NGX_CONF_TAKE1, NGX_HTTP_MAIN_CONF,
    NGX_HTTP_MAIN_CONF_OFFSET, NGX_MAX_CONF_ERRSTR,
};
use upstrand_core::upstrand::conf::{check_unique, Matcher, UpstrandBuilder};
use upstrand_core::upstreams::addressable;
use upstrand_core::ConfError;

use super::{registry_for_conf, vars, Upstrand};
use crate::conf::MainConf;
use crate::conf_ext::ConfExt;
use crate::ffi_util::{borrowed, command, ConfFail};
use crate::upstreams::{self, Upstream};

/// Directive table entry: `upstrand NAME { ... }` (http).
pub const COMMAND: ngx_command_t = command(
    c"upstrand",
    NGX_HTTP_MAIN_CONF | NGX_CONF_BLOCK | NGX_CONF_TAKE1,
    handler,
    NGX_HTTP_MAIN_CONF_OFFSET,
);

/// Upstreams of the configuration so far that `proxy_pass http://NAME` can address by name
/// (explicit `upstream` blocks and upstreams created like them: port 0), in definition order.
pub(super) fn named_upstreams(cf: &ngx_conf_t) -> Vec<Upstream> {
    let list = upstreams::all(cf);
    addressable(&upstreams::infos(&list))
        .into_iter()
        .map(|i| list[i])
        .collect()
}

/// Compiles `pattern` with nginx's regex engine (PCRE), case-sensitive, unanchored. The matcher
/// is used while the `upstream ~REGEX` directive is handled (the regex lives in the
/// configuration pool).
fn compile(cf: &ngx_conf_t, pattern: &str) -> Result<Matcher, String> {
    let mut err = [0u8; NGX_MAX_CONF_ERRSTR as usize];
    // The compiled regex may keep pointing at its pattern: copy it into the pool.
    let pattern = cf
        .copy_str(pattern.as_bytes())
        .ok_or_else(|| "out of memory".to_string())?;
    // SAFETY: rc is a zeroed C struct whose used fields are set before the call; the pool is the
    // live configuration pool; err outlives the call that writes into it.
    let re = unsafe {
        let mut rc: ngx_regex_compile_t = core::mem::zeroed();
        rc.pattern = pattern;
        rc.pool = cf.pool;
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

fn text(arg: &[u8]) -> Result<&str, ConfError> {
    core::str::from_utf8(arg)
        .map_err(|_| ConfError::InvalidParameter(String::from_utf8_lossy(arg).into_owned()))
}

/// Handler of each directive inside the block (`cf->handler`).
extern "C" fn inner_handler(
    cf: *mut ngx_conf_t,
    _dummy: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is the UpstrandBuilder that `block` put into cf->handler_conf for the
    // duration of ngx_conf_parse (nothing else refers to it meanwhile); cf is the
    // configuration being parsed.
    let (cf, builder) = unsafe { (&*cf, &mut *conf.cast::<UpstrandBuilder>()) };
    cf.result(inner_directive(cf, builder))
}

/// One directive inside the block, added to `builder`.
fn inner_directive(cf: &ngx_conf_t, builder: &mut UpstrandBuilder) -> Result<(), ConfFail> {
    let raw = cf.args();
    let args = raw.iter().map(|a| text(a)).collect::<Result<Vec<_>, _>>()?;
    let known: Vec<String> = named_upstreams(cf)
        .into_iter()
        .map(|u| String::from_utf8_lossy(u.host()).into_owned())
        .collect();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    let mut compile_fn = |p: &str| compile(cf, p);
    Ok(builder.directive(&args, &known, &mut compile_fn)?)
}

/// `upstrand NAME { ... }`
extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's main configuration (command registered with the main conf
    // offset); cf is the configuration being parsed; nothing else refers to either during the
    // call.
    let (cf, mc) = unsafe { (&mut *cf, &mut *conf.cast::<MainConf>()) };
    let result = block(cf, mc);
    cf.result(result)
}

/// Parses the block and registers the upstrand (and its `$upstrand_NAME`) in the
/// configuration's registry.
fn block(cf: &mut ngx_conf_t, mc: &mut MainConf) -> Result<(), ConfFail> {
    // NGX_CONF_TAKE1 guarantees the name argument.
    let arg = cf.args().get(1).copied().unwrap_or_default();
    let name = String::from_utf8_lossy(arg);
    // Checks the name (letters, digits, `_`; not a status variable's suffix) first.
    let mut builder = UpstrandBuilder::new(&name)?;
    let reg = registry_for_conf(mc);
    check_unique(reg.upstrands.iter().map(|u| u.conf.name.as_str()), &name)?;
    // The nested parse runs on a copy of *cf whose handler is `inner_handler`, as nginx's own
    // block directives do; the builder outlives the parse that points at it.
    let mut block_cf: ngx_conf_t = *cf;
    block_cf.handler = Some(inner_handler);
    block_cf.handler_conf = ptr::addr_of_mut!(builder).cast::<c_void>();
    // SAFETY: block_cf is a valid configuration (a copy of nginx's, positioned at the block).
    let rv = unsafe { ngx_conf_parse(&mut block_cf, ptr::null_mut()) };
    if rv != NGX_CONF_OK {
        return Err(ConfFail::Logged);
    }
    let conf = builder.finish()?;
    if !vars::register_upstrand(cf, &conf.name, reg.upstrands.len()) {
        return Err(ConfFail::Logged);
    }
    reg.upstrands.push(Upstrand {
        conf,
        state: RefCell::new(None),
    });
    Ok(())
}
