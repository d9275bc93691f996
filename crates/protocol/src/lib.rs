//! Wire types of the Tributary plugin protocol. Pure: no IO.
//!
//! A plugin is an executable plus a manifest (`plugin.json`, see [`Manifest`]). The host starts it once
//! and exchanges JSON-RPC 2.0 messages with it, one JSON object per line on stdin/stdout. The only
//! method is [`RESOLVE_METHOD`] (`discovery.resolve`) with [`ResolveParams`] and [`ResolveResult`].
//! `docs/protocol.md` describes the protocol for plugin authors in any language.
//!
//! Every provider config value is secret: [`ConfigMap`]'s `Debug` prints keys only, and no `Display`
//! of this crate prints a config value.
//!
//! The types: the JSON-RPC 2.0 envelope ([`Request`], [`Response`] with exactly one of result/error,
//! [`RpcError`] with `field()` = `data.field`), [`ResolveParams`] / [`ResolveResult`] (targets kept
//! as raw JSON for `tributary-core` to validate), the error codes (`ERR_CONFIG` -32003,
//! `ERR_PROVIDER` -32000), [`ConfigMap`] (provider config) and [`Manifest`] (`plugin.json`) with
//! strict validation. Golden fixtures in `crates/protocol/tests/fixtures/` pin the bytes.

mod config;
mod manifest;
mod rpc;

pub use config::ConfigMap;
pub use manifest::{
    environment_allows, Capability, Configuration, Discovery, FieldDecl, FieldType, Manifest,
    ManifestError, Permission, ProviderDecl, SecretNotResent, DAEMON_PREFIX, HOST_SET_VARIABLES,
};
pub use rpc::{
    Id, Request, ResolveParams, ResolveResult, Response, ResponsePayload, RpcError, JSONRPC_VERSION,
};

/// The one method a discovery plugin must implement.
pub const RESOLVE_METHOD: &str = "discovery.resolve";
/// Error caused by the configuration (bad or rejected credentials, unknown service, missing field):
/// `data.field` names the config key at fault, or `"service"`, or `"provider"`.
pub const ERR_CONFIG: i64 = -32003;
/// Any other failure of the provider (registry unreachable, unexpected answer, ...).
pub const ERR_PROVIDER: i64 = -32000;
/// JSON-RPC 2.0: the line was not valid JSON.
pub const ERR_PARSE: i64 = -32700;
/// JSON-RPC 2.0: the JSON was not a valid request object.
pub const ERR_INVALID_REQUEST: i64 = -32600;
/// JSON-RPC 2.0: unknown method.
pub const ERR_METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC 2.0: the params do not have the expected shape.
pub const ERR_INVALID_PARAMS: i64 = -32602;
/// JSON-RPC 2.0: internal error of the plugin.
pub const ERR_INTERNAL: i64 = -32603;
