//! The SQLite implementation: [`SqliteFile`], the synchronous database file (bindings and the
//! outcome history), and [`SqliteStore`], the [`BindingStore`] over it for a single host.
//!
//! The schema is versioned (`PRAGMA user_version`); [`SqliteFile::open`] brings an older file up
//! to date with the steps of `MIGRATIONS`, each in one transaction.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, Row, Statement, TransactionBehavior};
use tokio::sync::broadcast;

use crate::{
    lock, now_ms, Applied, BindingRecord, BindingStore, Failure, FleetHost, FleetView, HostOutcome,
    OutcomeRecord, OutcomeStatus, StoreError, StoreEvent, StoreStatus, StoredBinding, TargetSet,
    Upsert,
};

/// Schema version written to `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 4;

/// Default number of outcomes kept per binding.
pub const DEFAULT_HISTORY: usize = 20;

/// The columns of `bindings` that [`binding_from_row`] decodes, in its order (a literal, for
/// `concat!`).
macro_rules! binding_columns {
    () => {
        "name, plugin, provider, config, service, interval_secs, directives, created_at, updated_at, \
         probe, drain_secs"
    };
}

/// The columns of `outcomes` that [`outcome_from_row`] decodes, in its order (a literal, for
/// `concat!`).
macro_rules! outcome_columns {
    () => {
        "binding, at_ms, duration_ms, status, why, code, field, kept, dropped, ttl_seconds, \
         changed, reloaded, nginx_error, failure, applied, applied_reason"
    };
}

/// Options of [`SqliteFile::open_with`].
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

/// The SQLite database file: synchronous, one connection. [`SqliteStore`] is the
/// [`crate::BindingStore`] over it; the etcd store keeps its local mirror in one.
pub struct SqliteFile {
    conn: Connection,
    path: PathBuf,
    history: usize,
}

impl fmt::Debug for SqliteFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteFile")
            .field("path", &self.path)
            .finish()
    }
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
    // 4: a binding's live settings (issue 21): the module's `probe` parameters (NULL: none) and
    // how long a removed target is drained first (0: removed at once, as before).
    (
        4,
        "ALTER TABLE bindings ADD COLUMN probe TEXT;
         ALTER TABLE bindings ADD COLUMN drain_secs INTEGER NOT NULL DEFAULT 0;",
    ),
];
/// Unique binding names regardless of (ASCII) case.
const NOCASE_INDEX: &str =
    "CREATE UNIQUE INDEX IF NOT EXISTS bindings_name_nocase ON bindings(name COLLATE NOCASE);";

impl SqliteFile {
    /// Opens (creating if needed) the store at `path` with default options.
    pub fn open(path: &Path) -> Result<SqliteFile, StoreError> {
        SqliteFile::open_with(path, StoreOptions::default())
    }

    /// Opens (creating if needed) the store at `path`. The parent folder is created (mode 0700
    /// when new); the file is created with mode 0600 and forced back to 0600 if it was wider.
    pub fn open_with(path: &Path, opts: StoreOptions) -> Result<SqliteFile, StoreError> {
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
        Ok(SqliteFile {
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
             directives, created_at, updated_at, probe, drain_secs) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10)",
            params![
                b.name,
                b.plugin,
                b.provider,
                config_json(&b.config),
                b.service,
                b.interval_secs as i64,
                directives_json(&b.directives),
                now,
                b.probe,
                b.drain_secs as i64,
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
             interval_secs = ?6, directives = ?7, updated_at = ?8, probe = ?9, \
             drain_secs = ?10 WHERE name = ?1",
            params![
                b.name,
                b.plugin,
                b.provider,
                config_json(&b.config),
                b.service,
                b.interval_secs as i64,
                directives_json(&b.directives),
                now_ms(),
                b.probe,
                b.drain_secs as i64,
            ],
        )?;
        if n == 0 {
            return Err(StoreError::NotFound(b.name.clone()));
        }
        Ok(())
    }

