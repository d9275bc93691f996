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
//! - The store is an `Arc<dyn BindingStore>` (SQLite or etcd): reads are local, writes are awaited.
//!   The engine does not know which one it has: before each scheduled resolution it asks
//!   `claim_resolver`; the host that gets `true` resolves and publishes the validated set, the
//!   others apply the published set (`fleet`). A store task follows the store's events (bindings
//!   changed on other hosts, new target sets, resolver claims to take).
//!
//! Files: this one holds the handle ([`Engine`]), its options, errors and events; `admin` the
//! requests of people (save, remove, refresh, views), `prepare` the validation of an input into a
//! binding, `refresh` the per-binding task, `batch` the pure batching rules, `apply` the apply
//! task, `fleet` the store events and the fleet side of a resolution (follow a published set,
//! publish this host's outcome), `live` the choice between the live API and a reload for each change, and
//! `record` the recorder task.
//!
//! Batching: the changes ready within a short window (100 ms quiet, 1 s max; 2 ms / 10 ms while every
//! change of the batch looks live-eligible, as there is no reload to share; the rules are the pure
//! functions of `batch`) go to one `Applier::apply_batch`; `record_change` turns the applier's answer
//! into the outcome's status and `Failure` kind. `live` goes through `Applier::apply_live_batch` with
//! a push (`ApiPush`) that PUTs the set guarded by the generation of the API's list (asked as the
//! batch starts, then by each `PUT` answer's and read-back's), takes it back with the previous file's
//! set (from `live_plan`), logs per change where the time from decision to visible went, and records
//! the path taken and why; the client is hyper's, for the `upstreams_api` on a unix socket or
//! loopback port (`crate::live_api`). `drain` is graceful removal. `step_out` is how a host that
//! keeps failing to resolve a binding steps out of resolving it. [`Engine::dead_tasks`] feeds the
//! health check (503 when the apply or record task ended). The fleet side (`fleet`) is described in
//! `docs/fleet-engine.md`.

mod admin;
mod apply;
mod batch;
mod drain;
mod fleet;
mod fleet_admin;
mod fleet_outage;
mod live;
mod prepare;
mod record;
pub mod refresh;
mod resolve;
mod step_out;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::AbortHandle;
use tributary_apply::Applier;
use tributary_core::{Binding, FieldError};
use tributary_plugin_host::PluginHost;
use tributary_store::{BindingRecord, BindingStore, OutcomeRecord, OutcomeStatus};

use apply::ApplyMsg;
use batch::BatchRules;
pub use live::{ApplyMode, LiveOptions, LiveTest};
pub use prepare::record_to_binding;
use record::RecordMsg;

/// Engine tuning.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The nginx conf dir (for showing file paths).
    pub conf_dir: PathBuf,
    /// A batch closes when no new change arrived for this long...
    pub batch_quiet: Duration,
    /// ...or this long after its first change, whichever comes first.
    pub batch_max: Duration,
    /// `batch_quiet` of a batch whose changes can all go live (no reload to share).
    pub batch_live_quiet: Duration,
    /// `batch_max` of such a batch (never more than `batch_max`).
    pub batch_live_max: Duration,
    /// Outcomes returned by [`Engine::show`].
    pub history_limit: usize,
    /// Refresh jitter in percent (0–50; default [`refresh::DEFAULT_JITTER_PCT`]): see
    /// [`refresh::jittered`]. 0: every delay exactly as scheduled.
    pub refresh_jitter_pct: u8,
    /// `--apply` and `--live-api`.
    pub live: LiveOptions,
    /// `--resolve-during-store-outage`: while the store is unreachable, resolve and apply locally
    /// ([`fleet_outage`]).
    pub resolve_during_outage: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            conf_dir: PathBuf::new(),
            batch_quiet: Duration::from_millis(100),
            batch_max: Duration::from_secs(1),
            batch_live_quiet: Duration::from_millis(2),
            batch_live_max: Duration::from_millis(10),
            history_limit: 20,
            refresh_jitter_pct: refresh::DEFAULT_JITTER_PCT,
            live: LiveOptions::default(),
            resolve_during_outage: false,
        }
    }
}

/// Errors of engine operations. None carries a config value.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad input: every invalid field (at least one), ordered by field; the text joins their
    /// messages.
    #[error("{}", join_messages(.0))]
    Invalid(Vec<FieldError>),
    #[error("no binding named {0:?}")]
    NotFound(String),
    /// No such host in the fleet (`forget-host`): the store's message.
    #[error("{0}")]
    NoHost(String),
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
    /// Bad input in one field.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> EngineError {
        EngineError::Invalid(vec![FieldError::new(field, message)])
    }
}

