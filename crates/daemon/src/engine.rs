//! The engine: bindings → plugin call → validate → render → batched apply → outcome → store.
//!
//! - Each binding has one tokio task that sleeps until its next refresh (schedule maths of
//!   `tributary_core::schedule`: interval, shorter TTL, back-off after failures) or until a person
//!   asks for a refresh, then resolves through the plugin host, validates and renders.
//! - A failed resolution, or an answer without one valid target, is recorded as a failure and never
//!   reaches the applier: **an error never empties an upstream**.
//! - Rendered files go to a single apply task over a channel. It collects the changes that become
//!   ready close together (it waits until no new change arrived for `batch_quiet`, at most
//!   `batch_max` after the first) and hands them to `Applier::apply_batch` as one batch (one
//!   `nginx -t`, one reload) on a blocking thread. Removals go through the same task, so every
//!   write, test and reload is serialised.
//! - Outcomes go to a recorder task that writes them to the store in one transaction per burst.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::AbortHandle;
use tributary_apply::{Applier, Change, ChangeOutcome, RemoveOutcome};
use tributary_core::{schedule, Binding, ExtraDirective, UpstreamName};
use tributary_plugin_host::PluginHost;
use tributary_protocol::{ConfigMap, ProviderDecl, ResolveParams};
use tributary_store::{BindingRecord, OutcomeRecord, OutcomeStatus, Store, Upsert};

use crate::resolution::Resolved;
use crate::view::{BindingDetail, BindingInput, BindingView, BulkItem, RemoveResponse};

/// Longest refresh interval accepted (one week).
pub const MAX_INTERVAL_SECS: u64 = 7 * 24 * 3600;
/// Longest service string accepted.
pub const MAX_SERVICE_LEN: usize = 1024;

/// Engine tuning.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The nginx conf dir (for showing file paths).
    pub conf_dir: PathBuf,
    /// A batch closes when no new change arrived for this long...
    pub batch_quiet: Duration,
    /// ...or this long after its first change, whichever comes first.
    pub batch_max: Duration,
    /// Outcomes returned by [`Engine::show`].
    pub history_limit: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            conf_dir: PathBuf::new(),
            batch_quiet: Duration::from_millis(100),
            batch_max: Duration::from_secs(1),
            history_limit: 20,
        }
    }
}

/// Errors of engine operations. None carries a config value.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad input; `field` names the input at fault.
    #[error("{message}")]
    Invalid {
        message: String,
        field: Option<String>,
    },
    #[error("no binding named {0:?}")]
    NotFound(String),
    #[error("a binding named {0:?} already exists")]
    Duplicate(String),
    /// The operation was refused because of nginx's state (e.g. removal while still included).
    #[error("{0}")]
    Conflict(String),
    #[error("store: {0}")]
    Store(#[from] tributary_store::StoreError),
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("timed out waiting for the resolution of {0:?}")]
    Timeout(String),
}

