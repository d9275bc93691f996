//! The composition root: the module object, its directive table, its configuration structures
//! (each feature's part in one place) and its configuration hooks. Features know only their own
//! part and reach it through [`ConfPart`], implemented here; this file is the only one that
//! names every feature.
//!
//! To add a directive: list its feature's `COMMAND` in [`COMMANDS`] and bump the array length
//! (the last entry stays [`ngx_command_t::empty`]). To add configuration: a field in
//! [`MainConf`] / [`SrvConf`] / [`LocConf`] and a `ConfPart` impl for the feature's type.

use core::ffi::c_void;
use core::ptr;

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_module_t, ngx_module_t, ngx_uint_t, NGX_HTTP_MODULE,
};
use ngx::http::{
    HttpModule, HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf, Merge,
    MergeConfigError,
};

use crate::ffi::conf::{module_ctx, ConfPart, HttpHooks, ModuleObject, RequestCtx};
use crate::ffi::request::Req;
use crate::ffi::upstream::Upstream;
use crate::ffi::{ConfFail, Status};
use crate::upstrand::dynamic::Declarations;
use crate::upstrand::{Registry, ReqCtx};
use crate::{add_upstream, combine_server_singlets, extend_single_peers, live, upstrand};

/// The directive table.
static mut COMMANDS: [ngx_command_t; 8] = [
    add_upstream::COMMAND,
    combine_server_singlets::COMMAND,
    extend_single_peers::COMMAND,
    upstrand::block::COMMAND,
    upstrand::dynamic::COMMAND,
    live::COMMAND,
    live::PROBE_COMMAND,
    ngx_command_t::empty(),
];

static MODULE_CTX: ngx_http_module_t = module_ctx::<Module>();

/// The module object; its name is what `ngx_module_names` (lib.rs) lists.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ngx_http_combined_upstreams_module: ModuleObject = ModuleObject::new(ngx_module_t {
    ctx: ptr::addr_of!(MODULE_CTX) as *mut c_void,
    commands: ptr::addr_of_mut!(COMMANDS) as *mut ngx_command_t,
    type_: NGX_HTTP_MODULE as ngx_uint_t,
    init_module: Some(crate::ffi::plus::init_module),
    init_process: Some(crate::ffi::prober::init_process::<live::health::Workers>),
    exit_process: Some(crate::ffi::prober::exit_process::<live::health::Workers>),
    ..ngx_module_t::default()
});

/// `http {}`-level configuration. Lives in the configuration pool and is dropped with it.
#[derive(Default)]
pub struct MainConf {
    /// Upstrands of this configuration (created by the first `upstrand` block).
    upstrand: Option<Box<Registry>>,
}

/// Per `server {}` / `upstream {}` block configuration (nginx creates one for every upstream
/// block): plain data.
#[derive(Default, Clone, Copy)]
pub struct SrvConf {
    extend_single_peers: extend_single_peers::Extend,
}

/// Location configuration (in the configuration pool, dropped with it).
#[derive(Default)]
pub struct LocConf {
    /// The `dynamic_upstrand` declarations in force (inherited).
    dynamic: Declarations,
    /// `upstreams_api` of this location (not inherited: the directive sets the location's
    /// content handler).
    api: live::ApiLocation,
}

impl Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), MergeConfigError> {
        self.dynamic.inherit(&prev.dynamic);
        Ok(())
    }
}

/// This module, for the `ngx` crate's typed configuration access and the hooks.
pub struct Module;

impl HttpModule for Module {
    fn module() -> &'static ngx_module_t {
        ngx_http_combined_upstreams_module.get()
    }
}

// SAFETY: the main, server and location slots of this module hold exactly these types: the
// hooks of `module_ctx::<Module>` make them.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}
// SAFETY: see above.
unsafe impl HttpModuleServerConf for Module {
    type ServerConf = SrvConf;
}
// SAFETY: see above.
unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}

// SAFETY: the upstrand walk's context is the only type the module keeps in its requests'
// context slot.
unsafe impl RequestCtx for ReqCtx {
    fn module() -> &'static ngx_module_t {
        Module::module()
    }
}

impl HttpHooks for Module {
    fn main_conf_begins(cf: &mut ngx_conf_t) -> Result<(), &'static str> {
        live::configuration_begins(cf)
    }

    fn preconfiguration(cf: &mut ngx_conf_t) -> Status {
        upstrand::preconfiguration(cf)
    }

    fn postconfiguration(cf: &mut ngx_conf_t) -> Status {
        let Some(mc) = Module::main_conf_mut(cf) else {
            return Status::NGX_ERROR;
        };
        match mc.upstrand.as_deref_mut() {
            Some(reg) => upstrand::postconfiguration(cf, reg),
            None => Status::NGX_OK,
        }
    }

    fn init_main_conf(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        extend_single_peers::check_after_init(cf);
        live::init_main_conf(cf)
    }
}

impl ConfPart for Registry {
    fn of_conf(cf: &ngx_conf_t) -> Option<&'static mut Registry> {
        let mc = Module::main_conf_mut(cf)?;
        Some(mc.upstrand.get_or_insert_with(Box::default))
    }

    fn of_request(r: Req) -> Option<&'static Registry> {
        r.main_conf::<Module>()?.upstrand.as_deref()
    }
}

impl ConfPart for extend_single_peers::Extend {
    fn of_conf(cf: &ngx_conf_t) -> Option<&'static mut Self> {
        Some(&mut Module::server_conf_mut(cf)?.extend_single_peers)
    }

    fn of_upstream(u: Upstream) -> Option<&'static mut Self> {
        Some(&mut u.srv_conf::<Module>()?.extend_single_peers)
    }
}

impl ConfPart for Declarations {
    fn of_conf(cf: &ngx_conf_t) -> Option<&'static mut Self> {
        Some(&mut Module::location_conf_mut(cf)?.dynamic)
    }

    fn of_request(r: Req) -> Option<&'static Self> {
        Some(&r.loc_conf::<Module>()?.dynamic)
    }
}

impl ConfPart for live::ApiLocation {
    fn of_conf(cf: &ngx_conf_t) -> Option<&'static mut Self> {
        Some(&mut Module::location_conf_mut(cf)?.api)
    }

    fn of_request(r: Req) -> Option<&'static Self> {
        Some(&r.loc_conf::<Module>()?.api)
    }
}
