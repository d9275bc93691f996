//! Variables: `$upstrand_NAME` (one exact variable per `upstrand` block, so nginx itself rejects
//! `$upstrand_typo` at configuration time) and the status variables.

use ngx::ffi::{ngx_conf_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE};
use upstrand_core::upstrand::vars::{format_entries, format_path, STATUS_SUFFIXES};

use super::request::{find_ctx, part_name, upstrand_value, Role};
use super::Registry;
use crate::ffi::conf::ConfPart;
use crate::ffi::request::Req;
use crate::ffi::variables::{add_variable, variable_index, VarSlot, Variable};
use crate::ffi::Status;

const PREFIX: &[u8] = b"upstrand_";
/// `data` of `$upstrand_path`; the status variables use their index in STATUS_SUFFIXES.
const PATH_DATA: usize = STATUS_SUFFIXES.len();

/// Registers the seven status variables and `$upstrand_path` (preconfiguration).
pub(super) fn register(cf: &mut ngx_conf_t) -> Status {
    let suffixes = STATUS_SUFFIXES
        .iter()
        .copied()
        .chain(core::iter::once("path"));
    for (i, suffix) in suffixes.enumerate() {
        let full = [PREFIX, suffix.as_bytes()].concat();
        let Some(v) = add_variable(cf, &full, NGX_HTTP_VAR_NOCACHEABLE) else {
            return Status::NGX_ERROR;
        };
        v.set_handler::<StatusVariable>(i);
    }
    Status::NGX_OK
}

/// Registers `$upstrand_NAME` for the upstrand at `index` of the configuration's registry
/// (called by the `upstrand` block handler, inside `http {}`). nginx logs why it refuses a name.
pub(super) fn register_upstrand(cf: &mut ngx_conf_t, name: &str, index: usize) -> bool {
    let full = [PREFIX, name.as_bytes()].concat();
    let Some(v) = add_variable(cf, &full, NGX_HTTP_VAR_NOCACHEABLE) else {
        return false;
    };
    v.set_handler::<UpstrandVariable>(index);
    true
}

/// `$upstrand_NAME`: `data` is the upstrand's index in the registry.
struct UpstrandVariable;

impl Variable for UpstrandVariable {
    fn get(r: Req, v: &mut VarSlot, data: usize) -> Status {
        match Registry::of_request(r).and_then(|reg| reg.upstrands.get(data)) {
            Some(up) => upstrand_value(r, v, up),
            None => {
                v.not_found();
                Status::NGX_OK
            }
        }
    }
}

/// Registers `$upstream_<suffix>` for every status suffix as an indexed variable (in
/// STATUS_SUFFIXES order), so that the status variables read them by index at run time
/// (postconfiguration, before nginx initialises variables).
pub(super) fn upstream_indexes(cf: &mut ngx_conf_t) -> Option<Vec<ngx_uint_t>> {
    STATUS_SUFFIXES
        .iter()
        .map(|suffix| variable_index(cf, format!("upstream_{suffix}").as_bytes()))
        .collect()
}

/// `$upstrand_addr` & co. (`data` = index into STATUS_SUFFIXES) and `$upstrand_path`.
struct StatusVariable;

impl Variable for StatusVariable {
    fn get(r: Req, v: &mut VarSlot, data: usize) -> Status {
        let Some(ctx) = find_ctx(r).or_else(|| find_ctx(r.main())) else {
            v.not_found();
            return Status::NGX_OK;
        };
        let walk = ctx.walk();
        let up = walk.upstrand();
        // The parts are copied out first: reading `$upstream_*` below runs nginx's variable
        // code.
        let list: Vec<(Role, Req)> = walk.parts().map(|p| (p.role(), p.req())).collect();
        let text = if data == PATH_DATA {
            format_path(list.iter().map(|(role, _)| part_name(up, *role)))
        } else {
            let Some(&index) =
                Registry::of_request(r).and_then(|reg| reg.upstream_indexes.get(data))
            else {
                v.not_found();
                return Status::NGX_OK;
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
            return Status::NGX_ERROR;
        }
        Status::NGX_OK
    }
}