impl EngineError {
    fn invalid(field: &str, message: impl Into<String>) -> EngineError {
        EngineError::Invalid {
            message: message.into(),
            field: Some(field.to_string()),
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

enum ApplyMsg {
    Change(Change, oneshot::Sender<ChangeOutcome>),
    Remove(UpstreamName, oneshot::Sender<Result<RemoveOutcome, String>>),
    Stop(oneshot::Sender<()>),
}

enum RecordMsg {
    Outcome(String, OutcomeRecord),
    Flush(oneshot::Sender<()>),
}

struct SlotState {
    binding: Arc<Binding>,
    record: BindingRecord,
    task: Option<AbortHandle>,
    last: Option<OutcomeRecord>,
    servers: Vec<Value>,
    next_ms: Option<i64>,
    failures: u32,
    running: bool,
    /// `seq` when the current task was spawned: its first outcome is the one after it.
    spawn_seq: u64,
}

struct Slot {
    wake: Notify,
    /// Bumped after every finished resolution.
    seq: watch::Sender<u64>,
    state: Mutex<SlotState>,
}

struct Inner {
    host: Arc<PluginHost>,
    store: Arc<Mutex<Store>>,
    apply_tx: mpsc::UnboundedSender<ApplyMsg>,
    record_tx: mpsc::UnboundedSender<RecordMsg>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Serialises saves and removals (store write + task restart).
    admin: tokio::sync::Mutex<()>,
    opts: EngineOptions,
    /// Batches handed to the applier (for the benchmark and the health endpoint).
    batches: std::sync::atomic::AtomicU64,
    /// Outcomes and apply batches, for observers (metrics, UI); nobody listening is fine.
    events: tokio::sync::broadcast::Sender<EngineEvent>,
}

/// What the engine reports to observers ([`Engine::subscribe`]): the metrics read these.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// A resolution of `binding` finished.
    Outcome {
        binding: String,
        outcome: OutcomeRecord,
    },
    /// An apply batch finished: how many changes, whether nginx was reloaded, how many changes
    /// `nginx -t` refused.
    Batch {
        changes: usize,
        reloaded: bool,
        test_failures: usize,
        at_ms: i64,
    },
}

/// The running engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    /// Starts the engine on the bindings in `store`: every binding resolves once right away (so
    /// a restart brings stale files up to date in one batch), then on its schedule.
    pub fn start(
        store: Store,
        host: Arc<PluginHost>,
        applier: Applier,
        opts: EngineOptions,
    ) -> Result<Engine, EngineError> {
        let stored = store.list_bindings()?;
        let last = store.last_outcomes()?;
        let mut seeds = Vec::new();
        for sb in stored {
            let rec = sb.binding;
            let binding = match record_to_binding(&rec) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(binding = %rec.name, error = %e, "stored binding is invalid; not scheduled");
                    continue;
                }
            };
            let servers = store
                .recent_outcomes(&rec.name, opts.history_limit.max(1))?
                .into_iter()
                .find(|o| o.status != OutcomeStatus::Failed)
                .map(|o| o.kept)
                .unwrap_or_default();
            let last = last.get(&rec.name).cloned();
            seeds.push((binding, rec, last, servers));
        }

