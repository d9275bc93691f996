//! The per-binding refresh task and one resolution (plugin call → validate → render → apply).
//!
//! Jitter: bindings saved together (a bulk request, an import, a fleet's mirror sync, a restart)
//! must not call their registry in lockstep forever. The first resolution of a task is immediate
//! (a person waits for it; at start it brings stale files up to date), bounded only by the plugin
//! host's calls in flight per plugin. Every delay after it goes through
//! [`tributary_core::schedule::jittered`] (`tributary serve --refresh-jitter-pct`, default
//! [`DEFAULT_JITTER_PCT`]): the first scheduled one, and the one after any run that was not on
//! schedule (a person's refresh, a claim taken over from a dead host, the catch-up after a store
//! outage: those wake many bindings at once), spreads the binding's phase over its interval; every
//! other one is drawn from a window of J % of the delay, also at the 10 s minimum. J = 0 keeps the
//! exact schedule.

use std::sync::Arc;

use tributary_core::{schedule, Binding};
use tributary_store::OutcomeStatus;

use super::resolve::{Step, Why};
use super::{lock, now_ms, EngineEvent, Inner, RecordMsg, Slot};

pub use tributary_core::schedule::{jittered, DEFAULT_JITTER_PCT, MAX_JITTER_PCT};

pub(crate) async fn binding_task(
    inner: std::sync::Weak<Inner>,
    slot: Arc<Slot>,
    binding: Arc<Binding>,
) {
    let name = binding.name.as_str().to_string();
    let mut deadline = tokio::time::Instant::now();
    let mut first = true;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        lock(&slot.state).next_ms = Some(now_ms() + left.as_millis() as i64);
        let why = tokio::select! {
            // Biased: the first run of a task (deadline now) always claims/resolves.
            biased;
            _ = tokio::time::sleep_until(deadline) => Why::Scheduled,
            _ = slot.wake.notified() => Why::Refresh,
            _ = slot.claim.notified() => Why::Claim,
            _ = slot.follow.notified() => Why::Follow,
        };
        {
            let mut st = lock(&slot.state);
            st.next_ms = None;
            st.running = true;
        }
        let Some(engine) = inner.upgrade() else {
            return;
        };
        let step = super::fleet::step(&engine, &slot, &binding, why).await;
        let Some(step) = step else {
            // A host that does not resolve the binding had nothing new to apply.
            lock(&slot.state).running = false;
            if why == Why::Scheduled {
                deadline = tokio::time::Instant::now()
                    + jittered(
                        binding.interval,
                        engine.opts.refresh_jitter_pct,
                        first,
                        fastrand::f64(),
                    );
                first = false;
            }
            continue;
        };
        super::step_out::count_resolution(&engine, &slot, &binding, &step).await;
        let Step {
            outcome,
            generation,
            store_down,
            resolved,
        } = step;
        let (failures, servers, applied) = {
            let mut st = lock(&slot.state);
            st.running = false;
            st.store_down = store_down;
            if outcome.status == OutcomeStatus::Failed {
                st.failures = st.failures.saturating_add(1);
            } else {
                st.failures = 0;
                st.servers = outcome.kept.clone();
            }
            if let Some(g) = generation {
                st.applied_generation = st.applied_generation.max(g);
                // Resolved through the plugin, validated and published (or equal to the set
                // published; 0: the store did not take it): the fleet's set age starts again.
                if resolved && g > 0 {
                    st.resolved_ok_ms = Some(outcome.at_ms);
                }
            }
            st.last = Some(outcome.clone());
            (st.failures, st.servers.len(), st.applied_generation)
        };
        // Following a published set keeps the schedule (it is the moment to check the claim).
        if why != Why::Follow {
            let delay = if outcome.status == OutcomeStatus::Failed {
                schedule::failure_backoff(binding.interval, failures)
            } else {
                schedule::next_refresh_delay(binding.interval, outcome.ttl_seconds.unwrap_or(0))
            };
            // A run off schedule (a refresh, a claim taken over, a catch-up) usually woke many
            // bindings at once: their phases are spread again.
            let delay = jittered(
                delay,
                engine.opts.refresh_jitter_pct,
                first || why != Why::Scheduled,
                fastrand::f64(),
            );
            deadline = tokio::time::Instant::now() + delay;
            first = false;
        }
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
        super::fleet::publish_outcome(
            &engine, &name, &outcome, generation, store_down, applied, servers,
        )
        .await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_first_scheduled_delay_is_spread_over_the_interval() {
        assert_eq!(jittered(S(60), 10, true, 0.0), S(10));
        assert_eq!(jittered(S(60), 10, true, 0.5), S(35));
        assert!(jittered(S(60), 10, true, 0.999_999) <= S(60));
        // The same for any jitter above 0: the phase is spread, not the period.
        assert_eq!(jittered(S(60), 1, true, 0.5), S(35));
    }

    #[test]
    fn later_delays_are_shortened_by_at_most_the_jitter_and_never_below_10_s() {
        assert_eq!(jittered(S(60), 10, false, 0.0), S(60));
        assert_eq!(jittered(S(60), 10, false, 0.5), S(57));
        assert!(jittered(S(60), 10, false, 0.999_999) > S(54));
        // At the minimum the window moves later rather than collapsing on 10 s.
        assert!(jittered(S(11), 50, false, 0.999) >= S(10));
        assert!(jittered(S(11), 50, false, 0.999) < S(10) + Duration::from_millis(10));
        assert_eq!(
            jittered(S(11), 50, false, 0.0),
            Duration::from_millis(15_500)
        );
        // Over the cap: 50 %.
        assert_eq!(jittered(S(100), 200, false, 1.0), S(50));
    }

    #[test]
    fn no_jitter_keeps_the_exact_delay() {
        for first in [true, false] {
            assert_eq!(jittered(S(60), 0, first, 0.7), S(60));
            assert_eq!(jittered(S(10), 0, first, 0.7), S(10));
        }
    }

    #[test]
    fn delays_at_the_10_s_minimum_are_spread_too() {
        // First: over half the interval past the minimum.
        assert_eq!(jittered(S(10), 10, true, 0.0), S(10));
        assert_eq!(
            jittered(S(10), 10, true, 0.5),
            Duration::from_millis(12_500)
        );
        assert!(jittered(S(10), 10, true, 0.999_999) <= S(15));
        // Later: a window of 10 % of the delay, moved to start at 10 s.
        assert_eq!(jittered(S(10), 10, false, 0.0), S(11));
        assert_eq!(
            jittered(S(10), 10, false, 0.5),
            Duration::from_millis(10_500)
        );
        assert!(jittered(S(10), 10, false, 0.999_999) >= S(10));
        // Continuous around the minimum: 11.1 s is where the window stops moving.
        let d = Duration::from_millis(11_200);
        assert_eq!(jittered(d, 10, false, 0.0), d);
        assert!(jittered(d, 10, false, 0.999_999) >= Duration::from_millis(10_080));
    }

    #[test]
    fn ten_thousand_bindings_saved_together_get_spread_phases() {
        // The first scheduled refreshes of 10,000 bindings with a 60 s interval, all resolved at
        // the same moment: how many fall in the busiest second.
        let mut per_second = [0u32; 61];
        for _ in 0..10_000 {
            let d = jittered(S(60), DEFAULT_JITTER_PCT, true, fastrand::f64());
            per_second[d.as_secs() as usize] += 1;
        }
        let busiest = per_second.iter().max().copied().unwrap_or(0);
        // Uniform over 50 s: about 200 a second; without jitter all 10,000 share one second.
        assert!(busiest < 400, "busiest second: {busiest}");
        assert_eq!(per_second[..10].iter().sum::<u32>(), 0, "none before 10 s");
    }
}
