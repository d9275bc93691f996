//! `combine_server_singlets [SUFFIX] [WIDTH | byname] [nobackup];` (context `upstream`): one
//! singlet upstream per server declared so far in the current upstream.

use core::ffi::{c_char, c_void};

use ngx::ffi::{ngx_command_t, ngx_conf_t, NGX_CONF_NOARGS, NGX_CONF_TAKE123, NGX_HTTP_UPS_CONF};
use upstrand_core::singlets::{self, Singlets};

use crate::ffi_util::{command, ConfFail};
use crate::upstreams::{self, Upstream};

/// Directive table entry.
pub const COMMAND: ngx_command_t = command(
    c"combine_server_singlets",
    NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE123,
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
    upstreams::handle_directive(cf, singlets::parse, apply)
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