        let store = Arc::new(Mutex::new(store));
        let (apply_tx, apply_rx) = mpsc::unbounded_channel();
        let (record_tx, record_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            host,
            store: store.clone(),
            apply_tx,
            record_tx,
            slots: Mutex::new(HashMap::new()),
            admin: tokio::sync::Mutex::new(()),
            opts,
            batches: Default::default(),
            events: tokio::sync::broadcast::channel(4096).0,
        });
        tokio::spawn(apply_task(
            applier,
            apply_rx,
            Arc::downgrade(&inner),
            inner.opts.batch_quiet,
            inner.opts.batch_max,
        ));
        tokio::spawn(record_task(store, record_rx));

        let engine = Engine { inner };
        for (binding, rec, last, servers) in seeds {
            let slot = engine.new_slot(binding, rec);
            {
                let mut st = lock(&slot.state);
                st.last = last;
                st.servers = servers;
            }
            engine.spawn(&slot);
        }
        Ok(engine)
    }

    fn new_slot(&self, binding: Binding, record: BindingRecord) -> Arc<Slot> {
        let name = record.name.clone();
        let slot = Arc::new(Slot {
            wake: Notify::new(),
            seq: watch::Sender::new(0),
            state: Mutex::new(SlotState {
                binding: Arc::new(binding),
                record,
                task: None,
                last: None,
                servers: Vec::new(),
                next_ms: None,
                failures: 0,
                running: false,
                spawn_seq: 0,
            }),
        });
        lock(&self.inner.slots).insert(name, slot.clone());
        slot
    }

    /// (Re)starts the slot's task; it resolves right away.
    fn spawn(&self, slot: &Arc<Slot>) {
        let mut st = lock(&slot.state);
        if let Some(t) = st.task.take() {
            t.abort();
        }
        st.running = false;
        st.failures = 0;
        st.spawn_seq = *slot.seq.borrow();
        let handle = tokio::spawn(binding_task(
            Arc::downgrade(&self.inner),
            slot.clone(),
            st.binding.clone(),
        ));
        st.task = Some(handle.abort_handle());
    }

    /// Number of batches handed to the applier since start.
    pub fn batches(&self) -> u64 {
        self.inner
            .batches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Outcomes and batches from now on (a slow receiver loses the oldest events).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<EngineEvent> {
        self.inner.events.subscribe()
    }

    /// Validates `input` as a save would (secret fields left out keep the stored values of the
    /// binding `path_name`) without saving anything: for a test resolution.
    pub fn preview_binding(
        &self,
        input: &BindingInput,
        path_name: Option<&str>,
    ) -> Result<Binding, EngineError> {
        let name = path_name.unwrap_or(&input.name);
        let previous = lock(&self.inner.slots)
            .get(name)
            .map(|s| lock(&s.state).record.clone());
        self.prepare(input, path_name, previous.as_ref())
            .map(|(b, _)| b)
    }

    /// The plugin host.
    pub fn host(&self) -> &Arc<PluginHost> {
        &self.inner.host
    }

    /// Validates `input` (name taken from `path_name` when given) into a binding and its record.
    /// Secret fields absent from `input` keep their value from `previous`.
    fn prepare(
        &self,
        input: &BindingInput,
        path_name: Option<&str>,
        previous: Option<&BindingRecord>,
    ) -> Result<(Binding, BindingRecord), EngineError> {
        let name = match path_name {
            Some(p) if !input.name.is_empty() && input.name != p => {
                return Err(EngineError::invalid(
                    "name",
                    format!(
                        "the name in the body ({:?}) differs from the one in the path ({p:?})",
                        input.name
                    ),
                ))
            }
            Some(p) => p.to_string(),
            None => input.name.clone(),
        };
        UpstreamName::parse(&name)
            .map_err(|e| EngineError::invalid("name", format!("upstream name {name:?}: {e}")))?;
        for d in &input.directives {
            ExtraDirective::parse(d).map_err(|e| {
                EngineError::invalid("directives", format!("extra directive {d:?}: {e}"))
            })?;
        }
        let interval = input
            .interval_secs
            .unwrap_or(schedule::DEFAULT_INTERVAL.as_secs());
        let min = schedule::MIN_INTERVAL.as_secs();
        if interval < min {
            return Err(EngineError::invalid(
                "interval_secs",
                format!("refresh interval {interval} s is too short: the minimum is {min} s"),
            ));
        }
        if interval > MAX_INTERVAL_SECS {
            return Err(EngineError::invalid(
                "interval_secs",
                format!(
                    "refresh interval {interval} s is too long: the maximum is {MAX_INTERVAL_SECS} s"
                ),
            ));
        }
        if input.service.len() > MAX_SERVICE_LEN {
            return Err(EngineError::invalid(
                "service",
                format!("service must be at most {MAX_SERVICE_LEN} characters"),
            ));
        }
        let decl = self.provider_decl(&input.plugin, &input.provider)?;
        let mut config = input.config.clone();
        if let Some(prev) = previous {
            if prev.plugin == input.plugin && prev.provider == input.provider {
                for f in decl.configuration.fields.iter().filter(|f| f.secret) {
                    if !config.contains_key(&f.key) {
                        if let Some(v) = prev.config.get(&f.key) {
                            config.insert(f.key.clone(), v.clone());
                        }
                    }
                }
            }
        }
        let record = BindingRecord {
            name,
            plugin: input.plugin.clone(),
            provider: input.provider.clone(),
            config,
            service: input.service.clone(),
            interval_secs: interval,
            directives: input.directives.clone(),
        };
        let binding = record_to_binding_with(&record, Some(&decl))?;
        // Store the config as the plugin receives it (typed values after coercion).
        let record = BindingRecord {
            config: binding.config.as_map().clone(),
            ..record
        };
        Ok((binding, record))
    }

    fn provider_decl(&self, plugin: &str, provider: &str) -> Result<ProviderDecl, EngineError> {
        if !self.inner.host.plugins().iter().any(|p| p.name == plugin) {
            return Err(EngineError::invalid(
                "plugin",
                format!("no plugin named {plugin:?} is loaded"),
            ));
        }
        self.inner.host.provider(plugin, provider).ok_or_else(|| {
            EngineError::invalid(
                "provider",
                format!("plugin {plugin:?} has no provider {provider:?}"),
            )
        })
    }

    /// Creates a binding; fails if the name is taken.
    pub async fn add(&self, input: &BindingInput) -> Result<BindingView, EngineError> {
        let _admin = self.inner.admin.lock().await;
        let (binding, record) = self.prepare(input, None, None)?;
        if lock(&self.inner.slots).contains_key(&record.name) {
            return Err(EngineError::Duplicate(record.name));
        }
        lock(&self.inner.store)
            .insert_binding(&record)
            .map_err(|e| match e {
                tributary_store::StoreError::Duplicate(n) => EngineError::Duplicate(n),
                e => e.into(),
            })?;
        let slot = self.new_slot(binding, record);
        self.spawn(&slot);
        Ok(self.view_of(&slot))
    }

    /// Creates or replaces the binding `name`.
    pub async fn put(
        &self,
        name: &str,
        input: &BindingInput,
    ) -> Result<(Upsert, BindingView), EngineError> {
        let _admin = self.inner.admin.lock().await;
        let results = self.put_many_locked(&[(Some(name), input)])?;
        let (upsert, slot) = results.into_iter().next().expect("one result per input");
        Ok((upsert, self.view_of(&slot)))
    }

    /// Creates or replaces many bindings in one store transaction; every changed binding resolves
    /// right away, so their changes are applied together. All inputs are validated first: one
    /// bad input changes nothing.
    pub async fn put_many(&self, inputs: &[BindingInput]) -> Result<Vec<BulkItem>, EngineError> {
        let _admin = self.inner.admin.lock().await;
        let mut seen = std::collections::HashSet::new();
        for i in inputs {
            if !seen.insert(i.name.as_str()) {
                return Err(EngineError::invalid(
                    "name",
                    format!("binding {:?} appears twice", i.name),
                ));
            }
        }
        let list: Vec<(Option<&str>, &BindingInput)> = inputs.iter().map(|i| (None, i)).collect();
        let results = self.put_many_locked(&list)?;
        Ok(results
            .into_iter()
            .map(|(u, slot)| BulkItem {
                name: lock(&slot.state).record.name.clone(),
                result: upsert_str(u).to_string(),
            })
            .collect())
    }

    fn put_many_locked(
        &self,
        inputs: &[(Option<&str>, &BindingInput)],
    ) -> Result<Vec<(Upsert, Arc<Slot>)>, EngineError> {
        let mut prepared = Vec::with_capacity(inputs.len());
        for (path_name, input) in inputs {
            let name = path_name.unwrap_or(&input.name);
            let previous = lock(&self.inner.slots)
                .get(name)
                .map(|s| lock(&s.state).record.clone());
            let (binding, record) =
                self.prepare(input, *path_name, previous.as_ref())
                    .map_err(|e| match e {
                        EngineError::Invalid { message, field } if inputs.len() > 1 => {
                            EngineError::Invalid {
                                message: format!("binding {name:?}: {message}"),
                                field,
                            }
                        }
                        e => e,
                    })?;
            prepared.push((binding, record));
        }
        let records: Vec<BindingRecord> = prepared.iter().map(|(_, r)| r.clone()).collect();
        let upserts = lock(&self.inner.store).upsert_bindings(&records)?;
        let mut out = Vec::with_capacity(prepared.len());
        for ((binding, record), upsert) in prepared.into_iter().zip(upserts) {
            let existing = lock(&self.inner.slots).get(&record.name).cloned();
            let slot = match (existing, upsert) {
                (Some(slot), Upsert::Unchanged) => slot,
                (Some(slot), _) => {
                    {
                        let mut st = lock(&slot.state);
                        st.binding = Arc::new(binding);
                        st.record = record;
                    }
                    self.spawn(&slot);
                    slot
                }
                (None, _) => {
                    let slot = self.new_slot(binding, record);
                    self.spawn(&slot);
                    slot
                }
            };
            out.push((upsert, slot));
        }
        Ok(out)
    }

    /// Removes a binding: its file is deleted only if nginx still passes the test without it;
    /// otherwise nothing changes and the error says to remove the include line first.
    pub async fn remove(&self, name: &str) -> Result<RemoveResponse, EngineError> {
        let _admin = self.inner.admin.lock().await;
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let uname = lock(&slot.state).binding.name.clone();
        // Stop refreshing first, so no change of this binding is queued after the removal.
        if let Some(t) = lock(&slot.state).task.take() {
            t.abort();
        }
        let (tx, rx) = oneshot::channel();
        self.inner
            .apply_tx
            .send(ApplyMsg::Remove(uname, tx))
            .map_err(|_| EngineError::ShuttingDown)?;
        let res = rx.await.map_err(|_| EngineError::ShuttingDown)?;
        let file_removed = match res {
            Ok(outcome) => match removed_file(&outcome) {
                Ok(removed) => removed,
                Err(why) => {
                    self.spawn(&slot);
                    return Err(EngineError::Conflict(why));
                }
            },
            Err(e) => {
                self.spawn(&slot);
                return Err(EngineError::Conflict(e));
            }
        };
        lock(&self.inner.store).remove_binding(name)?;
        lock(&self.inner.slots).remove(name);
        Ok(RemoveResponse {
            name: name.to_string(),
            file_removed,
        })
    }

    /// Resolves the binding now and returns the outcome of that resolution.
    pub async fn refresh(&self, name: &str) -> Result<OutcomeRecord, EngineError> {
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let mut rx = slot.seq.subscribe();
        let start = *rx.borrow_and_update();
        // A resolution already running started before this request: wait for the next one.
        let wanted = if lock(&slot.state).running {
            start + 2
        } else {
            start + 1
        };
        slot.wake.notify_one();
        self.wait_seq(name, &slot, rx, wanted).await
    }

    /// Waits for the first outcome of the binding's current task (started by the last save).
    pub async fn wait_first(&self, name: &str) -> Result<OutcomeRecord, EngineError> {
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let rx = slot.seq.subscribe();
        let wanted = lock(&slot.state).spawn_seq + 1;
        self.wait_seq(name, &slot, rx, wanted).await
    }

    async fn wait_seq(
        &self,
        name: &str,
        slot: &Slot,
        mut rx: watch::Receiver<u64>,
        wanted: u64,
    ) -> Result<OutcomeRecord, EngineError> {
        let wait = async {
            while *rx.borrow_and_update() < wanted {
                if rx.changed().await.is_err() {
                    return Err(EngineError::ShuttingDown);
                }
            }
            Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(120), wait).await {
            Ok(Ok(())) => lock(&slot.state)
                .last
                .clone()
                .ok_or(EngineError::ShuttingDown),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::Timeout(name.to_string())),
        }
    }

    /// All bindings, by name.
    pub fn list(&self) -> Vec<BindingView> {
        let mut slots: Vec<(String, Arc<Slot>)> = lock(&self.inner.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        slots.iter().map(|(_, s)| self.view_of(s)).collect()
    }

    /// One binding with its recent history.
    pub fn show(&self, name: &str) -> Result<BindingDetail, EngineError> {
        let slot = lock(&self.inner.slots)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(name.to_string()))?;
        let history =
            lock(&self.inner.store).recent_outcomes(name, self.inner.opts.history_limit)?;
        Ok(BindingDetail {
            binding: self.view_of(&slot),
            history,
        })
    }

    /// The binding's view, if it exists.
    pub fn get(&self, name: &str) -> Option<BindingView> {
        let slot = lock(&self.inner.slots).get(name).cloned()?;
        Some(self.view_of(&slot))
    }

    fn view_of(&self, slot: &Slot) -> BindingView {
        let st = lock(&slot.state);
        let rec = &st.record;
        let decl = self.inner.host.provider(&rec.plugin, &rec.provider);
        let mut config = BTreeMap::new();
        let mut secrets = BTreeMap::new();
        if let Some(decl) = &decl {
            for f in decl.configuration.fields.iter().filter(|f| f.secret) {
                secrets.insert(f.key.clone(), rec.config.contains_key(&f.key));
            }
        }
        for (k, v) in &rec.config {
            // Without the provider's declaration every field is treated as secret.
            let secret = decl
                .as_ref()
                .and_then(|d| d.field(k))
                .is_none_or(|f| f.secret);
            if secret {
                secrets.insert(k.clone(), true);
            } else {
                config.insert(k.clone(), v.clone());
            }
        }
        BindingView {
            name: rec.name.clone(),
            plugin: rec.plugin.clone(),
            provider: rec.provider.clone(),
            service: rec.service.clone(),
            interval_secs: rec.interval_secs,
            directives: rec.directives.clone(),
            config,
            secrets,
            include_line: st.binding.include_line(),
            file: self
                .inner
                .opts
                .conf_dir
                .join("upstreams")
                .join(format!("{}.conf", rec.name))
                .display()
                .to_string(),
            last_outcome: st.last.clone(),
            servers: st.servers.clone(),
            next_refresh_ms: st.next_ms,
            consecutive_failures: st.failures,
        }
    }

    /// Stops every task, lets the apply task finish its batch, flushes outcomes and stops the
    /// plugins.
    pub async fn shutdown(&self) {
        let slots: Vec<Arc<Slot>> = lock(&self.inner.slots).values().cloned().collect();
        for s in slots {
            if let Some(t) = lock(&s.state).task.take() {
                t.abort();
            }
        }
        let (tx, rx) = oneshot::channel();
        if self.inner.apply_tx.send(ApplyMsg::Stop(tx)).is_ok() {
            let _ = rx.await;
        }
        let (tx, rx) = oneshot::channel();
        if self.inner.record_tx.send(RecordMsg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
        self.inner.host.shutdown().await;
    }
}

