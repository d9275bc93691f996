//! `tributary-store`: the daemon's persistence, one SQLite file (rusqlite, bundled SQLite).
//!
//! It keeps two things:
//! - **bindings** ([`BindingRecord`]): upstream name, plugin, provider, provider config, service,
//!   refresh interval and extra directives. They survive daemon restarts.
//! - **recent outcomes** ([`OutcomeRecord`]) per binding: what the last resolutions did (time,
//!   duration, ok/unchanged/failed, the [`Failure`] kind as a tag, why, error code and field,
//!   targets kept, targets dropped with reasons, ttl, whether the file changed and nginx was
//!   reloaded, nginx's error text). Only the newest [`StoreOptions::history_per_binding`]
//!   outcomes of each binding are kept.
//!
//! The schema is versioned (`PRAGMA user_version`); [`Store::open`] brings an older file up to
//! date with the steps of `MIGRATIONS`, each in one transaction.
//!
//! The store works in plain data (strings, JSON values): it does not validate upstream names or
//! directives, that is `tributary-core`'s job before anything reaches the store.
//!
//! **Secrets.** Every provider config value is a secret. The database file (and SQLite's journal
//! files, which inherit its mode) is created with mode `0600` and the mode is re-asserted on every
//! open; [`BindingRecord`]'s `Debug` prints config keys only; no error of this crate contains a
//! config value.
//!
//! The API is synchronous; the daemon calls it from a blocking context.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use serde::{Deserialize, Serialize};

/// Schema version written to `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 3;

/// Default number of outcomes kept per binding.
pub const DEFAULT_HISTORY: usize = 20;

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

    fn parse(s: &str) -> Option<OutcomeStatus> {
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

/// Which path made a change live (issue 11): the module's API without a reload, or a reload.
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
        }
    }
}

/// Options of [`Store::open_with`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Outcomes kept per binding (older ones are deleted). At least 1.
    pub history_per_binding: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            history_per_binding: DEFAULT_HISTORY,
        }
    }
}

/// Result of [`Store::upsert_binding`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Created,
    Updated,
    Unchanged,
}

/// The SQLite store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    history: usize,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS bindings (
    name          TEXT PRIMARY KEY NOT NULL,
    plugin        TEXT NOT NULL,
    provider      TEXT NOT NULL,
    config        TEXT NOT NULL,
    service       TEXT NOT NULL,
    interval_secs INTEGER NOT NULL,
    directives    TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outcomes (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    binding     TEXT NOT NULL REFERENCES bindings(name) ON DELETE CASCADE,
    at_ms       INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    status      TEXT NOT NULL,
    why         TEXT,
    code        INTEGER,
    field       TEXT,
    kept        TEXT NOT NULL,
    dropped     TEXT NOT NULL,
    ttl_seconds INTEGER,
    changed     INTEGER NOT NULL,
    reloaded    INTEGER NOT NULL,
    nginx_error TEXT
);
CREATE INDEX IF NOT EXISTS outcomes_by_binding ON outcomes(binding, id);
";

/// Steps from one schema version to the next: `(version reached, SQL)`. A file at version `v`
/// runs every step above `v`, in order, each in one transaction with its `user_version`.
/// (A new store is created with the version-1 `SCHEMA` and then runs every step.)
const MIGRATIONS: &[(i64, &str)] = &[
    // 2: the failure kind as a tag. Failures recorded before are classified from the words the
    // daemon wrote then (the one place where the prose is read); what does not match stays NULL.
    (
        2,
        "ALTER TABLE outcomes ADD COLUMN failure TEXT;
         UPDATE outcomes SET failure = CASE
             WHEN code IS NOT NULL THEN 'plugin_error'
             WHEN why LIKE 'plugin %' THEN 'plugin_no_answer'
             WHEN why LIKE 'no valid target%' OR why LIKE 'the service has no servers%'
                 THEN 'no_valid_target'
             WHEN why LIKE 'nginx -t failed%' THEN 'test_failed'
             WHEN why LIKE 'nginx reload failed%' THEN 'reload_failed'
             WHEN why LIKE 'the file could not be written%' THEN 'write_failed'
             WHEN why LIKE 'the daemon is stopping%' THEN 'stopping'
         END
         WHERE status = 'failed';",
    ),
    // 3: which path made a change live (issue 11) and why. Before, every applied change was a
    // reload.
    (
        3,
        "ALTER TABLE outcomes ADD COLUMN applied TEXT;
         ALTER TABLE outcomes ADD COLUMN applied_reason TEXT;
         UPDATE outcomes SET applied = 'reload' WHERE reloaded = 1;",
    ),
];
/// Unique binding names regardless of (ASCII) case.
const NOCASE_INDEX: &str =
    "CREATE UNIQUE INDEX IF NOT EXISTS bindings_name_nocase ON bindings(name COLLATE NOCASE);";

