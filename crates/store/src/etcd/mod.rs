//! The fleet store: bindings and fleet state in etcd under a prefix, served from a local mirror.
//!
//! - `EtcdStore::open` opens the local mirror (a [`SqliteFile`] in the data dir: bindings as last
//!   seen, and this host's outcome history) and starts the session task (`session.rs`), which
//!   connects, copies the prefix into the mirror, keeps this host's lease and heartbeat alive and
//!   follows a watch of the prefix. When etcd cannot be reached the mirror stays as it was and
//!   the task retries; on return it re-reads the prefix (events for what changed) and writes the
//!   host outcomes published meanwhile.
//! - Reads answer from the mirror; writes are etcd transactions bounded by
//!   [`EtcdOptions::op_timeout`], applied to the mirror as soon as etcd confirmed them (their
//!   revision is recorded, so the watch's echo of the same write is recognised and not reported).
//!   A write whose member does not answer goes to the next member within that bound, and is
//!   applied at most once (`write.rs`).
//! - Key layout under the prefix, values and the resolver protocol: `docs/fleet.md` and
//!   [`keys`].
//! - Every binding's config map is sealed as one ciphertext ([`SecretKeys`]); nothing else in a
//!   binding is secret.

mod auth;
mod bindings;
mod claims;
mod crypto;
mod fleet_read;
mod gc;
mod integrity;
pub mod keys;
mod lease;
mod mirror;
mod options;
mod outcomes;
mod own_keys;
mod refusal;
mod reseal;
mod session;
mod sync;
mod value;
mod write;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::Client;
use tokio::sync::broadcast;

pub use crypto::{SecretKeys, KEY_LEN};
use mirror::{Mirror, Update};
pub use options::*;
use outcomes::bounded_message;
pub use outcomes::MAX_OUTCOME_MESSAGE;

use crate::{
    now_ms, BindingRecord, BindingStore, FleetView, HostOutcome, OutcomeRecord, SqliteFile,
    StoreError, StoreEvent, StoreStatus, StoredBinding, TargetSet, Upsert,
};

/// Connection state shared by the session task and the store.
#[derive(Default)]
pub(crate) struct Conn {
    pub client: Option<Client>,
    /// The member the session talks to, and its index in the endpoints.
    pub member: Option<String>,
    pub member_index: Option<usize>,
    /// The member a write tries first: the session's, or the last one that answered a write, or
    /// the next one after a member that did not.
    pub write_hint: usize,
    /// The session lost its member and looks for another (from the end of a connected session
    /// until it is connected again, or every member failed once): writes try the members
    /// themselves meanwhile instead of failing at once.
    pub moving: bool,
    /// `close()` ran: writes fail at once.
    pub closed: bool,
    pub lease: Option<i64>,
    pub unreachable_since_ms: Option<i64>,
    pub last_error: Option<String>,
    /// This process's first heartbeat is written: the host id was checked (`session.rs`).
    pub host_checked: bool,
    /// Why the session stopped for good (another running daemon has this host id).
    pub fatal: Option<String>,
}