fn join_messages(errors: &[FieldError]) -> String {
    let texts: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    texts.join("; ")
}

pub(crate) use tributary_store::{lock, now_ms};

pub(crate) struct SlotState {
    pub(crate) binding: Arc<Binding>,
    pub(crate) record: BindingRecord,
    pub(crate) task: Option<AbortHandle>,
    pub(crate) last: Option<OutcomeRecord>,
    pub(crate) servers: Vec<Value>,
    pub(crate) next_ms: Option<i64>,
    pub(crate) failures: u32,
    pub(crate) running: bool,
    /// `seq` when the current task was spawned: its first outcome is the one after it.
    pub(crate) spawn_seq: u64,
    /// The stored binding's `updated_at_ms`: a published target set is applied only when it was
    /// resolved from this version of the binding.
    pub(crate) updated_at_ms: i64,
    /// Generation of the newest published target set this host applied or attempted (0: none).
    pub(crate) applied_generation: i64,
    /// When this host's last successful resolution of the binding through its plugin started
    /// (it held the claim; ms since the epoch): the fleet's set age (`docs/fleet.md`).
    pub(crate) resolved_ok_ms: Option<i64>,
    /// The last run could not reach the store (nothing was resolved or applied): it runs again
    /// when the store answers.
    pub(crate) store_down: bool,
    /// This host's resolutions of the binding that failed in a row (plugin error, no answer, no
    /// valid target): at [`step_out::STEP_OUT_AFTER`] it steps out of resolving it.
    pub(crate) resolve_failures: u32,
    /// It stepped out (`BindingStore::step_out`) until then; it steps back in at its first run
    /// after it.
    pub(crate) stepped_out_until: Option<std::time::Instant>,
    /// Graceful removal: the servers drained before they are removed.
    pub(crate) draining: drain::Draining,
}

pub(crate) struct Slot {
    /// A person asked for a refresh.
    pub(crate) wake: Notify,
    /// The store says the resolver claim is free: claim now.
    pub(crate) claim: Notify,
    /// Another host published a target set: apply it.
    pub(crate) follow: Notify,
    /// Bumped after every finished resolution.
    pub(crate) seq: watch::Sender<u64>,
    pub(crate) state: Mutex<SlotState>,
}

pub(crate) struct Inner {
    pub(crate) host: Arc<PluginHost>,
    /// The store (SQLite or etcd: the engine does not know which; see `BindingStore`).
    pub(crate) store: Arc<dyn BindingStore>,
    /// The applier's `<conf dir>/upstreams` (to find files of bindings no longer stored).
    pub(crate) upstreams_dir: PathBuf,
    pub(crate) apply_tx: mpsc::UnboundedSender<ApplyMsg>,
    pub(crate) record_tx: mpsc::UnboundedSender<RecordMsg>,
    pub(crate) slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Serialises saves and removals (store write + task restart).
    pub(crate) admin: tokio::sync::Mutex<()>,
    pub(crate) opts: EngineOptions,
    /// Batches handed to the applier (for the benchmark and the health endpoint).
    pub(crate) batches: std::sync::atomic::AtomicU64,
    /// Outcomes and apply batches, for observers (metrics, UI); nobody listening is fine.
    pub(crate) events: tokio::sync::broadcast::Sender<EngineEvent>,
    /// The long-lived tasks by name (`apply`, `record`), for the health check.
    pub(crate) tasks: Mutex<Vec<(&'static str, AbortHandle)>>,
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
    pub(crate) inner: Arc<Inner>,
}

impl Engine {
    /// Starts the engine on the bindings in `store`: every binding resolves once right away (so
    /// a restart brings stale files up to date in one batch), then on its schedule.
    pub fn start(
        store: Arc<dyn BindingStore>,
        host: Arc<PluginHost>,
        applier: Applier,
        opts: EngineOptions,
    ) -> Result<Engine, EngineError> {
        // Subscribed before the bindings are read: a change made elsewhere in between is an event
        // (events are level-triggered: one about a binding already read is harmless).
        let events = store.subscribe();
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
            seeds.push((binding, rec, sb.updated_at_ms, last, servers));
        }

