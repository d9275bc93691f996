//! The SQLite implementation: [`SqliteFile`], the synchronous database file (bindings and the
//! outcome history), and [`SqliteStore`], the [`BindingStore`] over it for a single host.
//!
//! The schema is versioned (`PRAGMA user_version`); [`SqliteFile::open`] brings an older file up
//! to date with the steps of `MIGRATIONS`, each in one transaction.
//!
//! By concern: `schema.rs` (tables and migrations), `file.rs` ([`SqliteFile`]), `rows.rs` (row
//! encoding and decoding), `store.rs` ([`SqliteStore`]) and `mirror.rs` (the etcd store's writes
//! into its local mirror file).

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
         changed, reloaded, nginx_error, failure, applied, applied_reason, reload_reason"
    };
}

mod file;
mod mirror;
mod rows;
mod schema;
mod store;

pub use file::{SqliteFile, StoreOptions, DEFAULT_HISTORY};
pub(crate) use mirror::MirrorOp;
pub use schema::SCHEMA_VERSION;
pub(crate) use store::same_targets;
pub use store::SqliteStore;
