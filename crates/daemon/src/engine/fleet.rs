//! The fleet side of the engine, the same for every store (the engine does not know which one it
//! has; with SQLite the fleet is this host alone):
//!
//! - [`step`]: one wake-up of a binding's task. A scheduled run, a person's refresh or a free
//!   resolver claim asks `claim_resolver`: `true` → resolve through the plugin and publish the
//!   validated set (`resolve::resolve`); `false` → apply the newest published set, if it was
//!   resolved from this host's version of the binding; an error (store unreachable) → nothing is
//!   resolved or applied, the servers stay, the outcome says why. A new published set wakes the
//!   task to apply it ([`Why::Follow`]).
//! - A published set is validated again here (`tributary-core`'s `validate`, through
//!   [`Resolved`]) and rendered with this host's directives and apply path: what reaches this
//!   host's nginx went through the same checks as a local resolution.
//! - [`publish_outcome`]: after each apply, this host's state for the fleet view (applied, failed
//!   with nginx's message, stale while the store is unreachable).
//! - [`store_task`]: follows the store's events. A binding created, changed or removed on
//!   another host is re-read and its slot created, replaced or removed (a removal deletes the file
//!   through the apply task, as a local removal does; a file nginx still needs is kept);
//!   `Resync` re-reads everything but wakes only what changed: refresh deadlines are kept.

use std::collections::HashSet;
use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{broadcast, oneshot};
use tributary_apply::RemoveOutcome;
use tributary_core::{Binding, UpstreamName};
use tributary_protocol::ResolveResult;
use tributary_store::{
    Failure, HostOutcome, HostState, OutcomeRecord, OutcomeStatus, StoreError, StoreEvent,
    StoredBinding,
};

use super::resolve::{apply_rendered, resolve, Step, Why};
use super::{lock, now_ms, record_to_binding, ApplyMsg, Engine, Inner, Slot};
use crate::resolution::Resolved;

/// One wake-up of a binding's task; `None` when there was nothing to do (a host that does not
/// resolve the binding and has no newer published set to apply).
pub(crate) async fn step(inner: &Inner, slot: &Slot, binding: &Binding, why: Why) -> Option<Step> {
    if why != Why::Follow {
        super::step_out::step_back_in(inner, slot, binding).await;
    }
    if why == Why::Follow {
        return follow(inner, slot, binding, false).await;
    }
    // The store says the claim changed: that is also said when a host (this one included) has
    // just taken it. Only a free claim is to be taken now; a held one is its holder's to resolve
    // on its schedule (else the host that just claimed and resolved would resolve twice).
    if why == Why::Claim
        && inner
            .store
            .fleet_view(binding.name.as_str())
            .resolver
            .is_some()
    {
        return follow(inner, slot, binding, false).await;
    }
    match inner.store.claim_resolver(binding.name.as_str()).await {
        Ok(true) => {
            let updated_at_ms = lock(&slot.state).updated_at_ms;
            Some(resolve(inner, binding, updated_at_ms).await)
        }
        // A free claim taken by another host: nothing to apply unless a newer set is out.
        Ok(false) => follow(inner, slot, binding, why != Why::Claim).await,
        Err(e @ StoreError::Unavailable { .. }) if inner.opts.resolve_during_outage => {
            Some(super::fleet_outage::resolve_locally(inner, slot, binding, &e).await)
        }
        Err(e) => Some(store_down(&e)),
    }
}

/// The outcome of a run that could not reach the store: nothing resolved, nothing applied.
fn store_down(e: &StoreError) -> Step {
    let mut rec = OutcomeRecord::new(now_ms(), OutcomeStatus::Failed);
    rec.why = Some(format!(
        "{e}; not resolved (the store decides which host resolves), the current servers were kept"
    ));
    Step {
        outcome: rec,
        generation: None,
        store_down: true,
        resolved: false,
    }
}

