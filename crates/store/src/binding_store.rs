//! The one store interface the engine holds ([`BindingStore`]) and the fleet types it speaks in.
//!
//! # Contract (both implementations keep it)
//!
//! **Reads never touch the network.** `list_bindings`, `get_binding`, `recent_outcomes`,
//! `last_outcomes`, `published_targets`, `fleet_view` and `status` answer from this host: the
//! SQLite file (a short local disk read, as the single-host daemon always did) or the etcd store's
//! local mirror, which a watch keeps up to date. They answer also while etcd is unreachable (then
//! with the last state seen, and `status()` says since when).
//!
//! **Writes are async and bounded.** `insert_binding`, `upsert_bindings`, `remove_binding`,
//! `claim_resolver` and `publish_targets` either finish or fail within the store's operation
//! timeout (etcd: `EtcdOptions::op_timeout`, default 5 s; SQLite: on a blocking thread, never on a
//! tokio worker). When the store cannot be reached they fail at once with
//! [`StoreError::Unavailable`], which names the store; nothing is half-written. etcd: a write
//! whose member does not answer (it died) is sent to the next member within that bound, and is
//! applied at most once; only every member failing makes it `Unavailable`. A write that
//! returned `Ok` is visible to the reads of the same instance right away (read your writes).
//!
//! **Local history.** `record_outcomes` writes this host's outcome history, which stays on this
//! host (etcd keeps only each host's *current* state per binding, see `publish_host_outcome`).
//!
//! **Events are about others.** [`BindingStore::subscribe`] delivers [`StoreEvent`]s for changes
//! made through *another* store instance (another host's daemon) and for fleet state; a change
//! made through this instance is not echoed, except when etcd's watch delivers it before the
//! write's own answer (a spurious event, harmless). Events are level-triggered: they name what to
//! re-read, never carry the state, so a late or repeated event cannot roll anything back. A
//! receiver that lags (`RecvError::Lagged`) treats it as [`StoreEvent::Resync`]: re-read all.
//! The SQLite store emits no binding, target or fleet events (there is no one else).
//!
//! **Fleet hooks** are called the same way for both stores, so the engine does not know which
//! store it has:
//! - `claim_resolver(name)` before resolving: `true` means this host resolves the binding now
//!   (SQLite: always). Call it before every scheduled resolution; a host that gets `false` applies
//!   the target sets other hosts publish instead.
//! - `publish_targets(name, set)` after a resolution that validated: the set every host renders.
//! - `published_targets(name)` + [`StoreEvent::Targets`]: the newest set, for every host.
//! - `publish_host_outcome(name, outcome)` after each apply: this host's state for the fleet view.
//! - `fleet_view(name)`: every host's state for the binding (SQLite: this host only).
//!
//! **The store never empties an upstream.** Nothing here deletes a binding except
//! `remove_binding` (or another host's removal, delivered as an event). Losing etcd, or starting
//! while it is down, leaves the mirror as it was.

use std::collections::HashMap;
use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::{BindingRecord, DroppedRecord, OutcomeRecord, StoreError, StoredBinding, Upsert};

/// Something changed that the engine may want to re-read. See the module docs: level-triggered,
/// only for changes made elsewhere (and fleet state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// Binding `name` was created, changed or removed through another store instance: re-read it
    /// with [`BindingStore::get_binding`] (`None`: it was removed). Also said of the bindings a
    /// failed save of many did save (its earlier transactions, on every host) through this one.
    Binding(String),
    /// Another host published a new target set for `name`: read
    /// [`BindingStore::published_targets`].
    Targets(String),
    /// The resolver claim of `name` changed: taken (also by this host: the etcd store reports
    /// every change of the claim key), released, or its holder's lease expired because the holder
    /// died. When no host holds it, hosts that schedule this binding should call
    /// [`BindingStore::claim_resolver`] now rather than at their next interval; while a host
    /// holds it the event is no reason to resolve again (the engine only applies newer sets).
    Resolver(String),
    /// A host's published outcome for `name` changed: the fleet view changed.
    Fleet(String),
    /// The connection state changed: read [`BindingStore::status`].
    Status,
    /// The local mirror was rebuilt (after a reconnection or a lost watch): anything may have
    /// changed. Re-read every binding (`list_bindings`) and every published target set.
    Resync,
}

/// The validated targets of one resolution, as the resolving host publishes them for the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetSet {
    /// The host that resolved it (filled by the store on publish: its host id).
    #[serde(default)]
    pub resolved_by: String,
    /// When the resolution started, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// `updated_at_ms` of the binding the resolver resolved: a host whose binding is newer
    /// ignores the set (it was resolved with the previous config) and waits for the next one.
    pub binding_updated_at_ms: i64,
    /// Kept targets after `tributary-core`'s validation, in canonical order (`address`, `port`,
    /// `weight`, and display tags that never reach a file).
    pub targets: Vec<serde_json::Value>,
    /// Dropped targets with reasons (the daemon bounds the list).
    #[serde(default)]
    pub dropped: Vec<DroppedRecord>,
    /// The smallest TTL the registry gave, if any.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// Set by the store when read (etcd: the key's mod revision; SQLite: a counter), growing with
    /// each publish of the binding; ignored on publish. Host outcomes name the generation they
    /// applied, so a host behind the newest set shows as stale.
    #[serde(skip)]
    pub generation: i64,
}

