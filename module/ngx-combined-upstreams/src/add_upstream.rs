//! `add_upstream NAME [backup] [weight=N];` (context `upstream`): appends copies of the servers
//! the upstream NAME has so far.

use core::ffi::{c_char, c_void};

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, NGX_CONF_TAKE123, NGX_HTTP_UPSTREAM_BACKUP, NGX_HTTP_UPS_CONF,
};
use upstrand_core::add_upstream;

use crate::ffi_util::{conf_args, conf_error};
use crate::upstreams;

/// Directive table entry.
pub const COMMAND: ngx_command_t = ngx_command_t {
    name: ngx::ngx_string!("add_upstream"),
    type_: (NGX_HTTP_UPS_CONF | NGX_CONF_TAKE123) as _,
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
        let opts = match add_upstream::parse(&conf_args(cf)[1..]) {
            Ok(o) => o,
            Err(e) => return conf_error(cf, e.as_str()),
        };
        let shown = String::from_utf8_lossy(&opts.name);
        let host = upstreams::current(cf);
        let Some(src) = upstreams::find(cf, &opts.name) else {
            return conf_error(cf, &format!("upstream \"{shown}\" not found"));
        };
        if src == host {
            return conf_error(cf, &format!("upstream \"{shown}\" makes recursion"));
        }
        if (*src).servers.is_null() {
            return conf_error(
                cf,
                &format!(
                    "upstream \"{shown}\" has no server list to copy (an upstream implied by \
                     proxy_pass with a host name is resolved only at start)"
                ),
            );
        }
        // Snapshot: plan every copy first, then push (src != host, so the source list does not
        // move while we read it).
        let mut copies = Vec::new();
        for s in upstreams::servers(src) {
            let flags = match add_upstream::copy_flags(upstreams::flags_of(s), &opts) {
                Ok(f) => f,
                Err(e) => return conf_error(cf, e.as_str()),
            };
            if flags.backup && (*host).flags & NGX_HTTP_UPSTREAM_BACKUP as usize == 0 {
                return conf_error(cf, "balancing method does not support parameter \"backup\"");
            }
            let mut copy = *s;
            if copy.name.len == 0 && !copy.addrs.is_null() && copy.naddrs > 0 {
                // a server of an implicit upstream: give it its address text as name
                copy.name = (*copy.addrs).name;
            }
            upstreams::set_flags(&mut copy, flags);
            copies.push(copy);
        }
        for copy in &copies {
            if upstreams::push_server(cf, host, copy).is_err() {
                return NGX_CONF_ERROR;
            }
        }
        NGX_CONF_OK
    }
}
