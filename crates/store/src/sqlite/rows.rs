//! Rows of the SQLite file to and from the store's types: the column lists, the row decoders,
//! and the JSON text of a binding's config and directives.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Row, Statement};

use crate::{
    Applied, BindingRecord, Failure, OutcomeRecord, OutcomeStatus, ReloadReason, StoreError,
    StoredBinding,
};

pub(super) const SELECT_BINDING_BY_NAME: &str = concat!(
    "SELECT ",
    binding_columns!(),
    " FROM bindings WHERE name = ?1"
);

/// The binding a [`SELECT_BINDING_BY_NAME`] statement finds, decoded; `None` when there is none.
pub(super) fn binding_by_name(
    st: &mut Statement<'_>,
    name: &str,
) -> Result<Option<StoredBinding>, StoreError> {
    st.query_row([name], binding_from_row)
        .optional()?
        .transpose()
}

/// Every row of a query, decoded by [`binding_from_row`] or [`outcome_from_row`]; the first
/// error (SQLite's or a corrupt row's) wins.
pub(super) fn decode_rows<T>(
    rows: impl Iterator<Item = RowResult<T>>,
) -> Result<Vec<T>, StoreError> {
    rows.map(|r| -> Result<T, StoreError> { r? }).collect()
}

pub(super) fn config_json(c: &BTreeMap<String, serde_json::Value>) -> String {
    serde_json::to_string(c).unwrap_or_else(|_| "{}".into())
}

pub(super) fn directives_json(d: &[String]) -> String {
    serde_json::to_string(d).unwrap_or_else(|_| "[]".into())
}

pub(super) type RowResult<T> = rusqlite::Result<Result<T, StoreError>>;

pub(super) fn binding_from_row(row: &Row<'_>) -> RowResult<StoredBinding> {
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

pub(super) fn outcome_from_row(row: &Row<'_>) -> RowResult<OutcomeRecord> {
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
    let reload_reason: Option<String> = row.get(16)?;
    let reload_reason = match reload_reason.as_deref().map(ReloadReason::parse) {
        None => None,
        Some(Some(r)) => Some(r),
        Some(None) => return corrupt("reload reason"),
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
        reload_reason,
    }))
}