    /// Inserts or updates many bindings in one transaction; returns what happened to each, in order.
    pub fn upsert_bindings(&mut self, list: &[BindingRecord]) -> Result<Vec<Upsert>, StoreError> {
        let based: Vec<(BindingRecord, Option<BindingRecord>)> =
            list.iter().map(|b| (b.clone(), None)).collect();
        self.upsert_bindings_from(&based)
    }

    /// [`SqliteFile::upsert_bindings`], each record written only while the file holds the record
    /// it was prepared from, when given ([`crate::BindingStore::upsert_bindings_from`]).
    pub fn upsert_bindings_from(
        &mut self,
        list: &[(BindingRecord, Option<BindingRecord>)],
    ) -> Result<Vec<Upsert>, StoreError> {
        let now = now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(list.len());
        {
            let mut get = tx.prepare_cached(SELECT_BINDING_BY_NAME)?;
            let mut ins = tx.prepare_cached(
                "INSERT INTO bindings (name, plugin, provider, config, service, interval_secs, \
                 directives, created_at, updated_at, probe, drain_secs) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10)",
            )?;
            let mut upd = tx.prepare_cached(
                "UPDATE bindings SET plugin = ?2, provider = ?3, config = ?4, service = ?5, \
                 interval_secs = ?6, directives = ?7, updated_at = ?8, probe = ?9, \
             drain_secs = ?10 WHERE name = ?1",
            )?;
            for (b, base) in list {
                let existing = binding_by_name(&mut get, &b.name)?;
                if base.is_some() && existing.as_ref().map(|sb| &sb.binding) != base.as_ref() {
                    return Err(StoreError::Conflict(b.name.clone()));
                }
                let p = params![
                    b.name,
                    b.plugin,
                    b.provider,
                    config_json(&b.config),
                    b.service,
                    b.interval_secs as i64,
                    directives_json(&b.directives),
                    now,
                    b.probe,
                    b.drain_secs as i64,
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
        binding_by_name(&mut st, name)
    }

    /// All bindings, ordered by name.
    pub fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        let mut st = self.conn.prepare_cached(concat!(
            "SELECT ",
            binding_columns!(),
            " FROM bindings ORDER BY name"
        ))?;
        let rows = st.query_map([], binding_from_row)?;
        decode_rows(rows)
    }

    /// Removes a binding and its outcomes; `false` when there was none.
    pub fn remove_binding(&mut self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute("DELETE FROM bindings WHERE name = ?1", [name])?;
        Ok(n > 0)
    }

    /// Records one outcome (see [`SqliteFile::record_outcomes`]).
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
        let mut st = self.conn.prepare_cached(concat!(
            "SELECT ",
            outcome_columns!(),
            " FROM outcomes WHERE binding = ?1 ORDER BY id DESC LIMIT ?2"
        ))?;
        let rows = st.query_map(params![name, limit as i64], outcome_from_row)?;
        decode_rows(rows)
    }

    /// The newest outcome of every binding that has one.
    pub fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError> {
        let mut st = self.conn.prepare_cached(concat!(
            "SELECT ",
            outcome_columns!(),
            " FROM outcomes WHERE id IN (SELECT MAX(id) FROM outcomes GROUP BY binding)"
        ))?;
        let mut rows = st.query([])?;
        let mut out = HashMap::new();
        while let Some(row) = rows.next()? {
            let name: String = row.get(0)?;
            out.insert(name, outcome_from_row(row)??);
        }
        Ok(out)
    }
}

const SELECT_BINDING_BY_NAME: &str = concat!(
    "SELECT ",
    binding_columns!(),
    " FROM bindings WHERE name = ?1"
);

/// The binding a [`SELECT_BINDING_BY_NAME`] statement finds, decoded; `None` when there is none.
fn binding_by_name(
    st: &mut Statement<'_>,
    name: &str,
) -> Result<Option<StoredBinding>, StoreError> {
    st.query_row([name], binding_from_row)
        .optional()?
        .transpose()
}

/// Every row of a query, decoded by [`binding_from_row`] or [`outcome_from_row`]; the first
/// error (SQLite's or a corrupt row's) wins.
fn decode_rows<T>(rows: impl Iterator<Item = RowResult<T>>) -> Result<Vec<T>, StoreError> {
    rows.map(|r| -> Result<T, StoreError> { r? }).collect()
}

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
            probe: row.get(9)?,
            drain_secs: row.get::<_, i64>(10)?.max(0) as u64,
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

/// The single-host [`BindingStore`]: the SQLite file for bindings and history, fleet state in
/// memory (this host is the whole fleet: it always resolves, its view lists itself only). Writes
/// run on a blocking thread.
pub struct SqliteStore {
    file: Arc<Mutex<SqliteFile>>,
    host_id: String,
    location: String,
    fleet: Mutex<LocalFleet>,
    events: broadcast::Sender<StoreEvent>,
}

#[derive(Default)]
struct LocalFleet {
    generation: i64,
    targets: HashMap<String, TargetSet>,
    outcomes: HashMap<String, HostOutcome>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.location)
            .field("host_id", &self.host_id)
            .finish()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the SQLite file at `path` (see [`SqliteFile::open_with`]).
    pub fn open(path: &Path, opts: StoreOptions, host_id: &str) -> Result<SqliteStore, StoreError> {
        Ok(SqliteStore::new(
            SqliteFile::open_with(path, opts)?,
            host_id,
        ))
    }