        let (apply_tx, apply_rx) = mpsc::unbounded_channel();
        let (record_tx, record_rx) = mpsc::unbounded_channel();
        let upstreams_dir = applier.upstreams_dir().to_path_buf();
        let inner = Arc::new(Inner {
            host,
            upstreams_dir,
            store: store.clone(),
            apply_tx,
            record_tx,
            slots: Mutex::new(HashMap::new()),
            admin: tokio::sync::Mutex::new(()),
            opts,
            batches: Default::default(),
            events: tokio::sync::broadcast::channel(4096).0,
            tasks: Mutex::new(Vec::new()),
        });
        let apply = tokio::spawn(apply::apply_task(
            applier,
            apply_rx,
            Arc::downgrade(&inner),
            BatchRules {
                quiet: inner.opts.batch_quiet,
                max: inner.opts.batch_max,
                live_quiet: inner.opts.batch_live_quiet,
                live_max: inner.opts.batch_live_max,
            },
            inner.opts.live.clone(),
        ));
        // Files of bindings the store no longer has (removed while this host was down) are
        // removed first thing, once the store's list can be trusted; otherwise at the store's
        // first `Resync`.
        let sweep = store.status().connected;
        let record = tokio::spawn(record::record_task(store, record_rx));
        let follow = tokio::spawn(fleet::store_task(Arc::downgrade(&inner), events, sweep));
        *lock(&inner.tasks) = vec![
            ("apply", apply.abort_handle()),
            ("record", record.abort_handle()),
            ("store", follow.abort_handle()),
        ];

        let engine = Engine { inner };
        for (binding, rec, updated_at_ms, last, servers) in seeds {
            let slot = engine.new_slot(binding, rec, updated_at_ms);
            {
                let mut st = lock(&slot.state);
                st.last = last;
                st.servers = servers;
            }
            engine.spawn(&slot);
        }
        Ok(engine)
    }

    pub(crate) fn new_slot(
        &self,
        binding: Binding,
        record: BindingRecord,
        updated_at_ms: i64,
    ) -> Arc<Slot> {
        let name = record.name.clone();
        let slot = Arc::new(Slot {
            wake: Notify::new(),
            claim: Notify::new(),
            follow: Notify::new(),
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
                updated_at_ms,
                applied_generation: 0,
                resolved_ok_ms: None,
                store_down: false,
                resolve_failures: 0,
                stepped_out_until: None,
                draining: drain::Draining::default(),
            }),
        });
        lock(&self.inner.slots).insert(name, slot.clone());
        slot
    }

    /// (Re)starts the slot's task; it resolves right away.
    pub(crate) fn spawn(&self, slot: &Arc<Slot>) {
        let mut st = lock(&slot.state);
        if let Some(t) = st.task.take() {
            t.abort();
        }
        st.running = false;
        st.failures = 0;
        st.resolve_failures = 0;
        st.spawn_seq = *slot.seq.borrow();
        let handle = tokio::spawn(refresh::binding_task(
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

    /// The store the engine runs on.
    pub fn store(&self) -> &Arc<dyn BindingStore> {
        &self.inner.store
    }

    /// The plugin host.
    pub fn host(&self) -> &Arc<PluginHost> {
        &self.inner.host
    }

    /// `--apply` and `--live-api`: how files are written ([`LiveOptions::file_text`]).
    pub fn live_options(&self) -> &LiveOptions {
        &self.inner.opts.live
    }

    /// The long-lived tasks that have ended (`apply`: no change reaches nginx any more;
    /// `record`: no outcome is stored any more). Empty while the engine is healthy.
    pub fn dead_tasks(&self) -> Vec<&'static str> {
        lock(&self.inner.tasks)
            .iter()
            .filter(|(_, h)| h.is_finished())
            .map(|(n, _)| *n)
            .collect()
    }

    /// Test hook: ends the long-lived task `name` as a crash would. Compiled into test builds
    /// of this crate only.
    #[cfg(test)]
    pub(crate) fn kill_task_for_test(&self, name: &str) {
        for (n, h) in lock(&self.inner.tasks).iter() {
            if *n == name {
                h.abort();
            }
        }
    }

    /// Stops every task, lets the apply task finish its batch, flushes outcomes and stops the
    /// plugins.
    pub async fn shutdown(&self) {
        for (n, h) in lock(&self.inner.tasks).iter() {
            if *n == "store" {
                h.abort();
            }
        }
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
        self.flush_records().await;
        self.inner.host.shutdown().await;
        // Fleet: other hosts take this host's bindings over now rather than after the lease TTL.
        self.inner.store.close().await;
    }

    /// Returns once every outcome sent to the recorder before this call is written to the store.
    pub(crate) async fn flush_records(&self) {
        let (tx, rx) = oneshot::channel();
        if self.inner.record_tx.send(RecordMsg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}
