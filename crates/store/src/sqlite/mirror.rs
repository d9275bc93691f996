//! The etcd store's writes into its local mirror (a [`SqliteFile`]).

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::rows::{binding_from_row, config_json, directives_json, SELECT_BINDING_BY_NAME};
use super::SqliteFile;
use crate::{StoreError, StoredBinding};

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
