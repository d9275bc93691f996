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
    let shown = String::from_utf8_lossy(&opts.name);
    let Some(src) = upstreams::find(cf, &opts.name) else {
        return Err(format!("upstream \"{shown}\" not found").into());
    };
    if src == host {
        return Err(format!("upstream \"{shown}\" makes recursion").into());
    }
    if !src.has_server_list() {
        return Err(format!(
            "upstream \"{shown}\" has no server list to copy (an upstream implied by proxy_pass \
             with a host name is resolved only at start)"
        )
        .into());
    }
    // Snapshot: plan every copy first, then push.
    let mut copies = Vec::new();
    for s in src.servers() {
        let flags = add_upstream::copy_flags(upstreams::flags_of(&s), &opts)?;
        if flags.backup && host.flags() & NGX_HTTP_UPSTREAM_BACKUP == 0 {
            return Err("balancing method does not support parameter \"backup\"".into());
        }
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
