//! Variables: `$upstrand_NAME` (prefix variable) and the status variables.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_flushed_variable, ngx_http_get_variable_index,
    ngx_http_request_t, ngx_int_t, ngx_uint_t, ngx_variable_value_t, NGX_HTTP_VAR_NOCACHEABLE,
    NGX_HTTP_VAR_PREFIX,
};
use upstrand_core::upstrand::vars::{format_entries, format_path, STATUS_SUFFIXES};

use super::request::{find_ctx, registry, upstrand_value};
use crate::ffi_util::{borrowed, bytes, set_not_found, set_value_copy, NGX_ERROR, NGX_OK};

const PREFIX: &[u8] = b"upstrand_";
/// `data` of `$upstrand_path`; the status variables use their index in STATUS_SUFFIXES.
const PATH_DATA: usize = STATUS_SUFFIXES.len();

/// Registers `$upstrand_` (prefix), the seven status variables and `$upstrand_path`.
///
/// # Safety
/// `cf` is the configuration nginx is parsing (preconfiguration).
pub(super) unsafe fn register(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: cf is valid; nginx copies the names; the returned variables live in the cycle.
    unsafe {
        let mut name = borrowed(PREFIX);
        let v = ngx_http_add_variable(
            cf,
            &mut name,
            (NGX_HTTP_VAR_PREFIX | NGX_HTTP_VAR_NOCACHEABLE) as ngx_uint_t,
        );
        if v.is_null() {
            return NGX_ERROR;
        }
        (*v).get_handler = Some(upstrand_variable);
        (*v).data = 0;
        let suffixes = STATUS_SUFFIXES
            .iter()
            .copied()
            .chain(core::iter::once("path"));
        for (i, suffix) in suffixes.enumerate() {
            let full = [PREFIX, suffix.as_bytes()].concat();
            let mut name = borrowed(&full);
            let v = ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t);
            if v.is_null() {
                return NGX_ERROR;
            }
            (*v).get_handler = Some(status_variable);
            (*v).data = i;
        }
        NGX_OK
    }
}

/// `$upstrand_NAME`: `data` points at the full variable name.
unsafe extern "C" fn upstrand_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx passes the variable's name (an ngx_str_t that lives in the cycle) as data
    // for prefix variables; r and v are live.
    unsafe {
        let full = bytes(&*(data as *const ngx::ffi::ngx_str_t));
        let suffix = full.get(PREFIX.len()..).unwrap_or(&[]);
        let Some(up) = registry(r).and_then(|reg| reg.find(suffix)) else {
            set_not_found(v);
            return NGX_OK;
        };
        upstrand_value(r, v, up)
    }
}

/// Registers `$upstream_<suffix>` for every status suffix as an indexed variable (in
/// STATUS_SUFFIXES order), so that the status variables read them by index at run time.
///
/// # Safety
/// `cf` is the configuration nginx is parsing, before its variables are initialised
/// (postconfiguration).
pub(super) unsafe fn upstream_indexes(cf: *mut ngx_conf_t) -> Option<Vec<ngx_uint_t>> {
    STATUS_SUFFIXES
        .iter()
        .map(|suffix| {
            let name = format!("upstream_{suffix}");
            let mut s = borrowed(name.as_bytes());
            // SAFETY: cf is valid (caller); nginx copies the name.
            let i = unsafe { ngx_http_get_variable_index(cf, &mut s) };
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
unsafe extern "C" fn status_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: r and v are live; contexts and walks are ours and live as long as the tree.
    unsafe {
        let mut ctx = find_ctx(r);
        if ctx.is_null() {
            ctx = find_ctx((*r).main);
        }
        if ctx.is_null() {
            set_not_found(v);
            return NGX_OK;
        }
        let w = &*(*ctx).walk;
        let roles: Vec<_> = w.parts().map(|c| (*c).role).collect();
        let text = if data == PATH_DATA {
            format_path(roles.iter().map(|role| w.part_name(*role)))
        } else {
            let Some(&index) = registry(r).and_then(|reg| reg.upstream_indexes.get(data)) else {
                set_not_found(v);
                return NGX_OK;
            };
            let values: Vec<String> = w.parts().map(|c| indexed_value((*c).r, index)).collect();
            format_entries(
                roles
                    .iter()
                    .zip(&values)
                    .map(|(role, val)| (w.part_name(*role), val.as_str())),
            )
        };
        if !set_value_copy(r, v, text.as_bytes()) {
            return NGX_ERROR;
        }
        NGX_OK
    }
}
