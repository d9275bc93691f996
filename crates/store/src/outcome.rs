//! The recorded outcome of one resolution: status, failure kind, apply path, targets.

use std::fmt;

use serde::{Deserialize, Serialize};
pub use tributary_core::ReloadReason;

/// What a resolution ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeStatus {
    /// Resolved and the file was written (and nginx reloaded).
    Ok,
    /// Resolved to the bytes already on disk: nothing written, tested or reloaded.
    Unchanged,
    /// Resolution or apply failed; the current file was kept.
    Failed,
}

impl OutcomeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeStatus::Ok => "ok",
            OutcomeStatus::Unchanged => "unchanged",
            OutcomeStatus::Failed => "failed",
        }
    }

    /// The status of a tag; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<OutcomeStatus> {
        match s {
            "ok" => Some(OutcomeStatus::Ok),
            "unchanged" => Some(OutcomeStatus::Unchanged),
            "failed" => Some(OutcomeStatus::Failed),
            _ => None,
        }
    }
}

/// Why a resolution failed: a closed set of kinds, stored as a tag in `outcomes.failure`, shown
/// by the API as `failure`, and counted by the metrics. The details stay in the record (`code` and
/// `field` of a plugin error, `why`, `nginx_error`).
///
/// It lives here, next to [`OutcomeRecord`], because it is part of the recorded outcome: the
/// daemon decides it where the failure happens, the store keeps it, API/UI/metrics read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The plugin answered with a JSON-RPC error (`code`, and `field` when it named one).
    PluginError,
    /// The plugin gave no usable answer: timeout, crash, malformed answer, not running.
    PluginNoAnswer,
    /// The answer held no valid target (or no target at all): the file was kept.
    NoValidTarget,
    /// `nginx -t` failed with the new file; the previous file was restored.
    TestFailed,
    /// The reload failed, or nginx rejected it / did not confirm it; the previous file was
    /// restored.
    ReloadFailed,
    /// The change failed and the previous file could not be put back (its journal is kept).
    RestoreFailed,
    /// The file could not be written; nothing changed.
    WriteFailed,
    /// The daemon was stopping; nothing was applied.
    Stopping,
}

impl Failure {
    /// Every kind, in a stable order (metrics list them all, also at zero).
    pub const ALL: [Failure; 8] = [
        Failure::PluginError,
        Failure::PluginNoAnswer,
        Failure::NoValidTarget,
        Failure::TestFailed,
        Failure::ReloadFailed,
        Failure::RestoreFailed,
        Failure::WriteFailed,
        Failure::Stopping,
    ];

    /// The tag, as stored and shown: `plugin_error`, `plugin_no_answer`, `no_valid_target`,
    /// `test_failed`, `reload_failed`, `restore_failed`, `write_failed`, `stopping`.
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::PluginError => "plugin_error",
            Failure::PluginNoAnswer => "plugin_no_answer",
            Failure::NoValidTarget => "no_valid_target",
            Failure::TestFailed => "test_failed",
            Failure::ReloadFailed => "reload_failed",
            Failure::RestoreFailed => "restore_failed",
            Failure::WriteFailed => "write_failed",
            Failure::Stopping => "stopping",
        }
    }

    /// The kind of a tag; `None` for an unknown one.
    pub fn parse(tag: &str) -> Option<Failure> {
        Failure::ALL.into_iter().find(|f| f.as_str() == tag)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which path made a change live: the module's API without a reload, or a reload.
/// Stored as a tag in `outcomes.applied`, shown by the API as `applied`, counted by the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// PUT through the module's `upstreams_api`, confirmed by reading the set back; no reload.
    Live,
    /// nginx was reloaded (and the reload confirmed).
    Reload,
}

impl Applied {
    /// The tag as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Applied::Live => "live",
            Applied::Reload => "reload",
        }
    }

    /// The tag back; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<Applied> {
        match s {
            "live" => Some(Applied::Live),
            "reload" => Some(Applied::Reload),
            _ => None,
        }
    }
}

/// A target dropped by validation, with the reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedRecord {
    pub target: serde_json::Value,
    pub reason: String,
}

/// The outcome of one resolution of one binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutcomeRecord {
    /// When the resolution started, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// How long resolve + apply took, in milliseconds.
    pub duration_ms: u64,
    pub status: OutcomeStatus,
    /// The kind of failure when `status` is `failed` (`None` otherwise, and for failures
    /// recorded before kinds existed that the migration could not classify).
    #[serde(default)]
    pub failure: Option<Failure>,
    /// Why it failed (or a note), human readable; never contains a config value.
    pub why: Option<String>,
    /// JSON-RPC error code of the plugin, when the plugin answered an error.
    pub code: Option<i64>,
    /// Config key at fault (`data.field`), when the plugin named one.
    pub field: Option<String>,
    /// Targets kept after validation, as `{"address","port","weight"}` objects.
    pub kept: Vec<serde_json::Value>,
    /// Targets dropped by validation.
    pub dropped: Vec<DroppedRecord>,
    pub ttl_seconds: Option<u64>,
    /// The file on disk changed.
    pub changed: bool,
    /// nginx was reloaded.
    pub reloaded: bool,
    /// nginx's own error text (failed `nginx -t` or reload).
    pub nginx_error: Option<String>,
    /// How a change was made live (`None` when nothing was applied).
    #[serde(default)]
    pub applied: Option<Applied>,
    /// Why that path was taken (e.g. why live was not possible and a reload was used).
    #[serde(default)]
    pub applied_reason: Option<String>,
    /// For a change applied by a reload, why the live API was not used, as a tag (the kind of
    /// `applied_reason`; `None` for a live change, and for outcomes recorded before tags).
    #[serde(default)]
    pub reload_reason: Option<ReloadReason>,
}

impl OutcomeRecord {
    /// An outcome with `status` at `at_ms` and nothing else yet (no failure, targets or apply
    /// facts): the start every producer of outcomes fills in.
    pub fn new(at_ms: i64, status: OutcomeStatus) -> OutcomeRecord {
        OutcomeRecord {
            at_ms,
            duration_ms: 0,
            status,
            failure: None,
            why: None,
            code: None,
            field: None,
            kept: Vec::new(),
            dropped: Vec::new(),
            ttl_seconds: None,
            changed: false,
            reloaded: false,
            nginx_error: None,
            applied: None,
            applied_reason: None,
            reload_reason: None,
        }
    }
}
