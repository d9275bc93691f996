//! [`SqliteStore`], the single-host [`BindingStore`] over a [`SqliteFile`].

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::{SqliteFile, StoreOptions};
use crate::{
    lock, BindingRecord, BindingStore, FleetHost, FleetView, HostOutcome, OutcomeRecord,
    StoreError, StoreEvent, StoreStatus, StoredBinding, TargetSet, Upsert,
};

/// The single-host [`BindingStore`]: the SQLite file for bindings and history, fleet state in
/// memory (this host is the whole fleet: it always resolves, its view lists itself only). Writes
/// run on a blocking thread, on the file's connection; reads on a read-only connection of their
/// own, so a read answers at once (with what is committed) while a write waits on SQLite (a slow
/// disk, another process holding the file's write lock up to the 5 s busy timeout): in WAL mode
/// a reader is not blocked by a writer.
pub struct SqliteStore {
    file: Arc<Mutex<SqliteFile>>,
    reader: Mutex<SqliteFile>,
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
        SqliteStore::new(SqliteFile::open_with(path, opts)?, host_id)
    }

    /// The store over an open file (and a read-only connection of its own to it).
    pub fn new(file: SqliteFile, host_id: &str) -> Result<SqliteStore, StoreError> {
        Ok(SqliteStore {
            location: file.path().display().to_string(),
            reader: Mutex::new(file.reader()?),
            file: Arc::new(Mutex::new(file)),
            host_id: host_id.to_string(),
            fleet: Mutex::new(LocalFleet::default()),
            events: broadcast::channel(16).0,
        })
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
            refused_values: 0,
            integrity_required: false,
        }
    }

    fn host_id(&self) -> &str {
        &self.host_id
    }

    fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        lock(&self.reader).list_bindings()
    }

    fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError> {
        lock(&self.reader).get_binding(name)
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
        lock(&self.reader).recent_outcomes(name, limit)
    }

    fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError> {
        lock(&self.reader).last_outcomes()
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