pub(crate) struct Shared {
    pub opts: EtcdOptions,
    pub keys: keys::Keys,
    pub secrets: SecretKeys,
    pub location: String,
    /// In-memory state only: never held across a SQLite write (`mirror_file.rs`).
    pub mirror: Arc<Mutex<Mirror>>,
    /// The thread that writes the mirror's SQLite file (the bindings, in etcd's order, and this
    /// host's outcome history; it owns the file's connection for writes: `mirror_file.rs`).
    pub writer: mirror::Writer,
    /// A connection of its own to the same file, for reads of the outcome history (WAL: not
    /// blocked by a write).
    pub reader: Mutex<SqliteFile>,
    pub conn: Mutex<Conn>,
    pub events: broadcast::Sender<StoreEvent>,
    /// This host's newest outcome per binding not yet written to etcd.
    pub pending: Mutex<HashMap<String, HostOutcome>>,
    /// Wakes the session task to flush `pending`.
    pub flush: tokio::sync::Notify,
    /// Wakes the task that writes values again (`reseal.rs`).
    pub reseal: tokio::sync::Notify,
    /// The file where this host remembers the prefixes that require integrity (next to the
    /// mirror): a deletion of the fleet's integrity key does not undo it.
    pub integrity_file: PathBuf,
    /// Clients of members other than the session's, for writes the session's member did not
    /// answer (by endpoint index; dropped when they fail).
    pub spares: Mutex<Vec<Option<Client>>>,
    /// The lease of the writes' markers and when it was granted (`write.rs`).
    pub marker_lease: Mutex<Option<(i64, Instant)>>,
    /// The etcd cluster id and the highest revision this process has seen from it: a session
    /// that finds another cluster, or a revision below it (etcd restored from a backup), rebuilds
    /// the mirror (`session.rs`).
    pub seen: Mutex<Option<(u64, i64)>>,
    /// The bindings this host stepped out of (name → why), so that a session on a new lease
    /// puts their markers again: a marker lives with its session's lease (`claims.rs`).
    pub stood_aside: Mutex<std::collections::BTreeMap<String, String>>,
    /// Events the session's watch delivered since the store opened (every kind of key).
    pub watched: std::sync::atomic::AtomicU64,
    /// When the outcomes of every binding were last read (`fleet_read.rs`).
    pub fleet_read: tokio::sync::Mutex<Option<Instant>>,
    /// Bindings removed whose outcome and `unable` marker of this host are still to be deleted
    /// (`own_keys.rs`: each host deletes its own keys, the only ones its etcd user may write).
    pub orphans: Mutex<std::collections::BTreeSet<String>>,
    /// This process looked for its own keys to delete (`own_keys.rs`, `after_sync`): its
    /// outcomes of bindings removed while it was down, and its keys of the old layout.
    pub swept: std::sync::atomic::AtomicBool,
}

pub(crate) use crate::lock;

/// The fleet's [`BindingStore`] on etcd. See the module docs.
pub struct EtcdStore {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    /// The task removing what hosts gone for long left (`gc.rs`).
    gc: tokio::task::JoinHandle<()>,
    /// The task writing values again (`reseal.rs`).
    reseal: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("location", &self.shared.location)
            .field("host_id", &self.shared.opts.host_id)
            .finish()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        // Keep-alives stop: this host's claims end when its lease expires.
        self.task.abort();
        self.gc.abort();
        self.reseal.abort();
    }
}

impl EtcdStore {
    /// Opens the mirror and starts the session task (in the current tokio runtime). Does not
    /// wait for etcd: while it cannot be reached the store serves the mirror and `status()` says
    /// so. Fails only on wrong settings (no endpoint, a bad host id, the mirror file).
    pub fn open(opts: EtcdOptions, secrets: SecretKeys) -> Result<EtcdStore, StoreError> {
        if opts.endpoints.is_empty() {
            return Err(StoreError::Settings("no etcd endpoint given".into()));
        }
        keys::check_host_id(&opts.host_id)?;
        let keys = keys::Keys::new(&opts.prefix)?;
        let file = SqliteFile::open_with(&opts.mirror_path, opts.history.clone())?;
        let location = format!("etcd {} prefix {}", opts.endpoints.join(","), keys.prefix);
        let integrity_file = integrity::integrity_file(&opts.mirror_path);
        let view = mirror::FileView::load(&file)?;
        let reader = file.reader()?;
        let mut mirror = Mirror::new(
            view,
            Some(keys::Can {
                providers: opts.providers.clone(),
                keys: secrets.ids(),
                auth: true,
            }),
        );
        mirror.require =
            opts.require_integrity || integrity::remembers(&integrity_file, &keys.prefix);
        if !mirror.require {
            tracing::warn!(store = %location, "this host does not require a MAC on every value yet (until it reads the fleet's integrity key, which a new fleet puts at once): a value without one (written by a daemon of before, or by anyone who can write the prefix) is applied; see docs/fleet.md \"Integrity\" for the step that turns this off");
        }
        let mirror = Arc::new(Mutex::new(mirror));
        let file = Arc::new(Mutex::new(file));
        let writer = mirror::Writer::start(file, mirror.clone(), location.clone())?;
        let shared = Arc::new(Shared {
            mirror,
            writer,
            reader: Mutex::new(reader),
            reseal: tokio::sync::Notify::new(),
            integrity_file,
            conn: Mutex::new(Conn {
                unreachable_since_ms: Some(now_ms()),
                last_error: Some("not connected yet".into()),
                ..Conn::default()
            }),
            events: broadcast::channel(16_384).0,
            pending: Mutex::new(HashMap::new()),
            flush: tokio::sync::Notify::new(),
            spares: Mutex::new(vec![None; opts.endpoints.len()]),
            marker_lease: Mutex::new(None),
            seen: Mutex::new(None),
            stood_aside: Mutex::new(Default::default()),
            watched: Default::default(),
            fleet_read: Default::default(),
            orphans: Default::default(),
            swept: Default::default(),
            location,
            keys,
            secrets,
            opts,
        });
        let task = tokio::spawn(session::run(shared.clone()));
        let gc = tokio::spawn(gc::run(shared.clone()));
        let reseal = tokio::spawn(reseal::run(shared.clone()));
        Ok(EtcdStore {
            shared,
            task,
            gc,
            reseal,
        })
    }

