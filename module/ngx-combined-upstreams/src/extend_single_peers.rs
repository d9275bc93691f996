//! `extend_single_peers;` (context `upstream`): wraps the upstream's `init_upstream` so that, when
//! all servers are known, a part (primary or backup) with exactly one address gets a fake `down`
//! peer in the other part; stock round robin then counts the lone peer's failures.

use core::ffi::{c_char, c_void};

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_upstream_init_round_robin, ngx_http_upstream_server_t,
    ngx_http_upstream_srv_conf_t, ngx_int_t, NGX_CONF_NOARGS, NGX_HTTP_SRV_CONF_OFFSET,
    NGX_HTTP_UPS_CONF, NGX_LOG_WARN,
};
use upstrand_core::extend;

use crate::conf::SrvConf;
use crate::conf_ext::ConfExt;
use crate::ffi_util::{command, NGX_ERROR};
use crate::upstreams::{self, Upstream};

/// Directive table entry.
pub const COMMAND: ngx_command_t = command(
    c"extend_single_peers",
    NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS,
    handler,
    NGX_HTTP_SRV_CONF_OFFSET,
);

extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: with NGX_HTTP_SRV_CONF_OFFSET nginx passes this module's SrvConf of the upstream
    // block being parsed, and the configuration being parsed; nothing else refers to them
    // during the call.
    let (cf, conf) = unsafe { (&*cf, &mut *conf.cast::<SrvConf>()) };
    if conf.extend_single_peers {
        return c"is duplicate".as_ptr().cast_mut();
    }
    let Some(u) = upstreams::current(cf) else {
        return ngx::core::NGX_CONF_ERROR;
    };
    conf.extend_single_peers = true;
    conf.original_init_upstream = u.init_upstream();
    u.set_init_upstream(Some(init_upstream));
    NGX_CONF_OK
}

extern "C" fn init_upstream(
    cf: *mut ngx_conf_t,
    u: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    // SAFETY: nginx calls init_upstream at the end of http {} with the configuration and one of
    // its upstream configurations (this wrapper is only installed by `handler`).
    let (cf, up) = unsafe { (&*cf, Upstream::from_ptr(u)) };
    let Some(up) = up else {
        return NGX_ERROR;
    };
    if extend(cf, up).is_err() {
        return NGX_ERROR;
    }
    let original = up.srv_conf().and_then(|c| c.original_init_upstream);
    // SAFETY: the original init_upstream (or nginx's round robin) expects exactly these
    // arguments, as nginx would have passed them.
    unsafe {
        match original {
            Some(init) => init(cf as *const ngx_conf_t as *mut ngx_conf_t, u),
            None => ngx_http_upstream_init_round_robin(cf as *const ngx_conf_t as *mut _, u),
        }
    }
}

/// Adds the fake peers `extend::plan` asks for.
fn extend(cf: &ngx_conf_t, up: Upstream) -> Result<(), crate::ffi_util::ConfFail> {
    if let Some(conf) = up.srv_conf() {
        conf.extend_single_peers_ran = true;
    }
    let list = up.servers();
    let count = |backup: bool| -> usize {
        list.iter()
            .filter(|s| (s.backup() != 0) == backup)
            .map(|s| s.naddrs)
            .sum()
    };
    let plan = extend::plan(count(false), count(true));
    let first = |backup: bool| {
        list.iter()
            .find(|s| (s.backup() != 0) == backup && s.naddrs > 0)
            .copied()
    };
    if plan.fake_backup {
        if let Some(s) = first(false) {
            up.push_server(cf, &fake(s, true))?;
        }
    }
    if plan.fake_primary {
        if let Some(s) = first(true) {
            up.push_server(cf, &fake(s, false))?;
        }
    }
    Ok(())
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
/// never ran because a balancer directive after them replaced `init_upstream`. The warning names
/// the upstream's own place, not the end of `http {}` where this check runs.
pub fn check_after_init(cf: &ngx_conf_t) {
    for u in upstreams::all(cf) {
        let Some(conf) = u.srv_conf() else {
            continue;
        };
        if !conf.extend_single_peers || conf.extend_single_peers_ran {
            continue;
        }
        let name = String::from_utf8_lossy(u.host());
        let (file, line) = u.file_line();
        cf.log_plain(
            NGX_LOG_WARN,
            &format!(
                "\"extend_single_peers\" has no effect in upstream \"{name}\": a load \
                 balancing directive after it replaced it; put extend_single_peers after the \
                 balancer in {file}:{line}"
            ),
        );
    }
}
