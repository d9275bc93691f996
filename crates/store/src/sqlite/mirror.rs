//! The etcd store's writes into its local mirror (a [`SqliteFile`]).

use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::rows::{binding_from_row, config_json, directives_json, SELECT_BINDING_BY_NAME};
use super::SqliteFile;
use crate::{StoreError, StoredBinding};

/// One write of the etcd store's mirror.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MirrorOp {
    /// Stored with its own timestamps (an existing row is updated in place, so its outcome
    /// history stays).
    Put(StoredBinding),
    /// Deleted with its history.
    Remove(String),
}

impl SqliteFile {
    /// The etcd store's mirror writes, in one transaction and in their order (a binding removed
    /// and created again in one batch is there after it). Returns the names whose stored binding
    /// changed, and the positions of the puts skipped because they clash with another name
    /// differing only in case.
    pub(crate) fn mirror_apply(
        &mut self,
        ops: &[MirrorOp],
    ) -> Result<(Vec<String>, Vec<usize>), StoreError> {
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
            for (i, op) in ops.iter().enumerate() {
                let sb = match op {
                    MirrorOp::Put(sb) => sb,
                    MirrorOp::Remove(name) => {
                        if del.execute([name])? > 0 {
                            changed.push(name.clone());
                        }
                        continue;
                    }
                };
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
                        clashes.push(i)
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        tx.commit()?;
        Ok((changed, clashes))
    }
}
