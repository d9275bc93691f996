//! JSON shapes of the API (documented in `docs/api.md`), shared by the server ([`crate::api`])
//! and the CLI client ([`crate::cli`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_store::OutcomeRecord;

/// A binding as a person submits it (`POST /api/v1/bindings`, `PUT /api/v1/bindings/{name}`).
/// Config values may be JSON strings, booleans or numbers; strings are converted to the type the
/// provider declares for the field (`"true"` for a `bool` field, `"5"` for a `number` field).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingInput {
    #[serde(default)]
    pub name: String,
    pub plugin: String,
    pub provider: String,
    #[serde(default)]
    pub config: BTreeMap<String, Value>,
    pub service: String,
    /// Refresh interval in seconds; default 60, minimum 10.
    #[serde(default)]
    pub interval_secs: Option<u64>,
    #[serde(default)]
    pub directives: Vec<String>,
}

impl fmt::Debug for BindingInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BindingInput")
            .field("name", &self.name)
            .field("plugin", &self.plugin)
            .field("provider", &self.provider)
            .field("config_keys", &self.config.keys().collect::<Vec<_>>())
            .field("service", &self.service)
            .field("interval_secs", &self.interval_secs)
            .field("directives", &self.directives)
            .finish()
    }
}

/// A binding as the API shows it. Values of fields the provider marks `secret` are never shown:
/// `secrets` says whether each one is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BindingView {
    pub name: String,
    pub plugin: String,
    pub provider: String,
    pub service: String,
    pub interval_secs: u64,
    pub directives: Vec<String>,
    /// Non-secret config values.
    pub config: BTreeMap<String, Value>,
    /// Secret config fields: `true` when set.
    pub secrets: BTreeMap<String, bool>,
    /// The line to add at nginx's `http` level.
    pub include_line: String,
    /// The generated file.
    pub file: String,
    /// The outcome of the last resolution, if any.
    pub last_outcome: Option<OutcomeRecord>,
    /// The servers in the file now (from the last successful resolution).
    pub servers: Vec<Value>,
    /// When the next refresh is due (ms since the Unix epoch), while the binding is scheduled.
    pub next_refresh_ms: Option<i64>,
    pub consecutive_failures: u32,
}

/// `GET /api/v1/bindings/{name}`: the binding plus its recent history (newest first).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BindingDetail {
    pub binding: BindingView,
    pub history: Vec<OutcomeRecord>,
}

/// `GET /api/v1/bindings`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BindingList {
    pub bindings: Vec<BindingView>,
}

/// Answer of a create or replace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SaveResponse {
    /// `created`, `updated` or `unchanged`.
    pub result: String,
    pub binding: BindingView,
}

/// `POST /api/v1/bindings/bulk` body: create or replace many bindings at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkInput {
    pub bindings: Vec<BindingInput>,
}

/// One line of a bulk answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkItem {
    pub name: String,
    /// `created`, `updated` or `unchanged`.
    pub result: String,
}

/// `POST /api/v1/bindings/bulk` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkResponse {
    pub results: Vec<BulkItem>,
}

/// `DELETE /api/v1/bindings/{name}` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoveResponse {
    pub name: String,
    /// Whether `upstreams/<name>.conf` was deleted (false when there was none).
    pub file_removed: bool,
}

/// `GET /api/v1/plugins`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginList {
    pub plugins: Vec<PluginView>,
    /// Plugins that could not be loaded, with the reason.
    pub errors: Vec<String>,
}

/// One loaded plugin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginView {
    pub name: String,
    pub version: String,
    pub description: String,
    pub dir: String,
    pub providers: Vec<tributary_protocol::ProviderDecl>,
}

/// Every error answer: `{"error": {"message": "...", "field": "..."}}`; when the fields of a
/// binding were checked one by one, `errors` lists every invalid one (`error` is the first).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ErrorDetail>,
}

/// The error itself; `field` names the input at fault when there is one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