fn upsert_str(u: Upsert) -> &'static str {
    match u {
        Upsert::Created => "created",
        Upsert::Updated => "updated",
        Upsert::Unchanged => "unchanged",
    }
}

/// `Ok(file_removed)` when the binding may go, `Err(why)` when the file had to stay.
fn removed_file(outcome: &RemoveOutcome) -> Result<bool, String> {
    match outcome {
        RemoveOutcome::Removed => Ok(true),
        RemoveOutcome::NotFound => Ok(false),
        RemoveOutcome::Refused { nginx_error } => Err(format!(
            "nginx -t fails without this upstream's file, so the binding and its file were \
             kept: {}",
            nginx_error.trim()
        )),
        RemoveOutcome::ReloadFailed { error } => Err(format!(
            "nginx reload failed after removing the file, so the binding and its file were \
             kept: {}",
            error.trim()
        )),
    }
}

/// Converts a stored record back into a core binding (no provider declaration check).
pub fn record_to_binding(rec: &BindingRecord) -> Result<Binding, EngineError> {
    record_to_binding_with(rec, None)
}

fn record_to_binding_with(
    rec: &BindingRecord,
    decl: Option<&ProviderDecl>,
) -> Result<Binding, EngineError> {
    let name = UpstreamName::parse(&rec.name)
        .map_err(|e| EngineError::invalid("name", format!("upstream name {:?}: {e}", rec.name)))?;
    let mut directives = Vec::with_capacity(rec.directives.len());
    for d in &rec.directives {
        directives.push(ExtraDirective::parse(d).map_err(|e| {
            EngineError::invalid("directives", format!("extra directive {d:?}: {e}"))
        })?);
    }
    let mut config = ConfigMap::from(rec.config.clone());
    if let Some(decl) = decl {
        tributary_core::coerce_config(&mut config, decl).map_err(binding_error)?;
    }
    let binding = Binding {
        name,
        plugin: rec.plugin.clone(),
        provider: rec.provider.clone(),
        config,
        service: rec.service.clone(),
        interval: Duration::from_secs(rec.interval_secs),
        directives,
    };
    binding.validate().map_err(binding_error)?;
    if let Some(decl) = decl {
        binding.validate_against(decl).map_err(binding_error)?;
    }
    Ok(binding)
}