/// One host's state for one binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    /// The newest target set it knows is live in its nginx.
    Applied,
    /// Its nginx refused the change (`message` says why, in nginx's words); it serves the
    /// previous servers.
    Failed,
    /// It serves an older set than the newest published one (e.g. it cannot reach the store).
    Stale,
}

impl HostState {
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Applied => "applied",
            HostState::Failed => "failed",
            HostState::Stale => "stale",
        }
    }
}

/// What one host publishes about one binding after applying (or failing to apply) a target set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostOutcome {
    /// The host (filled by the store on publish: its host id).
    #[serde(default)]
    pub host: String,
    pub state: HostState,
    /// When this state was reached, milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// [`TargetSet::generation`] of the set applied or attempted (0: none yet).
    pub generation: i64,
    /// Servers this host serves for the binding now.
    pub servers: usize,
    /// Why, when failed or stale (nginx's message for a refused change). Never a config value.
    #[serde(default)]
    pub message: Option<String>,
}

/// One host in the fleet view of a binding.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetHost {
    pub outcome: HostOutcome,
    /// The host's heartbeat is live (SQLite: always `true`). A host that stopped or lost the
    /// store keeps its last published outcome, shown with `alive: false`.
    pub alive: bool,
}

/// Every host's state for one binding.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetView {
    /// The host that holds the resolver claim now, if any.
    pub resolver: Option<String>,
    /// The newest published set's generation (0: none).
    pub generation: i64,
    /// By host id.
    pub hosts: Vec<FleetHost>,
}

/// One host the store knows of in the fleet ([`BindingStore::fleet_hosts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetMember {
    pub host: String,
    /// Its heartbeat is live (SQLite: always `true`, this host).
    pub alive: bool,
}

/// What [`BindingStore::forget_host`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ForgotHost {
    /// Outcome keys (one per binding the host had a state of) and `unable` markers deleted.
    pub keys: usize,
    /// `force` ended the host's live session (its lease revoked: heartbeat, resolver claims and
    /// markers gone with it).
    pub session_ended: bool,
}

/// The store's connection state, for the API, the UI and the metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreStatus {
    /// `sqlite` or `etcd`.
    pub kind: &'static str,
    /// This host's id in the fleet (SQLite: the host name too).
    pub host_id: String,
    /// The store answers now (SQLite: always).
    pub connected: bool,
    /// Since when it does not answer, milliseconds since the Unix epoch.
    pub unreachable_since_ms: Option<i64>,
    /// The last connection error, if not connected (never a secret).
    pub last_error: Option<String>,
    /// Where it is: the SQLite path, or the etcd endpoints and prefix.
    pub location: String,
    /// Values from the store this host refused since it started (etcd: a MAC that failed, or
    /// none where the fleet requires one; docs/fleet.md "Integrity"). SQLite: 0.
    pub refused_values: u64,
    /// The fleet requires a MAC on every value (etcd; SQLite: `false`, nothing is shared).
    pub integrity_required: bool,
}

/// The store the engine holds (as `Arc<dyn BindingStore>`). See the module docs for the contract.
#[async_trait]
pub trait BindingStore: Send + Sync + fmt::Debug {
    /// Connection state (never blocks).
    fn status(&self) -> StoreStatus;

    /// This host's id in the fleet.
    fn host_id(&self) -> &str;

    // --- bindings ------------------------------------------------------------------------------

    /// All bindings, ordered by name (local read).
    fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError>;

    /// One binding by name (local read).
    fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError>;

    /// Adds a new binding; [`StoreError::Duplicate`] if the name is taken (on any host).
    async fn insert_binding(&self, b: &BindingRecord) -> Result<(), StoreError>;

    /// Inserts or updates bindings; returns what happened to each, in order. SQLite: one
    /// transaction. etcd: one transaction per 100 bindings (etcd's default limit is 128
    /// operations per transaction), each all-or-nothing, guarded against a concurrent change of
    /// the same bindings on another host ([`StoreError::Conflict`]). Each record replaces
    /// whatever is stored; see [`BindingStore::upsert_bindings_from`].
    async fn upsert_bindings(&self, list: &[BindingRecord]) -> Result<Vec<Upsert>, StoreError> {
        let based: Vec<(BindingRecord, Option<BindingRecord>)> =
            list.iter().map(|b| (b.clone(), None)).collect();
        self.upsert_bindings_from(&based).await
    }

    /// [`BindingStore::upsert_bindings`], each record with the stored record it was prepared
    /// from (`Some`: secret fields left out were carried over from it): written only while the
    /// store still holds that record, else [`StoreError::Conflict`] and nothing of its chunk is
    /// written. A change prepared from a copy that lags (another host changed the binding after
    /// this one read it) never overwrites the newer change. `None`: replaces whatever is stored.
    async fn upsert_bindings_from(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
    ) -> Result<Vec<Upsert>, StoreError>;

