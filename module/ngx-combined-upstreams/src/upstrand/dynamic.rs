//! `dynamic_upstrand $RESULT $VAR1 [$VAR2 ...] [LITERAL];` and its location configuration.

use core::ffi::{c_char, c_void};

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable_index,
    ngx_http_request_t, ngx_int_t, ngx_uint_t, ngx_variable_value_t, NGX_CONF_2MORE,
    NGX_HTTP_LIF_CONF, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_SRV_CONF,
    NGX_HTTP_VAR_CHANGEABLE, NGX_HTTP_VAR_NOCACHEABLE,
};
use upstrand_core::upstrand::dynamic::{choose, parse_args};

use super::request::{registry, upstrand_value};
use crate::conf_ext::ConfExt;
use crate::ffi_util::{borrowed, command, ConfFail, NGX_ERROR, NGX_OK};
use crate::http::{Req, VarSlot};

/// Directive table entry: `dynamic_upstrand $RESULT $VAR... [LITERAL]` (server, location, if in
/// location).
pub const COMMAND: ngx_command_t = command(
    c"dynamic_upstrand",
    NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF | NGX_HTTP_LIF_CONF | NGX_CONF_2MORE,
    handler,
    NGX_HTTP_LOC_CONF_OFFSET,
);

/// One `dynamic_upstrand` declaration (variable indexes of the request's variables array).
#[derive(Clone, Debug)]
struct Entry {
    result: ngx_uint_t,
    candidates: Vec<ngx_uint_t>,
    default: Option<String>,
}

/// Location configuration of the module: the `dynamic_upstrand` declarations in force and the
/// `upstreams_api` parameters of the location (in the configuration pool, dropped with it).
#[derive(Default)]
pub struct LocConf {
    entries: Vec<Entry>,
    /// `upstreams_api` of this location (not inherited: the directive sets the location's
    /// content handler).
    pub api_access: Option<upstrand_core::live::Access>,
}

/// `merge_loc_conf` hook: declarations of the enclosing level are inherited unless the same
/// result variable is declared again here.
pub extern "C" fn merge_loc_conf(
    _cf: *mut ngx_conf_t,
    parent: *mut c_void,
    child: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx passes two distinct LocConf values made by our create_loc_conf; nothing
    // else refers to them during the call.
    let (parent, child) = unsafe { (&*parent.cast::<LocConf>(), &mut *child.cast::<LocConf>()) };
    let inherited: Vec<Entry> = parent
        .entries
        .iter()
        .filter(|e| !child.entries.iter().any(|c| c.result == e.result))
        .cloned()
        .collect();
    child.entries.extend(inherited);
    NGX_CONF_OK
}

/// Index of variable `name` (without `$`), registering it as used.
fn variable_index(cf: &mut ngx_conf_t, name: &str) -> Option<ngx_uint_t> {
    let mut s = borrowed(name.as_bytes());
    // SAFETY: cf is the configuration being parsed; nginx copies the name.
    let i = unsafe { ngx_http_get_variable_index(cf, &mut s) };
    ngx_uint_t::try_from(i).ok()
}

extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is our LocConf of the current level (command registered with the loc conf
    // offset); cf is the configuration being parsed; nothing else refers to them during the
    // call.
    let (cf, lc) = unsafe { (&mut *cf, &mut *conf.cast::<LocConf>()) };
    let result = declare(cf, lc);
    cf.result(result)
}

/// Registers the result variable of one declaration and records the declaration in `lc`.
fn declare(cf: &mut ngx_conf_t, lc: &mut LocConf) -> Result<(), ConfFail> {
    let texts = cf.param_texts();
    let args: Vec<&str> = texts.iter().map(String::as_str).collect();
    let spec = parse_args(&args)?;
    let mut name = borrowed(spec.result.as_bytes());
    // SAFETY: cf is the configuration being parsed; nginx copies the name and logs why it
    // refuses one; the variable it returns lives in the cycle.
    let v = unsafe {
        ngx_http_add_variable(
            cf,
            &mut name,
            (NGX_HTTP_VAR_CHANGEABLE | NGX_HTTP_VAR_NOCACHEABLE) as ngx_uint_t,
        )
        .as_mut()
    };
    let v = v.ok_or(ConfFail::Logged)?;
    let result = variable_index(cf, &spec.result).ok_or(ConfFail::Logged)?;
    v.get_handler = Some(dynamic_variable);
    v.data = result;
    let candidates = spec
        .candidates
        .iter()
        .map(|c| variable_index(cf, c).ok_or(ConfFail::Logged))
        .collect::<Result<Vec<_>, _>>()?;
    lc.entries.retain(|e| e.result != result);
    lc.entries.push(Entry {
        result,
        candidates,
        default: spec.default,
    });
    Ok(())
}

/// Value of a `dynamic_upstrand` result variable (`data` = its index).
extern "C" fn dynamic_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls the handler with the live request and its value slot.
    let (Some(r), Some(mut v)) = (unsafe { (Req::from_ptr(r), VarSlot::from_ptr(v)) }) else {
        return NGX_ERROR;
    };
    let Some(entry) = r
        .loc_conf()
        .and_then(|lc| lc.entries.iter().find(|e| e.result == data))
    else {
        v.not_found();
        return NGX_OK;
    };
    let values: Vec<Option<Vec<u8>>> = entry.candidates.iter().map(|i| r.variable(*i)).collect();
    let chosen = choose(
        values.iter().map(|o| o.as_deref()),
        entry.default.as_deref(),
    );
    match chosen.and_then(|name| registry(r).and_then(|reg| reg.find(&name))) {
        Some(up) => upstrand_value(r, &mut v, up),
        None => {
            // Empty value: `proxy_pass http://$RESULT` then fails with 500.
            v.set_static(b"");
            NGX_OK
        }
    }
}
