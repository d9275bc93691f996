//! The traits of the configuration side of the seam (safe declarations; the trampolines that
//! call them and [`ConfExt`]'s implementation are `mod.rs`): a directive's handler, a feature's
//! part of the module's configuration, the module's configuration hooks, the safe extension of
//! `ngx_conf_t` and the directives of a block.

use core::ffi::c_char;

use ngx::ffi::{ngx_conf_t, ngx_str_t};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, HttpModuleServerConf};

use super::Cleanup;
use crate::ffi::request::Req;
use crate::ffi::upstream::Upstream;
use crate::ffi::{ConfFail, Status};

/// A directive's handler (the entry is made with [`crate::ffi::command`]).
pub trait Directive {
    /// Handles the directive in the configuration being parsed (`cf.args()` are its words).
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail>;
}

/// A feature's part of the module's configuration. The composition root (`crate::conf`)
/// implements it for each part, so a feature reaches its part without naming the module's
/// configuration types. A method a part has no use for returns `None`.
pub trait ConfPart: 'static {
    /// The part at the level being parsed (`http {}`, the `upstream {}` / `server {}` block or
    /// the location).
    fn of_conf(_cf: &ngx_conf_t) -> Option<&'static mut Self> {
        None
    }
    /// The part of an upstream block (or singlet).
    fn of_upstream(_u: Upstream) -> Option<&'static mut Self> {
        None
    }
    /// The part a request sees (its configuration's, or its location's).
    fn of_request(_r: Req) -> Option<&'static Self> {
        None
    }
}

/// The module's configuration hooks, implemented by the composition root;
/// [`super::module_ctx`] makes nginx's `ngx_http_module_t` of trampolines that call them. The
/// configuration structures are made in the configuration pool: main and location ones dropped
/// with it, server ones plain data (nginx makes one for every `server {}` and `upstream {}`
/// block).
pub trait HttpHooks: HttpModuleMainConf + HttpModuleServerConf + HttpModuleLocationConf {
    /// When nginx starts reading an `http {}` block (`create_main_conf`, before the main
    /// configuration is made); an error makes nginx fail the configuration.
    fn main_conf_begins(cf: &mut ngx_conf_t) -> Result<(), &'static str>;
    /// Before the `http {}` block is parsed (register variables here).
    fn preconfiguration(cf: &mut ngx_conf_t) -> Status;
    /// After `http {}` is parsed and every upstream initialised (install filters here).
    fn postconfiguration(cf: &mut ngx_conf_t) -> Status;
    /// At the end of `http {}`, after `ngx_http_upstream_module` initialised every upstream.
    fn init_main_conf(cf: &mut ngx_conf_t) -> Result<(), ConfFail>;
}

/// Safe access to the configuration being parsed.
pub trait ConfExt {
    /// The words of the directive being handled (`cf->args`), the directive name first; empty
    /// outside a directive handler.
    fn args(&self) -> Vec<&[u8]>;
    /// The directive's parameters (the words after its name) as text, invalid UTF-8 replaced.
    fn param_texts(&self) -> Vec<String> {
        self.args()
            .iter()
            .skip(1)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }
    /// Copies `data` into the configuration pool; `None` when out of memory.
    fn copy_str(&self, data: &[u8]) -> Option<ngx_str_t>;
    /// Moves plain data (no `Drop`) into the configuration pool.
    fn alloc<T>(&self, value: T) -> Option<&'static mut T>;
    /// Moves a value into the configuration pool, dropped when the pool is destroyed.
    fn alloc_box<T>(&self, value: T) -> Option<&'static mut T>;
    /// Makes `C::run(data)` run when the configuration pool is destroyed (the cycle ends);
    /// false when out of memory.
    fn on_cleanup<C: Cleanup>(&self, data: usize) -> bool;
    /// Logs `msg` at `level` as a configuration message: nginx adds ` in FILE:LINE` of the
    /// directive being handled.
    fn log(&self, level: u32, msg: &str);
    /// Logs `msg` at `level` on the configuration log as a plain line (no ` in FILE:LINE` of the
    /// current directive: the message names its own place).
    fn log_plain(&self, level: u32, msg: &str);
    /// What a directive handler returns to nginx; a [`ConfFail::Conf`] is logged as
    /// `[emerg] MSG in FILE:LINE` first, a [`ConfFail::Text`] as `[emerg] MSG`.
    fn result(&self, result: Result<(), ConfFail>) -> *mut c_char;
}

/// The directives inside a block directive's `{ ... }` (see [`super::parse_block`]).
pub trait Block {
    /// What the block's directives add to.
    type State;
    /// One directive inside the block (`cf.args()` are its words).
    fn directive(cf: &ngx_conf_t, state: &mut Self::State) -> Result<(), ConfFail>;
}