impl Store {
    /// Opens (creating if needed) the store at `path` with default options.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, StoreOptions::default())
    }

    /// Opens (creating if needed) the store at `path`. The parent folder is created (mode 0700
    /// when new); the file is created with mode 0600 and forced back to 0600 if it was wider.
    pub fn open_with(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(io)?;
            }
        }
        // Create the file ourselves so it never exists with a wider mode, then re-assert 0600.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;

        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion {
                path: path.to_path_buf(),
                found: version,
            });
        }
        let mut conn = conn;
        conn.execute_batch(SCHEMA)?;
        for (to, sql) in MIGRATIONS {
            if *to > version {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                tx.execute_batch(sql)?;
                tx.pragma_update(None, "user_version", to)?;
                tx.commit()?;
            }
        }
        // Binding names are unique regardless of case (nginx compares upstream names so). A store
        // written before this rule that holds two such names cannot get the index; it keeps
        // working without it (the daemon refuses new clashes before they reach the store).
        match conn.execute_batch(NOCASE_INDEX) {
            Ok(()) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation => {}
            Err(e) => return Err(e.into()),
        }
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
            history: opts.history_per_binding.max(1),
        })
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds a new binding; fails with [`StoreError::Duplicate`] if the name is taken.
    pub fn insert_binding(&mut self, b: &BindingRecord) -> Result<(), StoreError> {
        let now = now_ms();
        let res = self.conn.execute(
            "INSERT INTO bindings (name, plugin, provider, config, service, interval_secs, \
             directives, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
            params![
                b.name,
                b.plugin,
                b.provider,
                config_json(&b.config),
                b.service,
                b.interval_secs as i64,
                directives_json(&b.directives),
                now
            ],
        );
        match res {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::Duplicate(b.name.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces an existing binding (same name); fails with [`StoreError::NotFound`] otherwise.
    /// Its outcome history is kept.
    pub fn update_binding(&mut self, b: &BindingRecord) -> Result<(), StoreError> {
        let n = self.conn.execute(
            "UPDATE bindings SET plugin = ?2, provider = ?3, config = ?4, service = ?5, \
             interval_secs = ?6, directives = ?7, updated_at = ?8 WHERE name = ?1",
            params![
                b.name,
                b.plugin,
                b.provider,
                config_json(&b.config),
                b.service,
                b.interval_secs as i64,
                directives_json(&b.directives),
                now_ms()
            ],
        )?;
        if n == 0 {
            return Err(StoreError::NotFound(b.name.clone()));
        }
        Ok(())
    }

    /// Inserts or updates many bindings in one transaction; returns what happened to each, in order.
    pub fn upsert_bindings(&mut self, list: &[BindingRecord]) -> Result<Vec<Upsert>, StoreError> {
        let now = now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(list.len());
        {
            let mut get = tx.prepare_cached(SELECT_BINDING_BY_NAME)?;
            let mut ins = tx.prepare_cached(
                "INSERT INTO bindings (name, plugin, provider, config, service, interval_secs, \
                 directives, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
            )?;
            let mut upd = tx.prepare_cached(
                "UPDATE bindings SET plugin = ?2, provider = ?3, config = ?4, service = ?5, \
                 interval_secs = ?6, directives = ?7, updated_at = ?8 WHERE name = ?1",
            )?;
            for b in list {
                let existing = match get.query_row([&b.name], binding_from_row).optional()? {
                    None => None,
                    Some(r) => Some(r?),
                };
                let p = params![
                    b.name,
                    b.plugin,
                    b.provider,
                    config_json(&b.config),
                    b.service,
                    b.interval_secs as i64,
                    directives_json(&b.directives),
                    now
                ];
                match existing {
                    None => {
                        ins.execute(p).map_err(|e| match e {
                            rusqlite::Error::SqliteFailure(f, _)
                                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
                            {
                                StoreError::Duplicate(b.name.clone())
                            }
                            e => e.into(),
                        })?;
                        out.push(Upsert::Created);
                    }
                    Some(old) if old.binding == *b => out.push(Upsert::Unchanged),
                    Some(_) => {
                        upd.execute(p)?;
                        out.push(Upsert::Updated);
                    }
                }
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// Inserts or updates one binding.
    pub fn upsert_binding(&mut self, b: &BindingRecord) -> Result<Upsert, StoreError> {
        Ok(self.upsert_bindings(std::slice::from_ref(b))?[0])
    }

    /// One binding by name.
    pub fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError> {
        let mut st = self.conn.prepare_cached(SELECT_BINDING_BY_NAME)?;
        match st.query_row([name], binding_from_row).optional()? {
            None => Ok(None),
            Some(r) => Ok(Some(r?)),
        }
    }

    /// All bindings, ordered by name.
    pub fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT name, plugin, provider, config, service, interval_secs, directives, \
             created_at, updated_at FROM bindings ORDER BY name",
        )?;
        let rows = st.query_map([], binding_from_row)?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r??);
        }
        Ok(out)
    }

    /// Removes a binding and its outcomes; `false` when there was none.
    pub fn remove_binding(&mut self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute("DELETE FROM bindings WHERE name = ?1", [name])?;
        Ok(n > 0)
    }

    /// Records one outcome (see [`Store::record_outcomes`]).
    pub fn record_outcome(&mut self, name: &str, o: &OutcomeRecord) -> Result<(), StoreError> {
        self.record_outcomes(&[(name.to_string(), o.clone())])
    }

    /// Records outcomes in one transaction and trims each binding's history to the newest
    /// `history_per_binding`. Outcomes of bindings that no longer exist are ignored (the binding
    /// was removed while it was being resolved).
    pub fn record_outcomes(&mut self, list: &[(String, OutcomeRecord)]) -> Result<(), StoreError> {
        let history = self.history as i64;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut exists = tx.prepare_cached("SELECT 1 FROM bindings WHERE name = ?1")?;
            let mut ins = tx.prepare_cached(
                "INSERT INTO outcomes (binding, at_ms, duration_ms, status, why, code, field, kept, \
                 dropped, ttl_seconds, changed, reloaded, nginx_error, failure, applied, applied_reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?;
            let mut trim = tx.prepare_cached(
                "DELETE FROM outcomes WHERE binding = ?1 AND id <= \
                 (SELECT id FROM outcomes WHERE binding = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            )?;
            for (name, o) in list {
                if exists.query_row([name], |_| Ok(())).optional()?.is_none() {
                    continue;
                }
                ins.execute(params![
                    name,
                    o.at_ms,
                    o.duration_ms as i64,
                    o.status.as_str(),
                    o.why,
                    o.code,
                    o.field,
                    serde_json::to_string(&o.kept).unwrap_or_else(|_| "[]".into()),
                    serde_json::to_string(&o.dropped).unwrap_or_else(|_| "[]".into()),
                    o.ttl_seconds.map(|t| t as i64),
                    o.changed,
                    o.reloaded,
                    o.nginx_error,
                    o.failure.map(Failure::as_str),
                    o.applied.map(Applied::as_str),
                    o.applied_reason,
                ])?;
                trim.execute(params![name, history])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The newest outcomes of one binding, newest first, at most `limit`.
    pub fn recent_outcomes(
        &self,
        name: &str,
        limit: usize,
    ) -> Result<Vec<OutcomeRecord>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT binding, at_ms, duration_ms, status, why, code, field, kept, dropped, \
             ttl_seconds, changed, reloaded, nginx_error, failure, applied, applied_reason FROM outcomes WHERE binding = ?1 \
             ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = st.query_map(params![name, limit as i64], outcome_from_row)?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r??);
        }
        Ok(out)
    }

    /// The newest outcome of every binding that has one.
    pub fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT binding, at_ms, duration_ms, status, why, code, field, kept, dropped, \
             ttl_seconds, changed, reloaded, nginx_error, failure, applied, applied_reason FROM outcomes \
             WHERE id IN (SELECT MAX(id) FROM outcomes GROUP BY binding)",
        )?;
        let mut rows = st.query([])?;
        let mut out = HashMap::new();
        while let Some(row) = rows.next()? {
            let name: String = row.get(0)?;
            out.insert(name, outcome_from_row(row)??);
        }
        Ok(out)
    }
}