    /// Removes a binding with its outcomes and fleet state; `false` when there was none.
    async fn remove_binding(&self, name: &str) -> Result<bool, StoreError>;

    // --- this host's outcome history -----------------------------------------------------------

    /// Records outcomes (this host's history; trimmed to the store's history length per binding).
    /// Outcomes of bindings that no longer exist are ignored.
    async fn record_outcomes(&self, list: &[(String, OutcomeRecord)]) -> Result<(), StoreError>;

    /// The newest outcomes of one binding on this host, newest first, at most `limit`.
    fn recent_outcomes(&self, name: &str, limit: usize) -> Result<Vec<OutcomeRecord>, StoreError>;

    /// The newest outcome on this host of every binding that has one.
    fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError>;

    // --- events --------------------------------------------------------------------------------

    /// Changes made elsewhere and fleet state, from now on (see [`StoreEvent`]).
    fn subscribe(&self) -> broadcast::Receiver<StoreEvent>;

    // --- fleet ---------------------------------------------------------------------------------

    /// Whether this host is to resolve `name` now. SQLite: always `true`. etcd: `true` when this
    /// host holds (or has just taken) the binding's resolver lease; the claims are spread over the
    /// live hosts, and a holder that dies loses its claims when its lease expires (the TTL).
    /// Errors (store unreachable) mean: do not resolve, keep the servers.
    async fn claim_resolver(&self, name: &str) -> Result<bool, StoreError>;

    /// Publishes the validated target set of a resolution of `name` by this host, for every host
    /// to render and apply. A set equal to the published one (targets, dropped, ttl) is not
    /// written again. etcd: refused ([`StoreError::Conflict`]) unless this host still holds the
    /// claim under its current lease and the binding is still the version the set was resolved
    /// from (`binding_updated_at_ms`, and in etcd the revision this host decoded).
    async fn publish_targets(&self, name: &str, set: &TargetSet) -> Result<(), StoreError>;

    /// This host stops resolving `name` for now (its resolutions keep failing here): it gives
    /// its claim up and the other hosts leave it out of the binding's resolver choice, until
    /// [`BindingStore::step_in`] or the end of its session (etcd: a marker under its session
    /// lease, with `why`). It keeps applying the sets others publish. SQLite: nothing (the only
    /// host keeps resolving).
    async fn step_out(&self, _name: &str, _why: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// Undoes [`BindingStore::step_out`]: this host is a candidate for `name` again.
    async fn step_in(&self, _name: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// The newest published target set of `name` (local read), this host's own included.
    fn published_targets(&self, name: &str) -> Option<TargetSet>;

    /// Publishes this host's state for `name`. Never fails for an unreachable store: the newest
    /// state per binding is kept and written when the store answers again. A state equal to the
    /// published one but for `at_ms` is not written again.
    async fn publish_host_outcome(
        &self,
        name: &str,
        outcome: &HostOutcome,
    ) -> Result<(), StoreError>;

    /// Every host's state for `name` (local read). SQLite: this host only.
    fn fleet_view(&self, name: &str) -> FleetView;

    /// Reads the fleet's host outcomes from the store now (of binding `name`, or of every
    /// binding), for the next `fleet_view` and `fleet_hosts` (etcd: a host does not watch the
    /// others' outcomes, so its copy of them is as fresh as its last read; reads of every binding
    /// are at most one a second, concurrent callers share one; errors keep the last copy).
    /// Called where people ask: the API, the UI, the metrics. SQLite: nothing (this host only).
    async fn refresh_fleet(&self, _name: Option<&str>) {}

    /// Every host the store knows of (local read): the live ones (heartbeat) and those that left
    /// an outcome, by host id. SQLite: this host alone.
    fn fleet_hosts(&self) -> Vec<FleetMember> {
        vec![FleetMember {
            host: self.host_id().to_string(),
            alive: true,
        }]
    }

    /// Removes what host `host`, gone, left in the store: its outcome of every binding, its
    /// `unable` markers and its writes' markers (`docs/fleet.md`, "A host that is gone").
    /// Refused with [`StoreError::HostAlive`] while its heartbeat is live (this host included),
    /// unless `force`: then its session lease is revoked first (its heartbeat and resolver
    /// claims go at once; a daemon that is in fact running takes a new session and comes back).
    /// [`StoreError::NoSuchHost`] when nothing of it is stored. Nothing is deleted on an error.
    /// SQLite: [`StoreError::NoFleet`].
    async fn forget_host(&self, _host: &str, _force: bool) -> Result<ForgotHost, StoreError> {
        Err(StoreError::NoFleet(self.status().kind))
    }

    /// A graceful stop: ends the connection and gives up this host's claims at once, so other
    /// hosts take its bindings over without waiting for the lease TTL (bounded by the operation
    /// timeout). Reads keep answering from the mirror; writes fail afterwards. SQLite: nothing.
    async fn close(&self) {}
}
