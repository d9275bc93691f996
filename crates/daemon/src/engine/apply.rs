//! The apply task: the only writer of upstream files. It collects changes into batches (rules in
//! [`super::batch`]) and hands each to `Applier::apply_batch` on a blocking thread (one
//! `nginx -t`, one reload); removals go through the same task, so every write, test and reload is
//! serialised.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tributary_apply::{Applier, ApplyError, ChangeOutcome, ReloadCause, RemoveOutcome};
use tributary_core::UpstreamName;
use tributary_store::{Failure, OutcomeRecord, OutcomeStatus};

use super::batch::{Batch, BatchRules, Next, Queued};
use super::live::{ApplyResult, LiveOptions};
use super::{now_ms, EngineEvent, Inner};

/// A message for the apply task.
pub(crate) type ApplyMsg =
    Queued<Waiter, oneshot::Sender<Result<RemoveOutcome, ApplyError>>, oneshot::Sender<()>>;

/// Who waits for a change's outcome, and when the change was decided: the moment its bytes were
/// rendered from a validated answer and handed to the apply task (the start of "decision →
/// visible", docs/live-api.md).
pub(crate) struct Waiter {
    pub reply: oneshot::Sender<ApplyResult>,
    pub decided: std::time::Instant,
}

impl Waiter {
    /// A waiter for a change decided now.
    pub fn new(reply: oneshot::Sender<ApplyResult>) -> Waiter {
        Waiter {
            reply,
            decided: std::time::Instant::now(),
        }
    }
}