const SELECT_BINDING_BY_NAME: &str = "SELECT name, plugin, provider, config, service, \
     interval_secs, directives, created_at, updated_at FROM bindings WHERE name = ?1";

fn config_json(c: &BTreeMap<String, serde_json::Value>) -> String {
    serde_json::to_string(c).unwrap_or_else(|_| "{}".into())
}

fn directives_json(d: &[String]) -> String {
    serde_json::to_string(d).unwrap_or_else(|_| "[]".into())
}

type RowResult<T> = rusqlite::Result<Result<T, StoreError>>;

fn binding_from_row(row: &Row<'_>) -> RowResult<StoredBinding> {
    let name: String = row.get(0)?;
    let config: String = row.get(3)?;
    let directives: String = row.get(6)?;
    let interval: i64 = row.get(5)?;
    let Ok(config) = serde_json::from_str(&config) else {
        return Ok(Err(StoreError::Corrupt {
            binding: name,
            what: "config",
        }));
    };
    let Ok(directives) = serde_json::from_str(&directives) else {
        return Ok(Err(StoreError::Corrupt {
            binding: name,
            what: "directives",
        }));
    };
    Ok(Ok(StoredBinding {
        binding: BindingRecord {
            name,
            plugin: row.get(1)?,
            provider: row.get(2)?,
            config,
            service: row.get(4)?,
            interval_secs: interval.max(0) as u64,
            directives,
        },
        created_at_ms: row.get(7)?,
        updated_at_ms: row.get(8)?,
    }))
}

