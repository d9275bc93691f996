//! `extend_single_peers;` (context `upstream`): wraps the upstream's `init_upstream` so that, when
//! all servers are known, a part (primary or backup) with exactly one address gets a fake `down`
//! peer in the other part; stock round robin then counts the lone peer's failures.

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_upstream_server_t, NGX_CONF_NOARGS,
    NGX_HTTP_SRV_CONF_OFFSET, NGX_HTTP_UPS_CONF, NGX_LOG_WARN,
};
use upstrand_core::extend;

use crate::ffi::conf::{ConfExt, ConfPart, Directive};
use crate::ffi::upstream::{self as upstreams, InitUpstream, InitUpstreamFn, Upstream};
use crate::ffi::{command, ConfFail, Status};

/// Directive table entry.
pub const COMMAND: ngx_command_t = command::<Handler>(
    c"extend_single_peers",
    NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS,
    NGX_HTTP_SRV_CONF_OFFSET,
);

/// This feature's part of an upstream block's configuration (plain data).
#[derive(Default, Clone, Copy)]
pub struct Extend {
    /// `extend_single_peers` was given in this upstream block.
    on: bool,
    /// The upstream's `init_upstream` before the directive wrapped it.
    original: InitUpstreamFn,
    /// Set when the wrapper really ran (a balancer directive after ours would replace it).
    ran: bool,
}

struct Handler;

impl Directive for Handler {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        let (Some(conf), Some(u)) = (Extend::of_conf(cf), upstreams::current(cf)) else {
            return Err(ConfFail::Logged);
        };
        if conf.on {
            return Err(ConfFail::Nginx(c"is duplicate"));
        }
        conf.on = true;
        conf.original = u.init_upstream_fn();
        u.wrap_init_upstream::<Wrapper>();
        Ok(())
    }
}

/// The `init_upstream` the directive installs.
struct Wrapper;

impl InitUpstream for Wrapper {
    fn init(cf: &mut ngx_conf_t, up: Upstream) -> Status {
        if extend(cf, up).is_err() {
            return Status::NGX_ERROR;
        }
        let original = Extend::of_upstream(up)
            .map(|c| c.original)
            .unwrap_or_default();
        original.call(cf, up)
    }
}

/// Adds the fake peers `extend::plan` asks for.
fn extend(cf: &ngx_conf_t, up: Upstream) -> Result<(), ConfFail> {
    if let Some(conf) = Extend::of_upstream(up) {
        conf.ran = true;
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
        let Some(conf) = Extend::of_upstream(u) else {
            continue;
        };
        if !conf.on || conf.ran {
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