/// Applies the newest published target set of the binding, when it was resolved from this host's
/// version of the binding and (unless `again`) is newer than the one applied last.
async fn follow(inner: &Inner, slot: &Slot, binding: &Binding, again: bool) -> Option<Step> {
    let (updated_at_ms, applied) = {
        let st = lock(&slot.state);
        (st.updated_at_ms, st.applied_generation)
    };
    let set = inner.store.published_targets(binding.name.as_str())?;
    if set.binding_updated_at_ms != updated_at_ms || (!again && set.generation <= applied) {
        return None;
    }
    let t0 = Instant::now();
    let mut rec = OutcomeRecord::new(now_ms(), OutcomeStatus::Failed);
    let answer = ResolveResult {
        targets: set.targets.clone(),
        ttl_seconds: set.ttl_seconds.unwrap_or(0),
    };
    let directives = binding.file_directives(inner.opts.live.zoned());
    let r = Resolved::new(&binding.name, &directives, &answer);
    rec.ttl_seconds = set.ttl_seconds;
    rec.kept = r.kept_with_tags(&answer);
    rec.dropped = set.dropped.clone();
    let by = format!("the target set resolved by host {:?}", set.resolved_by);
    match &r.rendered {
        Some(text) => {
            apply_rendered(inner, binding, text, &mut rec).await;
            if rec.status != OutcomeStatus::Failed {
                rec.why = Some(match r.dropped_note() {
                    Some(note) => format!("applied {by}; {note}"),
                    None => format!("applied {by}"),
                });
            }
        }
        None => {
            rec.failure = Some(Failure::NoValidTarget);
            rec.why = Some(format!(
                "{by} has no valid target here; the current file was kept"
            ));
        }
    }
    rec.duration_ms = t0.elapsed().as_millis() as u64;
    Some(Step {
        outcome: rec,
        generation: Some(set.generation),
        store_down: false,
        resolved: false,
    })
}

/// Publishes this host's state of `name` after a step: applied, failed with nginx's message, or
/// stale when the store could not be reached. A failed resolution (plugin error, no valid
/// target) applied nothing: the published state stands.
pub(crate) async fn publish_outcome(
    inner: &Inner,
    name: &str,
    outcome: &OutcomeRecord,
    generation: Option<i64>,
    store_down: bool,
    applied: i64,
    servers: usize,
) {
    let (state, message) = if store_down {
        (HostState::Stale, outcome.why.clone())
    } else if generation.is_none() {
        return;
    } else if outcome.status == OutcomeStatus::Failed {
        (
            HostState::Failed,
            outcome.nginx_error.clone().or_else(|| outcome.why.clone()),
        )
    } else {
        (HostState::Applied, None)
    };
    let host = HostOutcome {
        host: String::new(),
        state,
        at_ms: outcome.at_ms,
        generation: generation.unwrap_or(applied),
        servers,
        message,
    };
    if let Err(e) = inner.store.publish_host_outcome(name, &host).await {
        tracing::warn!(binding = %name, error = %e, "publishing this host's outcome failed");
    }
}

