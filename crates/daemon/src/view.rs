//! JSON shapes of the API (documented in `docs/api.md`), shared by the server ([`crate::http`]),
//! the engine that fills them and the CLI client ([`crate::cli`]). Data only: their text for a
//! person is printed by `cli/print.rs` and rendered by the web UI (`http/ui/`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tributary_store::{DroppedRecord, FleetView, HostState, OutcomeRecord, StoreStatus};

pub mod fleet;
pub use fleet::{FleetBindingSummary, FleetHostSummary, FleetHosts, ForgetHostResponse};

/// A binding as a person submits it (`POST /api/v1/bindings`, `PUT /api/v1/bindings/{name}`).
/// Config values may be JSON strings, booleans or numbers; strings are converted to the type the
/// provider declares for the field (`"true"` for a `bool` field, `"5"` for a `number` field).
/// `plugin`, `provider` and `service` are required: one left out is reported with every other
/// invalid field by `BindingDraft::check`, not by the parser.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingInput {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default)]
    pub config: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Refresh interval in seconds; default 60, minimum 10.
    #[serde(default)]
    pub interval_secs: Option<u64>,
    #[serde(default)]
    pub directives: Vec<String>,
    /// The module's `probe` parameters (live mode only); absent or blank: no probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Seconds a target that left discovery is drained before removal (live mode; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_secs: Option<u64>,
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
            .field("probe", &self.probe)
            .field("drain_secs", &self.drain_secs)
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
    /// The module's `probe` parameters (live mode), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Seconds a removed target is drained first (0: removed at once).
    #[serde(default)]
    pub drain_secs: u64,
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
    /// Every host's state of the binding (with the SQLite store: this host alone).
    #[serde(default)]
    pub fleet: BindingFleet,
}

/// The fleet view of one binding: who resolves it, the newest published target set, and each
/// host's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BindingFleet {
    /// The host that holds the resolver claim now (`null`: none yet, or it is being taken over).
    pub resolver: Option<String>,
    /// Generation of the newest published target set (0: none yet).
    pub generation: i64,
    /// By host id.
    pub hosts: Vec<FleetHostView>,
    /// When the resolution that produced the newest published set started (ms since the Unix
    /// epoch; `null`: none published). A set equal to the published one is not published again,
    /// so at rest this is when the servers last changed.
    #[serde(default)]
    pub set_at_ms: Option<i64>,
    /// The host that resolved the newest published set.
    #[serde(default)]
    pub set_resolved_by: Option<String>,
    /// When this host's own last successful resolution of the binding started (it held the
    /// claim; `null`: not since the daemon started).
    #[serde(default)]
    pub resolved_here_ms: Option<i64>,
}

/// One host's state of a binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetHostView {
    pub host: String,
    /// `applied`, `failed` or `stale`.
    pub state: HostState,
    /// The host is live (its heartbeat in the store); a host that stopped or lost the store
    /// keeps its last state with `alive: false`.
    pub alive: bool,
    /// When it reached this state, ms since the Unix epoch.
    pub at_ms: i64,
    /// Generation of the target set it applied or attempted.
    pub generation: i64,
    /// Servers it serves for the binding now.
    pub servers: usize,
    /// Why, when failed (nginx's message) or stale.
    pub message: Option<String>,
}

impl From<FleetView> for BindingFleet {
    fn from(v: FleetView) -> BindingFleet {
        BindingFleet {
            resolver: v.resolver,
            generation: v.generation,
            hosts: v
                .hosts
                .into_iter()
                .map(|h| FleetHostView {
                    host: h.outcome.host,
                    state: h.outcome.state,
                    alive: h.alive,
                    at_ms: h.outcome.at_ms,
                    generation: h.outcome.generation,
                    servers: h.outcome.servers,
                    message: h.outcome.message,
                })
                .collect(),
            set_at_ms: None,
            set_resolved_by: None,
            resolved_here_ms: None,
        }
    }
}

/// `GET /api/v1/store`: the store's connection state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreView {
    /// `sqlite` or `etcd`.
    pub kind: String,
    /// This host's id in the fleet.
    pub host_id: String,
    /// The store answers now.
    pub connected: bool,
    /// Since when it does not answer (ms since the Unix epoch).
    pub unreachable_since_ms: Option<i64>,
    /// The last connection error while not connected.
    pub last_error: Option<String>,
    /// The SQLite path, or the etcd endpoints and prefix.
    pub location: String,
}

impl From<StoreStatus> for StoreView {
    fn from(s: StoreStatus) -> StoreView {
        StoreView {
            kind: s.kind.to_string(),
            host_id: s.host_id,
            connected: s.connected,
            unreachable_since_ms: s.unreachable_since_ms,
            last_error: s.last_error,
            location: s.location,
        }
    }
}

/// `GET /api/v1/bindings/{name}`: the binding plus its recent history (newest first).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BindingDetail {
    pub binding: BindingView,
    pub history: Vec<OutcomeRecord>,
}

/// `GET /api/v1/bindings/{name}`: [`BindingDetail`] plus the upstream's live state from the
/// module (`live`: `null` unless the daemon applies changes live, `--apply live|auto` with
/// `--live-api`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BindingShow {
    pub binding: BindingView,
    pub history: Vec<OutcomeRecord>,
    #[serde(default)]
    pub live: Option<crate::live_state::LiveState>,
}

impl BindingShow {
    pub fn new(d: BindingDetail, live: Option<crate::live_state::LiveState>) -> BindingShow {
        BindingShow {
            binding: d.binding,
            history: d.history,
            live,
        }
    }
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

impl From<tributary_plugin_host::PluginInfo> for PluginView {
    fn from(p: tributary_plugin_host::PluginInfo) -> PluginView {
        PluginView {
            providers: p.manifest.providers().to_vec(),
            name: p.name,
            version: p.version,
            description: p.description,
            dir: p.dir.display().to_string(),
        }
    }
}

/// `GET /api/v1/bindings/{name}/history`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct History {
    pub name: String,
    /// Newest first.
    pub history: Vec<OutcomeRecord>,
}

/// What a test resolution would write (`POST /api/v1/resolve`); nothing is saved or applied.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Preview {
    /// `ok` or `failed`.
    pub result: String,
    pub targets: Vec<Value>,
    pub dropped: Vec<DroppedRecord>,
    pub ttl_seconds: Option<u64>,
    /// The file that would be written (`null` when nothing would be).
    pub rendered: Option<String>,
    pub why: Option<String>,
    pub code: Option<i64>,
    pub field: Option<String>,
}

/// `GET /api/v1/nginx`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NginxStatus {
    pub conf_dir: String,
    pub upstreams_dir: String,
    /// `*.conf` files in the upstreams folder, by name.
    pub files: Vec<String>,
    #[serde(flatten)]
    pub numbers: NginxNumbers,
}

/// The nginx-related counters since start (kept by the metrics task).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NginxNumbers {
    pub apply_batches: u64,
    pub reloads: u64,
    pub test_failures: u64,
    pub last_reload_ms: Option<i64>,
    pub last_test_failure: Option<TestFailure>,
}

/// The last change refused by `nginx -t`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestFailure {
    pub binding: String,
    pub at_ms: i64,
    pub nginx_error: String,
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
