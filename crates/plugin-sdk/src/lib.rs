//! Write a Tributary discovery plugin by implementing one trait.
//!
//! ```no_run
//! use tributary_plugin_sdk::{target, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError};
//!
//! struct Fixed;
//!
//! impl Plugin for Fixed {
//!     fn manifest(&self) -> Option<&str> {
//!         Some(r#"{"name":"fixed","version":"1.0.0","executable":"fixed",
//!                  "capabilities":["upstream.discovery"],"permissions":["network"],
//!                  "discovery":{"providers":[{"code":"fixed","name":"Fixed","configuration":
//!                  {"fields":[{"key":"host","display_name":"Host","required":true}]}}]}}"#)
//!     }
//!
//!     async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
//!         let host = params.config.required_str("host")?;
//!         Ok(ResolveResult { targets: vec![target(host, 80, None)], ttl_seconds: 0 })
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     tributary_plugin_sdk::run(Fixed)
//! }
//! ```
//!
//! [`run`] serves the protocol on stdin/stdout (one JSON-RPC 2.0 message per line): it answers
//! `discovery.resolve` by calling [`Plugin::resolve`], concurrently, each answer carrying its
//! request's `id`; unknown methods get -32601, unreadable lines -32700 (id `null`), bad params
//! -32602, a panic in `resolve` -32603. With [`Plugin::manifest`], an unknown provider, a missing
//! required field or a field of the wrong type is answered -32003 with `data.field` before `resolve`
//! is called. The plugin exits when stdin closes, after answering the requests in flight.
//!
//! Write logs to stderr (the host keeps the last lines, redacted); never to stdout. Never put config
//! values in error messages: the host redacts whole values, not pieces of them.
//!
//! The pieces: `serve` (the protocol loop behind [`run`] and [`serve`]), `config` (typed config
//! access, the manifest checks, [`root_cause`]), `target` (building targets and reading the
//! `address:port[:weight]` text entries the static, file and etcd plugins share).
//!
//! [`run`] registers the pipes on a current-thread tokio runtime and runs a task per request. Shared
//! by the plugins' parsers: `split_target()` / `parse_port()` (`address:port[:weight]` text, IPv6 in
//! brackets), `parse_weight()` / `weight_value()` (0–1000, 0 meaning no weight) and [`root_cause`]
//! (an error's innermost cause, for messages that must not carry a URL); [`ConfigExt`] field
//! accessors, [`target`], and `call()` (one request in-process, for plugin unit tests).

mod config;
mod serve;
mod target;

use std::future::Future;

pub use config::{check_params, root_cause, ConfigExt};
pub use serve::{run, serve, ServeError};
pub use target::{parse_port, parse_weight, split_target, target, weight_value, TargetText};
pub use tributary_protocol as protocol;
pub use tributary_protocol::{
    ConfigMap, FieldType, Id, Manifest, ProviderDecl, Request, ResolveParams, ResolveResult,
    Response, RpcError, ERR_CONFIG, ERR_PROVIDER, RESOLVE_METHOD,
};

/// Longest request line accepted (bytes, without `\n`).
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// A discovery plugin.
pub trait Plugin: Send + Sync + 'static {
    /// The plugin's `plugin.json` text (typically `include_str!("../plugin.json")`). When given, the
    /// SDK checks provider, required fields and field types itself before calling
    /// [`Plugin::resolve`]. An invalid manifest stops [`run`] at start with a message.
    fn manifest(&self) -> Option<&str> {
        None
    }

    /// Resolves `params.service` into its current servers. Answer
    /// [`RpcError::config`] (-32003, with the config key at fault or `"service"`) for causes in the
    /// configuration and [`RpcError::provider`] (-32000) otherwise.
    fn resolve(
        &self,
        params: ResolveParams,
    ) -> impl Future<Output = Result<ResolveResult, RpcError>> + Send;
}

/// Calls `plugin` in-process the way [`serve`] would for one request (manifest checks first, then
/// [`Plugin::resolve`]): for plugins' unit tests, without a process or stdio.
pub async fn call<P: Plugin>(plugin: &P, params: ResolveParams) -> Result<ResolveResult, RpcError> {
    if let Some(text) = plugin.manifest() {
        let manifest = Manifest::parse(text).map_err(|e| {
            RpcError::new(
                tributary_protocol::ERR_INTERNAL,
                format!("the plugin's own manifest is invalid: {e}"),
            )
        })?;
        check_params(&manifest, &params)?;
    }
    plugin.resolve(params).await
}