fn outcome_from_row(row: &Row<'_>) -> RowResult<OutcomeRecord> {
    let name: String = row.get(0)?;
    let corrupt = |what| {
        Ok(Err(StoreError::Corrupt {
            binding: name.clone(),
            what,
        }))
    };
    let status: String = row.get(3)?;
    let Some(status) = OutcomeStatus::parse(&status) else {
        return corrupt("outcome status");
    };
    let kept: String = row.get(7)?;
    let Ok(kept) = serde_json::from_str(&kept) else {
        return corrupt("kept targets");
    };
    let dropped: String = row.get(8)?;
    let Ok(dropped) = serde_json::from_str(&dropped) else {
        return corrupt("dropped targets");
    };
    let failure: Option<String> = row.get(13)?;
    let failure = match failure.as_deref().map(Failure::parse) {
        None => None,
        Some(Some(f)) => Some(f),
        Some(None) => return corrupt("failure kind"),
    };
    let applied: Option<String> = row.get(14)?;
    let applied = match applied.as_deref().map(Applied::parse) {
        None => None,
        Some(Some(a)) => Some(a),
        Some(None) => return corrupt("applied path"),
    };
    let duration: i64 = row.get(2)?;
    let ttl: Option<i64> = row.get(9)?;
    Ok(Ok(OutcomeRecord {
        at_ms: row.get(1)?,
        duration_ms: duration.max(0) as u64,
        status,
        failure,
        why: row.get(4)?,
        code: row.get(5)?,
        field: row.get(6)?,
        kept,
        dropped,
        ttl_seconds: ttl.map(|t| t.max(0) as u64),
        changed: row.get(10)?,
        reloaded: row.get(11)?,
        nginx_error: row.get(12)?,
        applied,
        applied_reason: row.get(15)?,
    }))
}