/// Follows the store's events until the engine is gone.
pub(crate) async fn store_task(
    inner: std::sync::Weak<Inner>,
    mut rx: broadcast::Receiver<StoreEvent>,
    sweep_now: bool,
) {
    if sweep_now {
        if let Some(inner) = inner.upgrade() {
            let engine = Engine { inner };
            let _admin = engine.inner.admin.lock().await;
            match engine.inner.store.list_bindings() {
                Ok(list) => {
                    let names = list.into_iter().map(|b| b.binding.name).collect();
                    sweep(&engine, &names).await;
                }
                Err(e) => tracing::warn!(error = %e, "reading the bindings failed"),
            }
        }
    }
    // The store was unreachable at the last `Status` event: when it answers again every binding
    // asks for its claim and applies newer sets (whether or not the store also sends `Resync`).
    let mut was_down = false;
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(broadcast::error::RecvError::Lagged(_)) => StoreEvent::Resync,
            // A store without events (or one that stopped): nothing more to follow, and
            // nothing is wrong with this host.
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let engine = Engine { inner };
        let slot = |name: &str| lock(&engine.inner.slots).get(name).cloned();
        match ev {
            StoreEvent::Binding(name) => {
                let _admin = engine.inner.admin.lock().await;
                match engine.inner.store.get_binding(&name) {
                    Ok(stored) => sync_binding(&engine, &name, stored).await,
                    Err(e) => {
                        tracing::warn!(binding = %name, error = %e, "reading a binding changed elsewhere failed")
                    }
                }
            }
            StoreEvent::Resync => resync(&engine).await,
            StoreEvent::Targets(name) => {
                if let Some(s) = slot(&name) {
                    s.follow.notify_one();
                }
            }
            StoreEvent::Resolver(name) => {
                if let Some(s) = slot(&name) {
                    s.claim.notify_one();
                }
            }
            StoreEvent::Status => {
                let connected = engine.inner.store.status().connected;
                if connected && was_down {
                    tracing::info!("the store answers again; catching up");
                    catch_up(&engine);
                } else if !connected && !was_down {
                    tracing::warn!(
                        "the store is unreachable; serving the last applied servers until it answers"
                    );
                }
                was_down = !connected;
            }
            StoreEvent::Fleet(_) => {}
        }
    }
}

/// Re-reads every binding; bindings gone from the store are removed here too (and the files of
/// bindings this host no longer knew, [`sweep`]). A binding whose stored record changed is
/// rescheduled ([`sync_binding`]); every other one keeps its refresh deadline and only checks
/// what the mirror holds now ([`catch_up`]): nothing is resolved again because the session moved
/// to another member or synced its mirror again.
async fn resync(engine: &Engine) {
    let _admin = engine.inner.admin.lock().await;
    let list = match engine.inner.store.list_bindings() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "re-reading the bindings failed");
            return;
        }
    };
    let names: HashSet<String> = list.iter().map(|b| b.binding.name.clone()).collect();
    for sb in list {
        let name = sb.binding.name.clone();
        sync_binding(engine, &name, Some(sb)).await;
    }
    let gone: Vec<String> = lock(&engine.inner.slots)
        .keys()
        .filter(|k| !names.contains(*k))
        .cloned()
        .collect();
    for name in gone {
        sync_binding(engine, &name, None).await;
    }
    sweep(engine, &names).await;
    catch_up(engine);
}

/// After a resync or an outage, each binding checks the mirror without resolving: a newer
/// published set is applied, a free claim is taken (and only then resolved). A binding whose
/// last run could not reach the store runs again now (it resolved nothing); every other one
/// keeps its refresh deadline. A session that moved to another member changed nothing here:
/// no plugin is called.
fn catch_up(engine: &Engine) {
    let slots: Vec<Arc<Slot>> = lock(&engine.inner.slots).values().cloned().collect();
    for s in slots {
        if lock(&s.state).store_down {
            s.wake.notify_one();
        } else {
            s.claim.notify_one();
        }
    }
}

/// Brings the slot of `name` in line with the stored binding (created, replaced or removed on
/// another host). The caller holds the admin lock.
async fn sync_binding(engine: &Engine, name: &str, stored: Option<StoredBinding>) {
    let existing = lock(&engine.inner.slots).get(name).cloned();
    match (existing, stored) {
        (None, None) => {}
        (Some(slot), None) => remove_here(engine, name, &slot).await,
        (existing, Some(sb)) => {
            if let Some(slot) = &existing {
                let st = lock(&slot.state);
                if st.record == sb.binding && st.updated_at_ms == sb.updated_at_ms {
                    return;
                }
            }
            let binding = match record_to_binding(&sb.binding) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(binding = %name, error = %e, "binding saved elsewhere is invalid here; not scheduled");
                    return;
                }
            };
            let slot = match existing {
                Some(slot) => {
                    let mut st = lock(&slot.state);
                    st.binding = Arc::new(binding);
                    st.record = sb.binding;
                    st.updated_at_ms = sb.updated_at_ms;
                    drop(st);
                    slot
                }
                None => engine.new_slot(binding, sb.binding, sb.updated_at_ms),
            };
            tracing::info!(binding = %name, "binding saved on another host");
            engine.spawn(&slot);
        }
    }
}

