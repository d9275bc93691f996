//! Variables: `$upstrand_NAME` (one exact variable per `upstrand` block, so nginx itself rejects
//! `$upstrand_typo` at configuration time) and the status variables.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable_index, ngx_http_request_t, ngx_int_t,
    ngx_uint_t, ngx_variable_value_t, NGX_HTTP_VAR_NOCACHEABLE,
};
use upstrand_core::upstrand::vars::{format_entries, format_path, STATUS_SUFFIXES};

use super::request::{find_ctx, part_name, registry, upstrand_value, Role};
use crate::ffi_util::{borrowed, NGX_ERROR, NGX_OK};
use crate::http::{Req, VarSlot};

const PREFIX: &[u8] = b"upstrand_";
/// `data` of `$upstrand_path`; the status variables use their index in STATUS_SUFFIXES.
const PATH_DATA: usize = STATUS_SUFFIXES.len();

/// Registers the seven status variables and `$upstrand_path` (preconfiguration).
pub(super) fn register(cf: &mut ngx_conf_t) -> ngx_int_t {
    let suffixes = STATUS_SUFFIXES
        .iter()
        .copied()
        .chain(core::iter::once("path"));
    for (i, suffix) in suffixes.enumerate() {
        let full = [PREFIX, suffix.as_bytes()].concat();
        let mut name = borrowed(&full);
        // SAFETY: cf is the configuration being parsed; nginx copies the name; the returned
        // variable lives in the cycle.
        unsafe {
            let v = ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t);
            if v.is_null() {
                return NGX_ERROR;
            }
            (*v).get_handler = Some(status_variable);
            (*v).data = i;
        }
    }
    NGX_OK
}

/// Registers `$upstrand_NAME` for the upstrand at `index` of the configuration's registry
/// (called by the `upstrand` block handler, inside `http {}`). nginx logs why it refuses a name.
pub(super) fn register_upstrand(cf: &mut ngx_conf_t, name: &str, index: usize) -> bool {
    let full = [PREFIX, name.as_bytes()].concat();
    let mut s = borrowed(&full);
    // SAFETY: cf is the configuration being parsed; nginx copies the name; the variable lives
    // in the cycle.
    unsafe {
        let v = ngx_http_add_variable(cf, &mut s, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t);
        if v.is_null() {
            return false;
        }
        (*v).get_handler = Some(upstrand_variable);
        (*v).data = index;
    }
    true
}

/// `$upstrand_NAME`: `data` is the upstrand's index in the registry.
extern "C" fn upstrand_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls the handler with the live request and its value slot.
    let (Some(r), Some(mut v)) = (unsafe { (Req::from_ptr(r), VarSlot::from_ptr(v)) }) else {
        return NGX_ERROR;
    };
    match registry(r).and_then(|reg| reg.upstrands.get(data)) {
        Some(up) => upstrand_value(r, &mut v, up),
        None => {
            v.not_found();
            NGX_OK
        }
    }
}

/// Registers `$upstream_<suffix>` for every status suffix as an indexed variable (in
/// STATUS_SUFFIXES order), so that the status variables read them by index at run time
/// (postconfiguration, before nginx initialises variables).
pub(super) fn upstream_indexes(cf: &mut ngx_conf_t) -> Option<Vec<ngx_uint_t>> {
    STATUS_SUFFIXES
        .iter()
        .map(|suffix| {
            let name = format!("upstream_{suffix}");
            let mut s = borrowed(name.as_bytes());
            // SAFETY: cf is the configuration being parsed; nginx copies the name.
            let i = unsafe { ngx_http_get_variable_index(&mut *cf, &mut s) };
            ngx_uint_t::try_from(i).ok()
        })
        .collect()
}

/// `$upstrand_addr` & co. (`data` = index into STATUS_SUFFIXES) and `$upstrand_path`.
extern "C" fn status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls the handler with the live request and its value slot.
    let (Some(r), Some(mut v)) = (unsafe { (Req::from_ptr(r), VarSlot::from_ptr(v)) }) else {
        return NGX_ERROR;
    };
    let Some(ctx) = find_ctx(r).or_else(|| find_ctx(r.main())) else {
        v.not_found();
        return NGX_OK;
    };
    let walk = ctx.walk();
    let up = walk.upstrand();
    // The parts are copied out first: reading `$upstream_*` below runs nginx's variable code.
    let list: Vec<(Role, Req)> = walk.parts().map(|p| (p.role(), p.req())).collect();
    let text = if data == PATH_DATA {
        format_path(list.iter().map(|(role, _)| part_name(up, *role)))
    } else {
        let Some(&index) = registry(r).and_then(|reg| reg.upstream_indexes.get(data)) else {
            v.not_found();
            return NGX_OK;
        };
        let values: Vec<String> = list
            .iter()
            .map(|(_, part)| {
                part.variable(index)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            })
            .collect();
        format_entries(
            list.iter()
                .zip(&values)
                .map(|((role, _), val)| (part_name(up, *role), val.as_str())),
        )
    };
    if !v.set_copy(r, text.as_bytes()) {
        return NGX_ERROR;
    }
    NGX_OK
}