fn binding_error(e: tributary_core::BindingError) -> EngineError {
    EngineError::Invalid {
        message: e.to_string(),
        field: Some(e.field().to_string()),
    }
}

async fn binding_task(inner: std::sync::Weak<Inner>, slot: Arc<Slot>, binding: Arc<Binding>) {
    let name = binding.name.as_str().to_string();
    let mut delay = Duration::ZERO;
    loop {
        lock(&slot.state).next_ms = Some(now_ms() + delay.as_millis() as i64);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = slot.wake.notified() => {}
        }
        {
            let mut st = lock(&slot.state);
            st.next_ms = None;
            st.running = true;
        }
        let Some(engine) = inner.upgrade() else {
            return;
        };
        let outcome = run_once(&engine, &binding).await;
        let failures = {
            let mut st = lock(&slot.state);
            st.running = false;
            if outcome.status == OutcomeStatus::Failed {
                st.failures = st.failures.saturating_add(1);
            } else {
                st.failures = 0;
                st.servers = outcome.kept.clone();
            }
            st.last = Some(outcome.clone());
            st.failures
        };
        delay = if outcome.status == OutcomeStatus::Failed {
            schedule::failure_backoff(binding.interval, failures)
        } else {
            schedule::next_refresh_delay(binding.interval, outcome.ttl_seconds.unwrap_or(0))
        };
        match outcome.status {
            OutcomeStatus::Failed => tracing::warn!(
                binding = %name,
                why = outcome.why.as_deref().unwrap_or(""),
                "resolution failed; servers kept"
            ),
            OutcomeStatus::Ok => tracing::info!(
                binding = %name,
                servers = outcome.kept.len(),
                reloaded = outcome.reloaded,
                "upstream updated"
            ),
            OutcomeStatus::Unchanged => {
                tracing::debug!(binding = %name, "unchanged")
            }
        }
        let _ = engine.events.send(EngineEvent::Outcome {
            binding: name.clone(),
            outcome: outcome.clone(),
        });
        let _ = engine
            .record_tx
            .send(RecordMsg::Outcome(name.clone(), outcome));
        drop(engine);
        slot.seq.send_modify(|s| *s += 1);
    }
}