/// A binding removed on another host: stop it and remove its file through the apply task, as a
/// local removal does. A file nginx still needs (an `include` still names it) stays, with an
/// error in the log: the store never empties an upstream.
async fn remove_here(engine: &Engine, name: &str, slot: &Slot) {
    let uname = {
        let mut st = lock(&slot.state);
        if let Some(t) = st.task.take() {
            t.abort();
        }
        st.binding.name.clone()
    };
    remove_file(engine, uname, "binding removed on another host").await;
    lock(&engine.inner.slots).remove(name);
}

/// Removes the files Tributary wrote (first line [`tributary_core::HEADER`]) whose binding is
/// neither in `stored` (the store's list) nor has a slot here: bindings removed while this host
/// was down (their removal event came before the engine listened, or was never sent). Each goes
/// through the apply task like any removal (tested, reloaded; a file nginx still needs stays).
/// Any other file of the folder (a person's own, a helper file) is never touched. The caller
/// holds the admin lock.
pub(crate) async fn sweep(engine: &Engine, stored: &HashSet<String>) {
    let dir = engine.inner.upstreams_dir.clone();
    let known: HashSet<String> = lock(&engine.inner.slots).keys().cloned().collect();
    let found = tokio::task::spawn_blocking(move || unbound_files(&dir, |n| known.contains(n)))
        .await
        .unwrap_or_default();
    for name in found {
        if stored.contains(name.as_str()) {
            continue;
        }
        remove_file(engine, name, "binding no longer in the store").await;
    }
}

/// The names of the files in `dir` that Tributary wrote (`NAME.conf`, NAME a valid upstream
/// name, first line [`tributary_core::HEADER`]) and `known` does not name.
fn unbound_files(dir: &Path, known: impl Fn(&str) -> bool) -> Vec<UpstreamName> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<UpstreamName> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let name = UpstreamName::parse(file.strip_suffix(".conf")?).ok()?;
            if known(name.as_str()) || !e.file_type().ok()?.is_file() {
                return None;
            }
            let mut first = String::new();
            let f = std::fs::File::open(e.path()).ok()?;
            std::io::BufRead::read_line(&mut std::io::BufReader::new(f).take(256), &mut first)
                .ok()?;
            (first.trim_end_matches('\n') == tributary_core::HEADER).then_some(name)
        })
        .collect();
    found.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    found
}

/// Removes `uname`'s file through the apply task and logs what happened (`why`: why the binding
/// is gone).
async fn remove_file(engine: &Engine, uname: UpstreamName, why: &str) {
    let name = uname.as_str().to_string();
    let (tx, rx) = oneshot::channel();
    if engine
        .inner
        .apply_tx
        .send(ApplyMsg::Remove(uname, tx))
        .is_err()
    {
        return;
    }
    match rx.await {
        Ok(Ok(RemoveOutcome::Removed)) => {
            tracing::info!(binding = %name, why, "file removed (nginx tested and reloaded)")
        }
        Ok(Ok(RemoveOutcome::NotFound)) => {
            tracing::info!(binding = %name, why, "no file to remove")
        }
        Ok(Ok(other)) => tracing::error!(
            binding = %name,
            why,
            outcome = ?other,
            "this host's nginx still needs the file: kept; remove the include line"
        ),
        Ok(Err(e)) => {
            tracing::error!(binding = %name, why, error = %e, "removing the file failed")
        }
        Err(_) => {}
    }
}
