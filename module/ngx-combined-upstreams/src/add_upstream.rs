//! `add_upstream NAME [backup] [weight=N];` (context `upstream`): appends copies of the servers
//! the upstream NAME has so far.

use core::ffi::{c_char, c_void};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, NGX_CONF_TAKE123, NGX_HTTP_UPSTREAM_BACKUP, NGX_HTTP_UPS_CONF,
};
use upstrand_core::add_upstream::{self, AddUpstream};

use crate::ffi_util::{command, ConfFail};
use crate::upstreams::{self, Upstream};

/// Directive table entry.
pub const COMMAND: ngx_command_t = command(
    c"add_upstream",
    NGX_HTTP_UPS_CONF | NGX_CONF_TAKE123,
    handler,
    0,
);

extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls the handler with the configuration being parsed, inside an
    // `upstream {}` block (NGX_HTTP_UPS_CONF); nothing else refers to it during the call.
    let cf = unsafe { &mut *cf };
    upstreams::handle_directive(cf, add_upstream::parse, apply)
}

/// Appends the copies to `host`, the upstream being parsed.
fn apply(cf: &mut ngx_conf_t, host: Upstream, opts: AddUpstream) -> Result<(), ConfFail> {
    let src = upstreams::find(cf, &opts.name);
    let source = src.map(|s| add_upstream::Source {
        is_host: s == host,
        has_server_list: s.has_server_list(),
    });
    let servers = src.map(Upstream::servers).unwrap_or_default();
    let plan = add_upstream::plan(
        &opts,
        source,
        host.flags() & NGX_HTTP_UPSTREAM_BACKUP != 0,
        servers.iter().map(upstreams::flags_of),
    )?;
    // Snapshot: every copy is planned before the first push.
    let mut copies = Vec::new();
    for (s, flags) in servers.into_iter().zip(plan) {
        let mut copy = s;
        if copy.name.len == 0 && !copy.addrs.is_null() && copy.naddrs > 0 {
            // a server of an implicit upstream: give it its address text as name
            // SAFETY: addrs of a server entry of this cycle points at naddrs addresses.
            copy.name = unsafe { (*copy.addrs).name };
        }
        upstreams::set_flags(&mut copy, flags);
        copies.push(copy);
    }
    for copy in &copies {
        host.push_server(cf, copy)?;
    }
    Ok(())
}