    /// The store over an open file.
    pub fn new(file: SqliteFile, host_id: &str) -> SqliteStore {
        SqliteStore {
            location: file.path().display().to_string(),
            file: Arc::new(Mutex::new(file)),
            host_id: host_id.to_string(),
            fleet: Mutex::new(LocalFleet::default()),
            events: broadcast::channel(16).0,
        }
    }

    /// Runs `f` on the file on a blocking thread.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SqliteFile) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || f(&mut lock(&file)))
            .await
            .map_err(|e| StoreError::Unavailable {
                store: "sqlite".into(),
                why: format!("the store's thread ended: {e}"),
            })?
    }
}

#[async_trait]
impl BindingStore for SqliteStore {
    fn status(&self) -> StoreStatus {
        StoreStatus {
            kind: "sqlite",
            host_id: self.host_id.clone(),
            connected: true,
            unreachable_since_ms: None,
            last_error: None,
            location: self.location.clone(),
        }
    }

    fn host_id(&self) -> &str {
        &self.host_id
    }

    fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        lock(&self.file).list_bindings()
    }

    fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError> {
        lock(&self.file).get_binding(name)
    }

    async fn insert_binding(&self, b: &BindingRecord) -> Result<(), StoreError> {
        let b = b.clone();
        self.blocking(move |f| f.insert_binding(&b)).await
    }

    async fn upsert_bindings_from(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
    ) -> Result<Vec<Upsert>, StoreError> {
        let list = list.to_vec();
        self.blocking(move |f| f.upsert_bindings_from(&list)).await
    }

    async fn remove_binding(&self, name: &str) -> Result<bool, StoreError> {
        let n = name.to_string();
        let removed = self.blocking(move |f| f.remove_binding(&n)).await?;
        let mut fleet = lock(&self.fleet);
        fleet.targets.remove(name);
        fleet.outcomes.remove(name);
        Ok(removed)
    }

    async fn record_outcomes(&self, list: &[(String, OutcomeRecord)]) -> Result<(), StoreError> {
        let list = list.to_vec();
        self.blocking(move |f| f.record_outcomes(&list)).await
    }

    fn recent_outcomes(&self, name: &str, limit: usize) -> Result<Vec<OutcomeRecord>, StoreError> {
        lock(&self.file).recent_outcomes(name, limit)
    }

    fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError> {
        lock(&self.file).last_outcomes()
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.events.subscribe()
    }

    async fn claim_resolver(&self, _name: &str) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn publish_targets(&self, name: &str, set: &TargetSet) -> Result<(), StoreError> {
        let mut fleet = lock(&self.fleet);
        if fleet
            .targets
            .get(name)
            .is_some_and(|old| same_targets(old, set))
        {
            return Ok(());
        }
        fleet.generation += 1;
        let mut set = set.clone();
        set.resolved_by = self.host_id.clone();
        set.generation = fleet.generation;
        fleet.targets.insert(name.to_string(), set);
        Ok(())
    }

    fn published_targets(&self, name: &str) -> Option<TargetSet> {
        lock(&self.fleet).targets.get(name).cloned()
    }

    async fn publish_host_outcome(
        &self,
        name: &str,
        outcome: &HostOutcome,
    ) -> Result<(), StoreError> {
        let mut o = outcome.clone();
        o.host = self.host_id.clone();
        lock(&self.fleet).outcomes.insert(name.to_string(), o);
        Ok(())
    }

    fn fleet_view(&self, name: &str) -> FleetView {
        let fleet = lock(&self.fleet);
        FleetView {
            resolver: Some(self.host_id.clone()),
            generation: fleet.targets.get(name).map_or(0, |t| t.generation),
            hosts: fleet
                .outcomes
                .get(name)
                .map(|o| FleetHost {
                    outcome: o.clone(),
                    alive: true,
                })
                .into_iter()
                .collect(),
        }
    }
}

