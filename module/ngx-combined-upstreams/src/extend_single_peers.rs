//! `extend_single_peers;` (context `upstream`): wraps the upstream's `init_upstream` so that, when
//! all servers are known, a part (primary or backup) with exactly one address gets a fake `down`
//! peer in the other part; stock round robin then counts the lone peer's failures.

use core::ffi::{c_char, c_void, CStr};
use core::ptr;

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_upstream_init_round_robin, ngx_http_upstream_server_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, NGX_CONF_NOARGS, NGX_HTTP_SRV_CONF_OFFSET,
    NGX_HTTP_UPS_CONF, NGX_LOG_WARN,
};
use upstrand_core::extend;

use crate::conf::SrvConf;
use crate::ffi_util::{bytes, command, log_at, NGX_ERROR};
use crate::upstreams;

/// Directive table entry.
pub const COMMAND: ngx_command_t = command(
    c"extend_single_peers",
    NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS,
    handler,
    NGX_HTTP_SRV_CONF_OFFSET,
);

unsafe extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: with NGX_HTTP_SRV_CONF_OFFSET nginx passes this module's SrvConf of the upstream
    // block being parsed; `current` is valid in NGX_HTTP_UPS_CONF context.
    unsafe {
        let conf = &mut *(conf as *mut SrvConf);
        if conf.extend_single_peers {
            return c"is duplicate".as_ptr() as *mut c_char;
        }
        let u = upstreams::current(cf);
        conf.extend_single_peers = true;
        conf.original_init_upstream = (*u).peer.init_upstream;
        (*u).peer.init_upstream = Some(init_upstream);
    }
    NGX_CONF_OK
}

/// This module's SrvConf of an upstream (null for implicit upstreams, which have none).
///
/// # Safety
/// `u` must be a valid upstream conf.
unsafe fn srv_conf(u: *mut ngx_http_upstream_srv_conf_t) -> *mut SrvConf {
    // SAFETY: srv_conf is null or an array of ngx_http_max_module pointers.
    unsafe {
        if (*u).srv_conf.is_null() {
            return ptr::null_mut();
        }
        *(*u).srv_conf.add(crate::ctx_index()) as *mut SrvConf
    }
}

unsafe extern "C" fn init_upstream(
    cf: *mut ngx_conf_t,
    u: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls init_upstream at the end of http {} with a valid upstream conf whose
    // srv_conf holds our SrvConf (this wrapper is only installed by `handler`).
    unsafe {
        let conf = &mut *srv_conf(u);
        conf.extend_single_peers_ran = true;
        let list = upstreams::servers(u);
        let count = |backup: bool| -> usize {
            list.iter()
                .filter(|s| (s.backup() != 0) == backup)
                .map(|s| s.naddrs)
                .sum()
        };
        let plan = extend::plan(count(false), count(true));
        let lone_primary = list
            .iter()
            .find(|s| s.backup() == 0 && s.naddrs > 0)
            .copied();
        let lone_backup = list
            .iter()
            .find(|s| s.backup() != 0 && s.naddrs > 0)
            .copied();
        if plan.fake_backup {
            if let Some(s) = lone_primary {
                if upstreams::push_server(cf, u, &fake(s, true)).is_err() {
                    return NGX_ERROR;
                }
            }
        }
        if plan.fake_primary {
            if let Some(s) = lone_backup {
                if upstreams::push_server(cf, u, &fake(s, false)).is_err() {
                    return NGX_ERROR;
                }
            }
        }
        match conf.original_init_upstream {
            Some(init) => init(cf, u),
            None => ngx_http_upstream_init_round_robin(cf, u),
        }
    }
}

/// A `down` server with the address of `s`, in the backup part or the primary part.
fn fake(s: ngx_http_upstream_server_t, backup: bool) -> ngx_http_upstream_server_t {
    let mut f = s;
    f.naddrs = 1;
    f.weight = 1;
    f.max_conns = 0;
    f.down = 1;
    f.set_backup(backup as _);
    f
}

/// After every upstream was initialised: warn about `extend_single_peers` lines whose wrapper
/// never ran because a balancer directive after them replaced `init_upstream`.
///
/// # Safety
/// `cf` must be the configuration nginx is parsing, at the end of `http {}`.
pub unsafe fn check_after_init(cf: *mut ngx_conf_t) {
    // SAFETY: every entry of the upstream list is a valid upstream conf.
    unsafe {
        for &u in upstreams::all(cf) {
            let conf = srv_conf(u);
            if conf.is_null() || !(*conf).extend_single_peers || (*conf).extend_single_peers_ran {
                continue;
            }
            let name = String::from_utf8_lossy(bytes(&(*u).host));
            // The upstream's own place, not the end of http{} where this check runs.
            let file = if (*u).file_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr((*u).file_name.cast())
                    .to_string_lossy()
                    .into_owned()
            };
            log_at(
                (*cf).log,
                NGX_LOG_WARN,
                &format!(
                    "\"extend_single_peers\" has no effect in upstream \"{name}\": a load \
                     balancing directive after it replaced it; put extend_single_peers after \
                     the balancer in {file}:{}",
                    (*u).line
                ),
            );
        }
    }
}