/// One resolution: plugin call → validate → render → apply. Never fails: the outcome says how it
/// went.
async fn run_once(inner: &Inner, binding: &Binding) -> OutcomeRecord {
    let t0 = Instant::now();
    let mut rec = OutcomeRecord {
        at_ms: now_ms(),
        duration_ms: 0,
        status: OutcomeStatus::Failed,
        why: None,
        code: None,
        field: None,
        kept: Vec::new(),
        dropped: Vec::new(),
        ttl_seconds: None,
        changed: false,
        reloaded: false,
        nginx_error: None,
    };
    let params = ResolveParams {
        provider: binding.provider.clone(),
        config: binding.config.clone(),
        service: binding.service.clone(),
    };
    match inner.host.resolve(&binding.plugin, params).await {
        Err(e) => {
            rec.why = Some(format!(
                "plugin {:?}: {e}; the current servers were kept",
                binding.plugin
            ));
            rec.code = e.code();
            rec.field = e.field().map(str::to_string);
        }
        Ok(answer) => {
            let r = Resolved::new(&binding.name, &binding.directives, &answer);
            rec.ttl_seconds = Some(r.ttl_seconds);
            rec.kept = r.kept_with_tags(&answer);
            rec.dropped = r.dropped_records();
            if let Some(text) = &r.rendered {
                let (tx, rx) = oneshot::channel();
                let change = Change {
                    name: binding.name.clone(),
                    bytes: text.clone().into_bytes(),
                };
                let result = match inner.apply_tx.send(ApplyMsg::Change(change, tx)) {
                    Ok(()) => rx.await.ok(),
                    Err(_) => None,
                };
                match result {
                    Some(ChangeOutcome::Unchanged) => rec.status = OutcomeStatus::Unchanged,
                    Some(ChangeOutcome::Applied { reloaded }) => {
                        rec.status = OutcomeStatus::Ok;
                        rec.changed = true;
                        rec.reloaded = reloaded;
                    }
                    Some(ChangeOutcome::TestFailed { nginx_error }) => {
                        rec.why = Some(
                            "nginx -t failed with the new file; the previous file was restored"
                                .to_string(),
                        );
                        rec.nginx_error = Some(nginx_error);
                    }
                    Some(ChangeOutcome::ReloadFailed { error }) => {
                        rec.why =
                            Some("nginx reload failed; the previous file was restored".to_string());
                        rec.nginx_error = Some(error);
                    }
                    Some(ChangeOutcome::WriteFailed { error }) => {
                        rec.why = Some(format!(
                            "the file could not be written ({error}); nothing changed"
                        ));
                    }
                    None => rec.why = Some("the daemon is stopping; nothing applied".to_string()),
                }
                if rec.status != OutcomeStatus::Failed {
                    rec.why = r.dropped_note();
                }
            } else {
                rec.why = r
                    .no_target_reason()
                    .map(|reason| format!("{reason}; the current file was kept"));
            }
        }
    }
    rec.duration_ms = t0.elapsed().as_millis() as u64;
    rec
}