    /// A handle on `shared` for a task of the store's own (its tasks are no-ops).
    fn handle(shared: Arc<Shared>) -> EtcdStore {
        EtcdStore {
            shared,
            task: tokio::spawn(async {}),
            gc: tokio::spawn(async {}),
            reseal: tokio::spawn(async {}),
        }
    }

    /// Waits until the store is connected and its mirror synced, at most `limit`; `false` at once
    /// when the store stopped for good ([`EtcdStore::refused`]).
    pub async fn wait_connected(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.status().connected {
                return true;
            }
            if self.refused().is_some() {
                return false;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Why the store stopped for good: another daemon whose session is alive runs with this
    /// host id under this prefix (the daemon must not start). `None` otherwise.
    pub fn refused(&self) -> Option<String> {
        lock(&self.shared.conn).fatal.clone()
    }

    /// Events the session's watch delivered since the store opened: the watch traffic this host
    /// receives (`docs/fleet.md`, "Benchmark under churn").
    pub fn watch_events(&self) -> u64 {
        self.shared
            .watched
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn unavailable(&self, why: impl Into<String>) -> StoreError {
        StoreError::Unavailable {
            store: self.shared.location.clone(),
            why: why.into(),
        }
    }

    /// Applies confirmed writes to the mirror (on a blocking thread: decoding many bindings
    /// takes a while; the file is written by the mirror's writer).
    async fn apply_own(&self, updates: Vec<Update>) -> Result<(), StoreError> {
        let shared = self.shared.clone();
        // Our own writes: no events.
        tokio::task::spawn_blocking(move || {
            mirror::apply(&shared, updates, None);
        })
        .await
        .map_err(|e| self.unavailable(format!("mirror thread: {e}")))
    }

    /// The stored form of `sb` once put at `meta` (`v2`: the fleet requires integrity, every
    /// host opens `v2` configs).
    fn binding_value(&self, sb: &StoredBinding, meta: auth::Meta, v2: bool) -> Vec<u8> {
        keys::encode_binding(
            sb,
            &self.shared.secrets,
            keys::Write {
                prefix: &self.shared.keys.prefix,
                meta,
                v2,
            },
        )
    }
}

#[async_trait]
impl BindingStore for EtcdStore {
    fn status(&self) -> StoreStatus {
        let (refused_values, integrity_required) = {
            let m = lock(&self.shared.mirror);
            (m.refused_total, m.require)
        };
        let c = lock(&self.shared.conn);
        StoreStatus {
            refused_values,
            integrity_required,
            kind: "etcd",
            host_id: self.shared.opts.host_id.clone(),
            connected: c.client.is_some(),
            unreachable_since_ms: c.unreachable_since_ms,
            last_error: c.last_error.clone(),
            location: match (&c.client, &c.member) {
                (Some(_), Some(m)) => format!("{} (connected to {m})", self.shared.location),
                _ => self.shared.location.clone(),
            },
        }
    }

    fn host_id(&self) -> &str {
        &self.shared.opts.host_id
    }

    fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        lock(&self.shared.mirror).file.list_bindings()
    }

    fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError> {
        lock(&self.shared.mirror).file.get_binding(name)
    }

    async fn insert_binding(&self, b: &BindingRecord) -> Result<(), StoreError> {
        self.insert(b).await
    }

    async fn upsert_bindings_from(
        &self,
        list: &[(BindingRecord, Option<BindingRecord>)],
    ) -> Result<Vec<Upsert>, StoreError> {
        self.upsert(list).await
    }

    async fn remove_binding(&self, name: &str) -> Result<bool, StoreError> {
        self.remove(name).await
    }

    async fn record_outcomes(&self, list: &[(String, OutcomeRecord)]) -> Result<(), StoreError> {
        // Through the mirror's writer: after the bindings it has to write (a binding saved a
        // moment ago is in the file by then).
        self.shared
            .writer
            .record_outcomes(list.to_vec())
            .await
            .map_err(|_| self.unavailable("the mirror's writer ended"))?
    }

    fn recent_outcomes(&self, name: &str, limit: usize) -> Result<Vec<OutcomeRecord>, StoreError> {
        lock(&self.shared.reader).recent_outcomes(name, limit)
    }

    fn last_outcomes(&self) -> Result<HashMap<String, OutcomeRecord>, StoreError> {
        lock(&self.shared.reader).last_outcomes()
    }

    fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.shared.events.subscribe()
    }

    async fn claim_resolver(&self, name: &str) -> Result<bool, StoreError> {
        self.claim(name).await
    }

    async fn publish_targets(&self, name: &str, set: &TargetSet) -> Result<(), StoreError> {
        self.publish(name, set).await
    }

    async fn step_out(&self, name: &str, why: &str) -> Result<(), StoreError> {
        self.stand_aside(name, why).await
    }

    async fn step_in(&self, name: &str) -> Result<(), StoreError> {
        self.stand_in(name).await
    }

    fn published_targets(&self, name: &str) -> Option<TargetSet> {
        lock(&self.shared.mirror).targets.get(name).cloned()
    }

    async fn publish_host_outcome(
        &self,
        name: &str,
        outcome: &HostOutcome,
    ) -> Result<(), StoreError> {
        let me = &self.shared.opts.host_id;
        let mut o = outcome.clone();
        o.host = me.clone();
        o.message = o.message.map(|m| bounded_message(m, MAX_OUTCOME_MESSAGE));
        let published = lock(&self.shared.mirror).outcome_of(name, me);
        if published.is_some_and(|p| mirror::same_outcome(&p, &o)) {
            lock(&self.shared.pending).remove(name);
            return Ok(());
        }
        lock(&self.shared.pending).insert(name.to_string(), o);
        if lock(&self.shared.conn).client.is_some() {
            self.shared.flush.notify_one();
        }
        Ok(())
    }

    async fn refresh_fleet(&self, name: Option<&str>) {
        if let Err(e) = fleet_read::read_outcomes(&self.shared, name, false).await {
            tracing::debug!(store = %self.shared.location, error = %e, "reading the hosts' outcomes failed; the fleet view shows the last ones read");
        }
    }

    fn fleet_hosts(&self) -> Vec<crate::FleetMember> {
        lock(&self.shared.mirror).members(&self.shared.opts.host_id)
    }

    async fn forget_host(&self, host: &str, force: bool) -> Result<crate::ForgotHost, StoreError> {
        self.forget_gone_host(host, force).await
    }

    async fn close(&self) {
        self.task.abort();
        self.gc.abort();
        self.reseal.abort();
        let (client, lease) = {
            let mut c = lock(&self.shared.conn);
            c.closed = true;
            (c.client.take(), c.lease.take())
        };
        lock(&self.shared.spares).iter_mut().for_each(|s| *s = None);
        if let (Some(mut client), Some(lease)) = (client, lease) {
            let _ =
                tokio::time::timeout(self.shared.opts.op_timeout, client.lease_revoke(lease)).await;
        }
        {
            let mut c = lock(&self.shared.conn);
            c.unreachable_since_ms.get_or_insert_with(now_ms);
            c.last_error = Some("the store was closed".into());
        }
        // The mirror's file has every change applied (a restart while etcd is down starts from
        // it), or the write failed: bounded by SQLite's busy timeout per batch queued.
        let shared = self.shared.clone();
        let limit = Duration::from_secs(30);
        let flushed = tokio::task::spawn_blocking(move || shared.writer.flush(limit)).await;
        if !matches!(flushed, Ok(true)) {
            tracing::warn!(store = %self.shared.location, "closing: the mirror file's writes did not end within {limit:?}");
        }
    }

    fn fleet_view(&self, name: &str) -> FleetView {
        let mut view = lock(&self.shared.mirror).fleet_view(name);
        // This host's newest state even before etcd has it.
        if let Some(mine) = lock(&self.shared.pending).get(name).cloned() {
            match view.hosts.iter_mut().find(|h| h.outcome.host == mine.host) {
                Some(h) => h.outcome = mine,
                None => {
                    view.hosts.push(crate::FleetHost {
                        outcome: mine,
                        alive: true,
                    });
                    view.hosts
                        .sort_by(|a, b| a.outcome.host.cmp(&b.outcome.host));
                }
            }
        }
        view
    }
}
