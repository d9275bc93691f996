//! One resolution of a binding by the host that holds its resolver claim (plugin call → validate
//! → publish the set for the fleet → render → apply), the handing of rendered bytes to the apply
//! task, and the vocabulary of a binding task's step ([`Why`], [`Step`]). The refresh task
//! (`refresh.rs`) and the fleet's choice of what to do (`fleet.rs`) both call it; it calls
//! neither (task → fleet → resolve).

use std::time::Instant;

use tokio::sync::oneshot;
use tributary_apply::Change;
use tributary_core::Binding;
use tributary_plugin_host::ResolveError;
use tributary_protocol::ResolveParams;
use tributary_store::{Failure, OutcomeRecord, OutcomeStatus, TargetSet};

use super::{lock, now_ms, ApplyMsg, Inner};
use crate::resolution::Resolved;

/// What woke a binding's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// Its schedule (or the first run of the task).
    Scheduled,
    /// A person asked for a refresh.
    Refresh,
    /// The store said the resolver claim is free.
    Claim,
    /// Another host published a target set.
    Follow,
}

/// What one step of a binding's task did: the outcome to record, and the generation of the
/// published target set it applied or attempted (`None`: no set was applied).
pub(crate) struct Step {
    pub(crate) outcome: OutcomeRecord,
    pub(crate) generation: Option<i64>,
    /// The store could not be reached: nothing was resolved or applied.
    pub(crate) store_down: bool,
    /// This host resolved the binding through its plugin (it held the claim).
    pub(crate) resolved: bool,
}

/// One resolution by the host that holds the resolver claim: plugin call → validate → publish the
/// set for the fleet → render → apply. Never fails: the outcome says how it went.
pub(crate) async fn resolve(inner: &Inner, binding: &Binding, updated_at_ms: i64) -> Step {
    let t0 = Instant::now();
    let mut rec = OutcomeRecord::new(now_ms(), OutcomeStatus::Failed);
    let mut generation = None;
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
            rec.failure = Some(match &e {
                ResolveError::Plugin(_) => Failure::PluginError,
                _ => Failure::PluginNoAnswer,
            });
            rec.code = e.code();
            rec.field = e.field().map(str::to_string);
        }
        Ok(answer) => {
            let directives = binding.file_directives(inner.opts.live.zoned());
            let r = Resolved::new(&binding.name, &directives, &answer);
            rec.ttl_seconds = Some(r.ttl_seconds);
            rec.kept = r.kept_with_tags(&answer);
            rec.dropped = r.dropped_records();
            if let Some(text) = &r.rendered {
                generation = Some(publish_targets(inner, binding, &rec, updated_at_ms).await);
                apply_rendered(inner, binding, text, &mut rec).await;
                if rec.status != OutcomeStatus::Failed {
                    rec.why = r.dropped_note();
                }
            } else {
                rec.failure = Some(Failure::NoValidTarget);
                rec.why = r
                    .no_target_reason()
                    .map(|reason| format!("{reason}; the current file was kept"));
            }
        }
    }
    rec.duration_ms = t0.elapsed().as_millis() as u64;
    Step {
        outcome: rec,
        generation,
        store_down: false,
        resolved: true,
    }
}

/// Hands rendered bytes to the apply task and writes its answer into `rec`. In live mode with
/// `drain_secs` > 0 the file keeps the targets that left discovery as drained servers for a while
/// (graceful removal, [`super::drain`]).
pub(crate) async fn apply_rendered(
    inner: &Inner,
    binding: &Binding,
    text: &str,
    rec: &mut OutcomeRecord,
) {
    let slot = if binding.drain_secs > 0 && inner.opts.live.zoned() {
        lock(&inner.slots).get(binding.name.as_str()).cloned()
    } else {
        None
    };
    let drained_text;
    let text = match &slot {
        Some(slot) => {
            let drain = std::time::Duration::from_secs(binding.drain_secs);
            let now = Instant::now();
            if lock(&slot.state).draining.is_new() {
                let path = inner.upstreams_dir.join(binding.name.file_name());
                let on_disk = std::fs::read_to_string(path).ok();
                lock(&slot.state)
                    .draining
                    .start_from(on_disk.as_deref(), drain, now);
            }
            drained_text = lock(&slot.state).draining.file(text, drain, now);
            drained_text.as_str()
        }
        None => text,
    };
    let (tx, rx) = oneshot::channel();
    let change = Change {
        name: binding.name.clone(),
        bytes: text.as_bytes().to_vec(),
    };
    let result = match inner
        .apply_tx
        .send(ApplyMsg::Change(change, super::apply::Waiter::new(tx)))
    {
        Ok(()) => rx.await.ok(),
        Err(_) => None,
    };
    super::apply::record_result(rec, result);
    if let Some(slot) = slot {
        if rec.status != OutcomeStatus::Failed {
            lock(&slot.state).draining.applied(text);
        }
        let drained = lock(&slot.state).draining.drained();
        if !drained.is_empty() {
            tracing::info!(
                binding = %binding.name,
                draining = ?drained.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
                "servers that left discovery are drained before their removal"
            );
        }
        super::drain::watch(inner, &slot, binding.name.as_str().to_string());
    }
}

/// Publishes the validated set of a resolution for the other hosts; returns its generation (0
/// when the store did not take it: this host applies it anyway).
pub(crate) async fn publish_targets(
    inner: &Inner,
    binding: &Binding,
    rec: &OutcomeRecord,
    updated_at_ms: i64,
) -> i64 {
    let name = binding.name.as_str();
    let set = TargetSet {
        resolved_by: String::new(),
        at_ms: rec.at_ms,
        binding_updated_at_ms: updated_at_ms,
        targets: rec.kept.clone(),
        dropped: rec.dropped.clone(),
        ttl_seconds: rec.ttl_seconds,
        generation: 0,
    };
    if let Err(e) = inner.store.publish_targets(name, &set).await {
        tracing::warn!(binding = %name, error = %e, "publishing the target set failed; applied here only");
        return 0;
    }
    inner
        .store
        .published_targets(name)
        .filter(|p| p.targets == set.targets)
        .map_or(0, |p| p.generation)
}