async fn apply_task(
    applier: Applier,
    mut rx: mpsc::UnboundedReceiver<ApplyMsg>,
    inner: std::sync::Weak<Inner>,
    quiet: Duration,
    max: Duration,
) {
    let mut applier = Some(applier);
    while let Some(first) = rx.recv().await {
        let mut msgs = vec![first];
        if matches!(msgs[0], ApplyMsg::Change(..)) {
            // Collect what becomes ready close together into one batch.
            let hard = tokio::time::Instant::now() + max;
            loop {
                let until = (tokio::time::Instant::now() + quiet).min(hard);
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(m)) => {
                        let stop = matches!(m, ApplyMsg::Stop(_));
                        msgs.push(m);
                        if stop {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                }
                if tokio::time::Instant::now() >= hard {
                    break;
                }
            }
        }
        let mut changes: Vec<Change> = Vec::new();
        let mut change_replies: Vec<Vec<oneshot::Sender<ChangeOutcome>>> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut removes = Vec::new();
        let mut stops = Vec::new();
        for m in msgs {
            match m {
                ApplyMsg::Change(c, reply) => match index.get(c.name.as_str()) {
                    // The same binding twice in one batch: the newer bytes win; both callers
                    // get the outcome of the newer one.
                    Some(&i) => {
                        changes[i] = c;
                        change_replies[i].push(reply);
                    }
                    None => {
                        index.insert(c.name.as_str().to_string(), changes.len());
                        changes.push(c);
                        change_replies.push(vec![reply]);
                    }
                },
                ApplyMsg::Remove(n, reply) => removes.push((n, reply)),
                ApplyMsg::Stop(reply) => stops.push(reply),
            }
        }
        let Some(mut a) = applier.take() else {
            break;
        };
        if !changes.is_empty() {
            if let Some(i) = inner.upgrade() {
                i.batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let n = changes.len();
        let names: Vec<UpstreamName> = removes.iter().map(|(n, _)| n.clone()).collect();
        let joined = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let outcomes = if changes.is_empty() {
                Vec::new()
            } else {
                a.apply_batch(&changes)
            };
            if !changes.is_empty() {
                let changed = outcomes
                    .iter()
                    .filter(|(_, o)| !matches!(o, ChangeOutcome::Unchanged))
                    .count();
                let took_ms = started.elapsed().as_millis() as u64;
                if changed > 0 {
                    tracing::info!(changes = n, changed, took_ms, "batch applied");
                } else {
                    tracing::debug!(changes = n, took_ms, "batch unchanged");
                }
            }
            let removed: Vec<Result<RemoveOutcome, String>> = names
                .iter()
                .map(|n| a.remove(n).map_err(|e| e.to_string()))
                .collect();
            (a, outcomes, removed)
        })
        .await;
        match joined {
            Ok((a, outcomes, removed)) => {
                applier = Some(a);
                if let (Some(i), false) = (inner.upgrade(), outcomes.is_empty()) {
                    let _ = i.events.send(EngineEvent::Batch {
                        changes: outcomes.len(),
                        reloaded: outcomes
                            .iter()
                            .any(|(_, o)| matches!(o, ChangeOutcome::Applied { reloaded: true })),
                        test_failures: outcomes
                            .iter()
                            .filter(|(_, o)| matches!(o, ChangeOutcome::TestFailed { .. }))
                            .count(),
                        at_ms: now_ms(),
                    });
                }
                let by_name: HashMap<String, ChangeOutcome> = outcomes
                    .into_iter()
                    .map(|(n, o)| (n.as_str().to_string(), o))
                    .collect();
                for (name, replies) in index
                    .iter()
                    .map(|(n, i)| (n, std::mem::take(&mut change_replies[*i])))
                {
                    let outcome =
                        by_name
                            .get(name)
                            .cloned()
                            .unwrap_or_else(|| ChangeOutcome::ReloadFailed {
                                error: "the applier returned no outcome for this upstream".into(),
                            });
                    for r in replies {
                        let _ = r.send(outcome.clone());
                    }
                }
                for ((_, reply), res) in removes.into_iter().zip(removed) {
                    let _ = reply.send(res);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "the apply thread panicked; no more changes are applied");
                break;
            }
        }
        if !stops.is_empty() {
            for s in stops {
                let _ = s.send(());
            }
            break;
        }
    }
}

async fn record_task(store: Arc<Mutex<Store>>, mut rx: mpsc::UnboundedReceiver<RecordMsg>) {
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                RecordMsg::Outcome(n, o) => batch.push((n, o)),
                RecordMsg::Flush(tx) => flushes.push(tx),
            }
            if batch.len() < 2000 {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            let store = store.clone();
            let res =
                tokio::task::spawn_blocking(move || lock(&store).record_outcomes(&batch)).await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "recording outcomes failed"),
                Err(e) => tracing::error!(error = %e, "recording outcomes panicked"),
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }
}
