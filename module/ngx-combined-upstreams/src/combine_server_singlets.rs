//! `combine_server_singlets [SUFFIX] [WIDTH | byname] [nobackup];` (context `upstream`): one
//! singlet upstream per server declared so far in the current upstream.

use core::ffi::{c_char, c_void};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_upstream_server_t, ngx_http_upstream_srv_conf_t,
    NGX_CONF_NOARGS, NGX_CONF_TAKE123, NGX_HTTP_UPS_CONF,
};
use upstrand_core::singlets::{self, Singlets};

use crate::ffi_util::{bytes, command, ConfFail};
use crate::upstreams;

/// Directive table entry.
pub const COMMAND: ngx_command_t = command(
    c"combine_server_singlets",
    NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE123,
    handler,
    0,
);

unsafe extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls this handler while parsing an `upstream {}` block (NGX_HTTP_UPS_CONF).
    unsafe { upstreams::handle_directive(cf, singlets::parse, apply) }
}

/// Creates the singlets of `host`, the upstream being parsed.
///
/// # Safety
/// As for [`upstreams::handle_directive`]'s `apply`.
unsafe fn apply(
    cf: *mut ngx_conf_t,
    host: *mut ngx_http_upstream_srv_conf_t,
    opts: Singlets,
) -> Result<(), ConfFail> {
    // SAFETY: cf is inside `upstream {}` of http{}; host is the upstream being parsed.
    unsafe {
        let host_name = bytes(&(*host).host);
        // The servers so far, copied out: creating upstreams below does not touch this list,
        // and servers declared later are in no singlet.
        let servers: Vec<ngx_http_upstream_server_t> = upstreams::servers(host).to_vec();
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
                upstreams::push_server(cf, singlet, &copy)?;
            }
        }
        Ok(())
    }
}