/// Two sets publish the same thing (times and generations aside).
pub(crate) fn same_targets(a: &TargetSet, b: &TargetSet) -> bool {
    a.targets == b.targets
        && a.dropped == b.dropped
        && a.ttl_seconds == b.ttl_seconds
        && a.binding_updated_at_ms == b.binding_updated_at_ms
}

impl SqliteFile {
    /// The etcd store's mirror writes, in one transaction: `puts` stored with their own
    /// timestamps (an existing row is updated in place, so its outcome history stays), `removes`
    /// deleted with their history. Returns the names whose stored binding changed. A put that
    /// clashes with another name differing only in case is skipped (and named in the error list).
    pub(crate) fn mirror_apply(
        &mut self,
        puts: &[StoredBinding],
        removes: &[String],
    ) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut changed = Vec::new();
        let mut clashes = Vec::new();
        {
            let mut get = tx.prepare_cached(SELECT_BINDING_BY_NAME)?;
            let mut put = tx.prepare_cached(
                "INSERT INTO bindings (name, plugin, provider, config, service, interval_secs, \
                 directives, created_at, updated_at, probe, drain_secs) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
                 ON CONFLICT(name) DO UPDATE SET plugin = ?2, provider = ?3, config = ?4, \
                 service = ?5, interval_secs = ?6, directives = ?7, created_at = ?8, \
                 updated_at = ?9, probe = ?10, drain_secs = ?11",
            )?;
            let mut del = tx.prepare_cached("DELETE FROM bindings WHERE name = ?1")?;
            for sb in puts {
                let b = &sb.binding;
                let existing = match get.query_row([&b.name], binding_from_row).optional()? {
                    None => None,
                    Some(r) => r.ok(),
                };
                if existing.as_ref() == Some(sb) {
                    continue;
                }
                let res = put.execute(params![
                    b.name,
                    b.plugin,
                    b.provider,
                    config_json(&b.config),
                    b.service,
                    b.interval_secs as i64,
                    directives_json(&b.directives),
                    sb.created_at_ms,
                    sb.updated_at_ms,
                    b.probe,
                    b.drain_secs as i64,
                ]);
                match res {
                    Ok(_) => changed.push(b.name.clone()),
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                    {
                        clashes.push(b.name.clone())
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            for name in removes {
                if del.execute([name])? > 0 {
                    changed.push(name.clone());
                }
            }
        }
        tx.commit()?;
        Ok((changed, clashes))
    }
}