pub(crate) async fn apply_task(
    applier: Applier,
    mut rx: mpsc::UnboundedReceiver<ApplyMsg>,
    inner: std::sync::Weak<Inner>,
    rules: BatchRules,
    live: LiveOptions,
) {
    let mut applier = Some(applier);
    let rt = tokio::runtime::Handle::current();
    while let Some(first) = rx.recv().await {
        // Collect what becomes ready close together into one batch.
        let opened = Instant::now();
        let goes_live = |m: &ApplyMsg| match (m, &applier) {
            (Queued::Change(c, _), Some(a)) => live.goes_live(a, c),
            _ => false,
        };
        let mut all_live = goes_live(&first);
        let mut msgs = vec![first];
        while let Next::WaitUntil(until) = rules.next(&msgs, opened, Instant::now(), all_live) {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(m)) => {
                    all_live &= goes_live(&m);
                    msgs.push(m);
                }
                Ok(None) | Err(_) => break,
            }
        }
        let window_ms = opened.elapsed().as_secs_f64() * 1000.0;
        let Batch {
            changes,
            replies: change_replies,
            removes,
            stops,
        } = Batch::collect(msgs);
        let Some(mut a) = applier.take() else {
            break;
        };
        if !changes.is_empty() {
            if let Some(i) = inner.upgrade() {
                i.batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let n = changes.len();
        let changes_names: Vec<UpstreamName> = changes.iter().map(|c| c.name.clone()).collect();
        // The newest message of a name carries its bytes, so its decision time is the one.
        let decided: Vec<std::time::Instant> = change_replies
            .iter()
            .map(|w| w.last().map_or_else(std::time::Instant::now, |w| w.decided))
            .collect();
        let names: Vec<UpstreamName> = removes.iter().map(|(n, _)| n.clone()).collect();
        let (rt, live) = (rt.clone(), live.clone());
        let joined = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let outcomes = if changes.is_empty() {
                Vec::new()
            } else {
                super::live::apply_batch(&mut a, &live, &changes, &decided, &rt)
            };
            if !changes.is_empty() {
                let changed = outcomes
                    .iter()
                    .filter(|(_, o)| !matches!(o.outcome, ChangeOutcome::Unchanged))
                    .count();
                let took_ms = started.elapsed().as_millis() as u64;
                let steps = a.last_steps();
                if changed > 0 {
                    tracing::info!(
                        changes = n,
                        changed,
                        took_ms,
                        window_ms,
                        write_ms = steps.write.as_secs_f64() * 1000.0,
                        test_ms = steps.test.as_secs_f64() * 1000.0,
                        tests = steps.tests,
                        "batch applied"
                    );
                } else {
                    tracing::debug!(changes = n, took_ms, "batch unchanged");
                }
            }
            let removed: Vec<Result<RemoveOutcome, ApplyError>> =
                names.iter().map(|n| a.remove(n)).collect();
            (a, outcomes, removed)
        })
        .await;
        match joined {
            Ok((a, outcomes, removed)) => {
                applier = Some(a);
                if let (Some(i), false) = (inner.upgrade(), outcomes.is_empty()) {
                    let _ = i.events.send(EngineEvent::Batch {
                        changes: outcomes.len(),
                        reloaded: outcomes.iter().any(|(_, o)| {
                            matches!(o.outcome, ChangeOutcome::Applied { reloaded: true })
                        }),
                        test_failures: outcomes
                            .iter()
                            .filter(|(_, o)| matches!(o.outcome, ChangeOutcome::TestFailed { .. }))
                            .count(),
                        at_ms: now_ms(),
                    });
                }
                let by_name: HashMap<String, ApplyResult> = outcomes
                    .into_iter()
                    .map(|(n, o)| (n.as_str().to_string(), o))
                    .collect();
                for (change, replies) in changes_names.iter().zip(change_replies) {
                    let outcome = by_name.get(change.as_str()).cloned().unwrap_or_else(|| {
                        ApplyResult::new(
                            ChangeOutcome::ReloadFailed {
                                cause: ReloadCause::Command,
                                error: "the applier returned no outcome for this upstream".into(),
                            },
                            None,
                        )
                    });
                    for w in replies {
                        let _ = w.reply.send(outcome.clone());
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

/// Writes what the applier did with a binding's change into its outcome: status, the failure kind,
/// why, and nginx's own text. `None`: the apply task is gone (the daemon is stopping).
/// `reloaded` is only ever true for a reload the applier confirmed live. The path taken (live or
/// reload) and why go to `applied` / `applied_reason`.
pub(crate) fn record_result(rec: &mut OutcomeRecord, result: Option<ApplyResult>) {
    let (outcome, path, reason) = match result {
        Some(r) => (Some(r.outcome), r.path, r.reload_reason),
        None => (None, None, None),
    };
    record_change(rec, outcome);
    if let Some((applied, why)) = path {
        rec.applied = Some(applied);
        rec.applied_reason = Some(why);
        rec.reload_reason = reason;
    }
}

/// Which way a reload failed, for the person.
pub(crate) fn reload_cause_text(cause: ReloadCause) -> &'static str {
    match cause {
        ReloadCause::Command => "the reload command failed",
        ReloadCause::CannotConfirm => "not sent: the master's state could not be read",
        ReloadCause::Rejected => "rejected by the master",
        ReloadCause::Timeout => "not confirmed live in time",
        ReloadCause::MasterGone => "the master exited",
    }
}

/// [`record_result`] without the path: status, failure kind, why and nginx's text.
pub(crate) fn record_change(rec: &mut OutcomeRecord, result: Option<ChangeOutcome>) {
    let fail = |rec: &mut OutcomeRecord, kind: Failure, why: String, nginx: Option<String>| {
        rec.status = OutcomeStatus::Failed;
        rec.failure = Some(kind);
        rec.why = Some(why);
        rec.nginx_error = nginx;
    };
    match result {
        Some(ChangeOutcome::Unchanged) => rec.status = OutcomeStatus::Unchanged,
        Some(ChangeOutcome::Applied { reloaded }) => {
            rec.status = OutcomeStatus::Ok;
            rec.changed = true;
            rec.reloaded = reloaded;
        }
        Some(ChangeOutcome::TestFailed { nginx_error }) => fail(
            rec,
            Failure::TestFailed,
            "nginx -t failed with the new file; the previous file was restored".into(),
            Some(nginx_error),
        ),
        Some(ChangeOutcome::ReloadFailed { cause, error }) => fail(
            rec,
            Failure::ReloadFailed,
            format!(
                "nginx reload failed ({}); the previous file was restored",
                reload_cause_text(cause)
            ),
            Some(error),
        ),
        Some(ChangeOutcome::RestoreFailed { cause, error }) => fail(
            rec,
            Failure::RestoreFailed,
            format!(
                "the change failed and the previous file could not be put back ({error}); its \
                 journal is kept and the restore is retried"
            ),
            Some(cause),
        ),
        Some(ChangeOutcome::WriteFailed { error }) => fail(
            rec,
            Failure::WriteFailed,
            format!("the file could not be written ({error}); nothing changed"),
            None,
        ),
        None => fail(
            rec,
            Failure::Stopping,
            "the daemon is stopping; nothing applied".into(),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> OutcomeRecord {
        OutcomeRecord::new(0, OutcomeStatus::Failed)
    }

    #[test]
    fn every_change_outcome_maps_to_its_status_and_failure_kind() {
        let cases = [
            (
                Some(ChangeOutcome::Unchanged),
                OutcomeStatus::Unchanged,
                None,
            ),
            (
                Some(ChangeOutcome::Applied { reloaded: true }),
                OutcomeStatus::Ok,
                None,
            ),
            (
                Some(ChangeOutcome::TestFailed {
                    nginx_error: "t".into(),
                }),
                OutcomeStatus::Failed,
                Some(Failure::TestFailed),
            ),
            (
                Some(ChangeOutcome::ReloadFailed {
                    cause: ReloadCause::Rejected,
                    error: "r".into(),
                }),
                OutcomeStatus::Failed,
                Some(Failure::ReloadFailed),
            ),
            (
                Some(ChangeOutcome::RestoreFailed {
                    cause: "c".into(),
                    error: "e".into(),
                }),
                OutcomeStatus::Failed,
                Some(Failure::RestoreFailed),
            ),
            (
                Some(ChangeOutcome::WriteFailed { error: "w".into() }),
                OutcomeStatus::Failed,
                Some(Failure::WriteFailed),
            ),
            (None, OutcomeStatus::Failed, Some(Failure::Stopping)),
        ];
        for (result, status, failure) in cases {
            let mut rec = blank();
            record_change(&mut rec, result.clone());
            assert_eq!((rec.status, rec.failure), (status, failure), "{result:?}");
            assert_eq!(rec.reloaded, status == OutcomeStatus::Ok, "{result:?}");
        }
        let mut rec = blank();
        record_change(
            &mut rec,
            Some(ChangeOutcome::RestoreFailed {
                cause: "nginx said no".into(),
                error: "EPERM".into(),
            }),
        );
        assert!(
            !rec.why.as_deref().unwrap().contains("was restored"),
            "{rec:?}"
        );
        assert!(rec.why.as_deref().unwrap().contains("EPERM"), "{rec:?}");
        assert_eq!(rec.nginx_error.as_deref(), Some("nginx said no"));
    }
}
