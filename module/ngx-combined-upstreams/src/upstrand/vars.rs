//! Variables: `$upstrand_NAME` (one exact variable per `upstrand` block, so nginx itself rejects
//! `$upstrand_typo` at configuration time) and the status variables.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_flushed_variable, ngx_http_get_variable_index,
    ngx_http_request_t, ngx_int_t, ngx_uint_t, ngx_variable_value_t, NGX_HTTP_VAR_NOCACHEABLE,
};
use upstrand_core::upstrand::vars::{format_entries, format_path, STATUS_SUFFIXES};

use super::request::{find_ctx, part_name, parts, registry, upstrand_value, walk_upstrand, Role};
use crate::ffi_util::{borrowed, set_not_found, set_value_copy, NGX_ERROR, NGX_OK};

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
    // SAFETY: r and v are live (nginx calls the handler with them); the registry of r's
    // configuration is the one the variable was registered in.
    unsafe {
        let Some(up) = registry(r).and_then(|reg| reg.upstrands.get(data)) else {
            set_not_found(v);
            return NGX_OK;
        };
        upstrand_value(r, v, up)
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

/// Copies the value of the indexed variable `index` of request `r` (empty when not found).
unsafe fn indexed_value(r: *mut ngx_http_request_t, index: ngx_uint_t) -> String {
    // SAFETY: r is a live request of the tree and index a registered variable index; the
    // returned value (possibly a slot shared with the parent request) is copied at once.
    unsafe {
        let vv = ngx_http_get_flushed_variable(r, index);
        // Like nginx itself, trust `not_found` only: handlers that report "not found" may leave
        // the other fields unset.
        if vv.is_null() || (*vv).not_found() != 0 {
            return String::new();
        }
        let len = (*vv).len() as usize;
        if (*vv).data.is_null() || len == 0 {
            return String::new();
        }
        String::from_utf8_lossy(core::slice::from_raw_parts((*vv).data, len)).into_owned()
    }
}

/// `$upstrand_addr` & co. (`data` = index into STATUS_SUFFIXES) and `$upstrand_path`.
extern "C" fn status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: r and v are live; contexts and walks are ours and live as long as the tree. The
    // parts are copied out first: reading `$upstream_*` below runs nginx's variable code, so no
    // reference to walk state is held across it.
    unsafe {
        let mut ctx = find_ctx(r);
        if ctx.is_null() {
            ctx = find_ctx((*r).main);
        }
        if ctx.is_null() {
            set_not_found(v);
            return NGX_OK;
        }
        let w = (*ctx).walk;
        let up = walk_upstrand(w);
        let list: Vec<(Role, *mut ngx_http_request_t)> =
            parts(w).map(|c| ((*c).role, (*c).r)).collect();
        let text = if data == PATH_DATA {
            format_path(list.iter().map(|(role, _)| part_name(up, *role)))
        } else {
            let Some(&index) = registry(r).and_then(|reg| reg.upstream_indexes.get(data)) else {
                set_not_found(v);
                return NGX_OK;
            };
            let values: Vec<String> = list
                .iter()
                .map(|(_, part)| indexed_value(*part, index))
                .collect();
            format_entries(
                list.iter()
                    .zip(&values)
                    .map(|((role, _), val)| (part_name(up, *role), val.as_str())),
            )
        };
        if !set_value_copy(r, v, text.as_bytes()) {
            return NGX_ERROR;
        }
        NGX_OK
    }
}
