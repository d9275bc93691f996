//! The per-binding refresh task and one resolution (plugin call → validate → render → apply).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tributary_apply::Change;
use tributary_core::{schedule, Binding};
use tributary_plugin_host::ResolveError;
use tributary_protocol::ResolveParams;
use tributary_store::{Failure, OutcomeRecord, OutcomeStatus};

use super::{lock, now_ms, ApplyMsg, EngineEvent, Inner, RecordMsg, Slot};
use crate::resolution::Resolved;

pub(crate) async fn binding_task(
    inner: std::sync::Weak<Inner>,
    slot: Arc<Slot>,
    binding: Arc<Binding>,
) {
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
            .send(RecordMsg::Outcome(name.clone(), Box::new(outcome)));
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
        failure: None,
        why: None,
        code: None,
        field: None,
        kept: Vec::new(),
        dropped: Vec::new(),
        ttl_seconds: None,
        changed: false,
        reloaded: false,
        nginx_error: None,
        applied: None,
        applied_reason: None,
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
            rec.failure = Some(match &e {
                ResolveError::Plugin(_) => Failure::PluginError,
                _ => Failure::PluginNoAnswer,
            });
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
                super::apply::record_result(&mut rec, result);
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
    rec
}
