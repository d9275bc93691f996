//! `add_upstream NAME [backup] [weight=N];` (context `upstream`): appends copies of the servers
//! the upstream NAME has so far.

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, NGX_CONF_TAKE123, NGX_HTTP_UPSTREAM_BACKUP, NGX_HTTP_UPS_CONF,
};
use upstrand_core::add_upstream::{self, AddUpstream};

use crate::ffi::conf::Directive;
use crate::ffi::upstream::{self as upstreams, Upstream};
use crate::ffi::{command, ConfFail};

/// Directive table entry.
pub const COMMAND: ngx_command_t =
    command::<Handler>(c"add_upstream", NGX_HTTP_UPS_CONF | NGX_CONF_TAKE123, 0);

struct Handler;

impl Directive for Handler {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        upstreams::handle_directive(cf, add_upstream::parse, apply)
    }
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
    for (s, flags) in servers.iter().zip(plan) {
        // a server of an implicit upstream gets its address text as name
        let mut copy = upstreams::named_server(s);
        upstreams::set_flags(&mut copy, flags);
        copies.push(copy);
    }
    for copy in &copies {
        host.push_server(cf, copy)?;
    }
    Ok(())
}
