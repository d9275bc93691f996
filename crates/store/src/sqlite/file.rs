//! [`SqliteFile`], the synchronous database file: opening it (mode 0600, WAL), the bindings and
//! the outcome history.

use std::collections::HashMap;
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::rows::{
    binding_by_name, binding_from_row, config_json, decode_rows, directives_json, outcome_from_row,
    SELECT_BINDING_BY_NAME,
};
use super::schema;
use crate::{
    now_ms, Applied, BindingRecord, Failure, OutcomeRecord, ReloadReason, StoreError,
    StoredBinding, Upsert,
};

/// Default number of outcomes kept per binding.
pub const DEFAULT_HISTORY: usize = 20;

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

/// The SQLite database file: synchronous, one connection. [`SqliteStore`](super::SqliteStore) is the
/// [`crate::BindingStore`] over it; the etcd store keeps its local mirror in one.
pub struct SqliteFile {
    pub(super) conn: Connection,
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
        let mut conn = conn;
        schema::migrate(&mut conn, path)?;
        Ok(SqliteFile {
            conn,
            path: path.to_path_buf(),
            history: opts.history_per_binding.max(1),
        })
    }

    /// Another connection to this file, for reads only (`query_only`): in WAL mode its reads are
    /// not blocked by a write of this connection or another process's.
    pub(crate) fn reader(&self) -> Result<SqliteFile, StoreError> {
        let conn = Connection::open(&self.path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "query_only", "ON")?;
        Ok(SqliteFile {
            conn,
            path: self.path.clone(),
            history: self.history,
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
                 dropped, ttl_seconds, changed, reloaded, nginx_error, failure, applied, applied_reason, \
                 reload_reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
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
                    o.reload_reason.map(ReloadReason::as_str),
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
