//! The schema of the SQLite file and its migrations. The version is kept in
//! `PRAGMA user_version`; [`migrate`] brings an older file up to date with the steps of
//! `MIGRATIONS`, each in one transaction, and refuses a file newer than this build.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::StoreError;

/// Schema version written to `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 5;

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
    // 3: which path made a change live (reload or the live API) and why. Before, every applied change was a
    // reload.
    (
        3,
        "ALTER TABLE outcomes ADD COLUMN applied TEXT;
         ALTER TABLE outcomes ADD COLUMN applied_reason TEXT;
         UPDATE outcomes SET applied = 'reload' WHERE reloaded = 1;",
    ),
    // 4: a binding's live settings: the module's `probe` parameters (NULL: none) and
    // how long a removed target is drained first (0: removed at once, as before).
    (
        4,
        "ALTER TABLE bindings ADD COLUMN probe TEXT;
         ALTER TABLE bindings ADD COLUMN drain_secs INTEGER NOT NULL DEFAULT 0;",
    ),
    // 5: why a change took the reload path, as a tag next to `applied_reason`. Outcomes recorded
    // before keep NULL (their text is not read back into a kind).
    (5, "ALTER TABLE outcomes ADD COLUMN reload_reason TEXT;"),
];

/// Unique binding names regardless of (ASCII) case.
const NOCASE_INDEX: &str =
    "CREATE UNIQUE INDEX IF NOT EXISTS bindings_name_nocase ON bindings(name COLLATE NOCASE);";

/// Creates the tables of a new file, runs the migrations an older file needs and sets the
/// version; fails with [`StoreError::SchemaVersion`] for a file written by a newer version.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaVersion {
            path: path.to_path_buf(),
            found: version,
        });
    }
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
    Ok(())
}
