//! `tributary-store`: the daemon's persistence, behind one interface, [`BindingStore`], with two
//! implementations: [`SqliteStore`] (one host, one SQLite file; the default) and, for a fleet of
//! hosts sharing their bindings, `EtcdStore` (etcd, with a local mirror).
//!
//! It keeps:
//! - **bindings** ([`BindingRecord`]): upstream name, plugin, provider, provider config, service,
//!   refresh interval and extra directives. They survive daemon restarts.
//! - **recent outcomes** ([`OutcomeRecord`]) per binding: what the last resolutions of *this host*
//!   did (time, duration, ok/unchanged/failed, the [`Failure`] kind as a tag, why, error code and
//!   field, targets kept, targets dropped with reasons, ttl, whether the file changed and nginx
//!   was reloaded, nginx's error text). Only the newest outcomes of each binding are kept.
//! - **fleet state** (see [`BindingStore`]): who resolves a binding, the target set its resolver
//!   published, each host's outcome per binding. A single-host store keeps these in memory.
//!
//! The store works in plain data (strings, JSON values): it does not validate upstream names or
//! directives, that is `tributary-core`'s job before anything reaches the store.
//!
//! **Secrets.** Every provider config value is a secret. The SQLite file (and SQLite's journal
//! files, which inherit its mode) is created with mode `0600` and the mode is re-asserted on every
//! open; [`BindingRecord`]'s `Debug` prints config keys only; no error of this crate contains a
//! config value.
//!
//! The contract is in `binding_store.rs`: reads (bindings, this host's outcome history, published
//! target sets, fleet view, status) are local and never touch the network; writes are async and
//! bounded, failing with [`StoreError::Unavailable`] (naming the store) when it cannot be reached,
//! and with [`StoreError::PermissionDenied`], [`StoreError::AuthFailed`] or
//! [`StoreError::TooLarge`] when etcd answers with a refusal (`etcd/refusal.rs`);
//! `subscribe` gives level-triggered [`StoreEvent`]s for changes made elsewhere; the fleet hooks
//! (`claim_resolver`, `publish_targets`/`published_targets`, `step_out`/`step_in`,
//! `publish_host_outcome`, `fleet_view`) are called the same way for every store.
//!
//! [`SqliteFile`] is the SQLite file (rusqlite, bundled SQLite, WAL) holding the bindings (also their
//! live settings `probe` and `drain_secs`) and the newest outcomes of each binding, trimmed to a
//! history length per binding; the [`Failure`] kind (plugin_error, plugin_no_answer, no_valid_target,
//! test_failed, reload_failed, restore_failed, write_failed, stopping; metrics count by it) and the
//! [`Applied`] path (`live`/`reload`, with its reason) are tag columns. [`SqliteStore`] is the
//! single-host [`BindingStore`] over it: writes on a blocking thread; it always resolves, its fleet
//! is itself, it emits no events. The etcd store's file-by-file map is in `docs/fleet.md`;
//! `tributary_fakes::etcd_cluster` runs the real 3-member cluster its tests use, and
//! `benches/fleet.rs` measures 20 hosts × 1,000 bindings on it.

#![forbid(unsafe_code)]

mod binding_store;
pub mod etcd;
mod outcome;
mod sqlite;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use binding_store::{
    BindingStore, FleetHost, FleetMember, FleetView, ForgotHost, HostOutcome, HostState,
    StoreEvent, StoreStatus, TargetSet,
};
pub use etcd::keys::provider_pair;
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls, SecretKeys, MAX_OUTCOME_MESSAGE};
pub use outcome::{Applied, DroppedRecord, Failure, OutcomeRecord, OutcomeStatus, ReloadReason};
pub use sqlite::{SqliteFile, SqliteStore, StoreOptions, DEFAULT_HISTORY, SCHEMA_VERSION};

