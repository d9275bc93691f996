//! `combine_server_singlets [SUFFIX] [WIDTH | byname] [nobackup];` (context `upstream`): one
//! singlet upstream per server declared so far in the current upstream.

use core::ffi::{c_char, c_void};

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_upstream_server_t, NGX_CONF_NOARGS, NGX_CONF_TAKE123,
    NGX_HTTP_UPS_CONF,
};
use upstrand_core::singlets;

use crate::ffi_util::{bytes, conf_args, conf_error};
use crate::upstreams;

/// Directive table entry.
pub const COMMAND: ngx_command_t = ngx_command_t {
    name: ngx::ngx_string!("combine_server_singlets"),
    type_: (NGX_HTTP_UPS_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE123) as _,
    set: Some(handler),
    conf: 0,
    offset: 0,
    post: core::ptr::null_mut(),
};

unsafe extern "C" fn handler(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls this handler while parsing an `upstream {}` block (NGX_HTTP_UPS_CONF).
    unsafe {
        let opts = match singlets::parse(&conf_args(cf)[1..]) {
            Ok(o) => o,
            Err(e) => return conf_error(cf, e.as_str()),
        };
        let host = upstreams::current(cf);
        let host_name = bytes(&(*host).host);
        // The servers so far, copied out: creating upstreams below does not touch this list,
        // and servers declared later are in no singlet.
        let servers: Vec<ngx_http_upstream_server_t> = upstreams::servers(host).to_vec();
        let flags: Vec<_> = servers.iter().map(upstreams::flags_of).collect();
        for (i, _) in servers.iter().enumerate() {
            let name = singlets::name(host_name, &opts, i + 1, upstreams::server_name(&servers[i]));
            // nginx logs `duplicate upstream "NAME"` itself when the name is taken.
            let Some(singlet) = upstreams::create(cf, &name) else {
                return NGX_CONF_ERROR;
            };
            for (s, f) in servers
                .iter()
                .zip(singlets::singlet_flags(&flags, i, opts.nobackup))
            {
                let mut copy = *s;
                upstreams::set_flags(&mut copy, f);
                if upstreams::push_server(cf, singlet, &copy).is_err() {
                    return NGX_CONF_ERROR;
                }
            }
        }
        NGX_CONF_OK
    }
}
