//! `combine_server_singlets [SUFFIX] [WIDTH | byname] [nobackup];` (context `upstream`): one
//! singlet upstream per server declared so far in the current upstream.

use ngx::ffi::{ngx_command_t, ngx_conf_t, NGX_CONF_NOARGS, NGX_CONF_TAKE123, NGX_HTTP_UPS_CONF};
use upstrand_core::singlets::{self, Singlets};

use crate::ffi::conf::Directive;
use crate::ffi::upstream::{self as upstreams, Upstream};
use crate::ffi::{command, ConfFail};

/// Directive table entry.
pub const COMMAND: ngx_command_t = command::<Handler>(
    c"combine_server_singlets",
    NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE123,
    0,
);

struct Handler;

impl Directive for Handler {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        upstreams::handle_directive(cf, singlets::parse, apply)
    }
}

/// Creates the singlets of `host`, the upstream being parsed.
fn apply(cf: &mut ngx_conf_t, host: Upstream, opts: Singlets) -> Result<(), ConfFail> {
    let host_name = host.host();
    // The servers so far, copied out: servers declared later are in no singlet.
    let servers = host.servers();
    singlets::require_servers(servers.len())?;
    let flags: Vec<_> = servers.iter().map(upstreams::flags_of).collect();
    for (i, server) in servers.iter().enumerate() {
        let name = singlets::name(host_name, &opts, i + 1, upstreams::server_name(server));
        // nginx logs `duplicate upstream "NAME"` itself when the name is taken.
        let singlet = upstreams::create(cf, &name).ok_or(ConfFail::Logged)?;
        for (s, f) in servers
            .iter()
            .zip(singlets::singlet_flags(&flags, i, opts.nobackup))
        {
            let mut copy = *s;
            upstreams::set_flags(&mut copy, f);
            singlet.push_server(cf, &copy)?;
        }
    }
    Ok(())
}