/// Errors of the store. None of them carries a provider config value.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("store {path} has schema version {found}, this build understands {SCHEMA_VERSION}")]
    SchemaVersion { path: PathBuf, found: i64 },
    #[error("a binding named {0:?} already exists")]
    Duplicate(String),
    #[error("no binding named {0:?}")]
    NotFound(String),
    #[error("corrupt stored {what} for binding {binding:?}")]
    Corrupt { binding: String, what: &'static str },
    /// The store cannot be reached now (etcd down or partitioned): nothing was written. Reads
    /// still answer from the local mirror. `store` names it (e.g. `etcd http://10.0.0.1:2379`).
    #[error("store {store} is unreachable: {why}; nothing was written")]
    Unavailable { store: String, why: String },
    /// etcd refused the request for this host's etcd user: its roles do not grant `keys` (a
    /// permission refusal, `etcdserver: permission denied`). Nothing was written; the same request
    /// fails again until the user's roles change (`docs/fleet.md`, "Per-host etcd permissions").
    #[error("store {store}: etcd user {user} has no permission for {keys} ({why}); nothing was written: grant the user's role readwrite on them (docs/fleet.md, \"Per-host etcd permissions\")")]
    PermissionDenied {
        store: String,
        /// The etcd user (`(none)` when the daemon gives none).
        user: String,
        /// The keys (or key prefixes) of the refused request.
        keys: String,
        why: String,
    },
    /// etcd did not accept this host's etcd user: a wrong password, an unknown user, no user
    /// while etcd's authentication is on, or a token etcd no longer knows. Nothing was written.
    #[error("store {store} did not accept etcd user {user}: {why}; nothing was written (check --etcd-user and --etcd-password-file)")]
    AuthFailed {
        store: String,
        user: String,
        why: String,
    },
    /// etcd refused the request as larger than its members take (`--max-request-bytes`, 1.5 MiB
    /// by default, or `--max-txn-ops`). Nothing was written; the same request fails again.
    #[error("store {store} refused the request as too large: {why}; nothing was written")]
    TooLarge { store: String, why: String },
    /// The write lost a race with another host's write of the same binding; nothing was written.
    #[error("binding {0:?} was changed on another host at the same time; nothing was written, try again")]
    Conflict(String),
    /// The store's own settings are wrong (key file, endpoints, TLS files...): said at start.
    #[error("store settings: {0}")]
    Settings(String),
    /// A host to forget ([`BindingStore::forget_host`]) is alive: its heartbeat `key` is kept by
    /// a running daemon. Nothing was deleted.
    #[error("host {host:?} is alive (its heartbeat {key} is kept by a running daemon): stop that daemon first (systemctl stop tributary, or SIGTERM its process), or give --force to end its session; nothing was deleted")]
    HostAlive { host: String, key: String },
    /// A host to forget is not known under the prefix: no heartbeat, outcome or marker of it.
    #[error("no host {host:?} under {prefix}: it has no heartbeat, outcome or marker there (host ids are case-sensitive); nothing was deleted")]
    NoSuchHost { host: String, prefix: String },
    /// A fleet operation asked of a store that has no fleet (SQLite: one host).
    #[error("the {0} store has no fleet (one host, this one): there is no other host to forget")]
    NoFleet(&'static str),
    /// A stored secret could not be decrypted (unknown key id, or tampered ciphertext).
    #[error("binding {binding:?}: its secret config cannot be decrypted: {why}")]
    Decrypt { binding: String, why: String },
}

/// One stored binding. `config` holds secret values: `Debug` prints the keys only.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingRecord {
    /// The upstream name (already validated by `tributary-core`).
    pub name: String,
    pub plugin: String,
    pub provider: String,
    /// Provider configuration; every value is secret.
    pub config: BTreeMap<String, serde_json::Value>,
    pub service: String,
    /// Refresh interval in seconds.
    pub interval_secs: u64,
    /// Extra directives, each one `...;` line, in the person's order.
    pub directives: Vec<String>,
    /// The module's `probe` parameters; `None`: no probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// Seconds a target that left discovery is drained before its removal (0: at once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drain_secs: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl fmt::Debug for BindingRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Keys<'a>(&'a BTreeMap<String, serde_json::Value>);
        impl fmt::Debug for Keys<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(self.0.keys().map(|k| (k, "<redacted>")))
                    .finish()
            }
        }
        f.debug_struct("BindingRecord")
            .field("name", &self.name)
            .field("plugin", &self.plugin)
            .field("provider", &self.provider)
            .field("config", &Keys(&self.config))
            .field("service", &self.service)
            .field("interval_secs", &self.interval_secs)
            .field("directives", &self.directives)
            .field("probe", &self.probe)
            .field("drain_secs", &self.drain_secs)
            .finish()
    }
}

/// A binding as listed, with its bookkeeping timestamps (milliseconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredBinding {
    pub binding: BindingRecord,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// Result of [`BindingStore::upsert_bindings`], one per binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Created,
    Updated,
    Unchanged,
}

/// The time stamps of the records here, and the one clock reading of the daemon and the fakes;
/// the lock every crate shares.
pub use tributary_base::{lock, now_ms};
