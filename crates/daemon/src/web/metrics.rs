//! `/metrics`: Prometheus text exposition of what the engine reports ([`EngineEvent`]).
//!
//! A task subscribed to the engine counts resolutions by outcome, plugin errors by code, the
//! resolution latency histogram, reloads, changes refused by `nginx -t`, the last successful
//! reload, and each binding's last successful resolution (for staleness). The per-binding gauges
//! are read from the engine at scrape time, so removed bindings disappear.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast::error::RecvError;
use tributary_store::{OutcomeRecord, OutcomeStatus};

use crate::engine::{Engine, EngineEvent};

/// Upper bounds (seconds) of the resolution latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The last change refused by `nginx -t` (for the nginx status endpoint and page).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TestFailure {
    pub binding: String,
    pub at_ms: i64,
    pub nginx_error: String,
}

#[derive(Debug, Default)]
struct Counters {
    resolutions: BTreeMap<&'static str, u64>,
    plugin_errors: BTreeMap<String, u64>,
    buckets: [u64; LATENCY_BUCKETS.len()],
    latency_count: u64,
    latency_sum_secs: f64,
    batches: u64,
    reloads: u64,
    test_failures: u64,
    last_reload_ms: Option<i64>,
    last_test_failure: Option<TestFailure>,
    /// Binding → time of its last ok/unchanged resolution (ms since the epoch).
    last_success_ms: HashMap<String, i64>,
    lagged: u64,
}

/// The metrics registry. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Metrics {
    c: Mutex<Counters>,
}

/// A snapshot of the nginx-related numbers (for `GET /api/v1/nginx`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct NginxNumbers {
    pub apply_batches: u64,
    pub reloads: u64,
    pub test_failures: u64,
    pub last_reload_ms: Option<i64>,
    pub last_test_failure: Option<TestFailure>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Metrics {
    /// Creates the registry, seeds each binding's last success from its stored history and
    /// starts the task that follows the engine's events.
    pub fn start(engine: &Engine) -> Arc<Metrics> {
        let metrics = Arc::new(Metrics::default());
        let mut rx = engine.subscribe();
        for b in engine.list() {
            if let Ok(d) = engine.show(&b.name) {
                if let Some(o) = d.history.iter().find(|o| o.status != OutcomeStatus::Failed) {
                    metrics.note_success(&b.name, o.at_ms + o.duration_ms as i64);
                }
            }
        }
        let m = Arc::downgrade(&metrics);
        tokio::spawn(async move {
            loop {
                let ev = rx.recv().await;
                let Some(m) = m.upgrade() else { return };
                match ev {
                    Ok(ev) => m.observe(&ev),
                    Err(RecvError::Lagged(n)) => m.lock().lagged += n,
                    Err(RecvError::Closed) => return,
                }
            }
        });
        metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.c.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_success(&self, binding: &str, at_ms: i64) {
        let mut c = self.lock();
        let e = c
            .last_success_ms
            .entry(binding.to_string())
            .or_insert(at_ms);
        *e = (*e).max(at_ms);
    }

    /// Counts one engine event.
    pub fn observe(&self, ev: &EngineEvent) {
        match ev {
            EngineEvent::Outcome { binding, outcome } => self.observe_outcome(binding, outcome),
            EngineEvent::Batch {
                reloaded,
                test_failures,
                at_ms,
                ..
            } => {
                let mut c = self.lock();
                c.batches += 1;
                c.test_failures += *test_failures as u64;
                if *reloaded {
                    c.reloads += 1;
                    c.last_reload_ms = Some(*at_ms);
                }
            }
        }
    }

    fn observe_outcome(&self, binding: &str, o: &OutcomeRecord) {
        let mut c = self.lock();
        *c.resolutions.entry(o.status.as_str()).or_default() += 1;
        let secs = o.duration_ms as f64 / 1000.0;
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *le {
                c.buckets[i] += 1;
            }
        }
        c.latency_count += 1;
        c.latency_sum_secs += secs;
        if o.status == OutcomeStatus::Failed {
            if let Some(code) = o.code {
                *c.plugin_errors.entry(code.to_string()).or_default() += 1;
            } else if o.nginx_error.is_none()
                && o.why.as_deref().is_some_and(|w| w.starts_with("plugin "))
            {
                // The plugin failed without an error answer (timeout, crash, malformed answer).
                *c.plugin_errors.entry("none".to_string()).or_default() += 1;
            }
            if let Some(e) = &o.nginx_error {
                c.last_test_failure = Some(TestFailure {
                    binding: binding.to_string(),
                    at_ms: o.at_ms,
                    nginx_error: e.clone(),
                });
            }
        } else {
            let at = o.at_ms + o.duration_ms as i64;
            let e = c.last_success_ms.entry(binding.to_string()).or_insert(at);
            *e = (*e).max(at);
        }
    }

    /// When `binding` last resolved successfully (ok or unchanged), ms since the epoch.
    pub fn last_success_ms(&self, binding: &str) -> Option<i64> {
        self.lock().last_success_ms.get(binding).copied()
    }

    /// The nginx-related numbers.
    pub fn nginx_numbers(&self) -> NginxNumbers {
        let c = self.lock();
        NginxNumbers {
            apply_batches: c.batches,
            reloads: c.reloads,
            test_failures: c.test_failures,
            last_reload_ms: c.last_reload_ms,
            last_test_failure: c.last_test_failure.clone(),
        }
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, engine: &Engine) -> String {
        let bindings = engine.list();
        let now = now_ms();
        let c = self.lock();
        let mut out = String::with_capacity(4096);
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
        };

        head(&mut out, "tributary_resolutions_total", "counter", "Resolutions by outcome (ok: file changed and applied; unchanged; failed: current file kept).");
        for status in ["ok", "unchanged", "failed"] {
            let n = c.resolutions.get(status).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "tributary_resolutions_total{{outcome=\"{status}\"}} {n}"
            );
        }

        head(&mut out, "tributary_plugin_errors_total", "counter", "Failed resolutions by the plugin's JSON-RPC error code (\"none\": no error answer, e.g. timeout or crash).");
        for (code, n) in &c.plugin_errors {
            let _ = writeln!(
                out,
                "tributary_plugin_errors_total{{code=\"{}\"}} {n}",
                label(code)
            );
        }

        head(
            &mut out,
            "tributary_resolution_duration_seconds",
            "histogram",
            "Time from plugin call to applied (or refused) file.",
        );
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "tributary_resolution_duration_seconds_bucket{{le=\"{le}\"}} {}",
                c.buckets[i]
            );
        }
        let _ = writeln!(
            out,
            "tributary_resolution_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            c.latency_count
        );
        let _ = writeln!(
            out,
            "tributary_resolution_duration_seconds_sum {}",
            c.latency_sum_secs
        );
        let _ = writeln!(
            out,
            "tributary_resolution_duration_seconds_count {}",
            c.latency_count
        );

        head(
            &mut out,
            "tributary_apply_batches_total",
            "counter",
            "Batches of changed files handed to nginx (one test, at most one reload each).",
        );
        let _ = writeln!(out, "tributary_apply_batches_total {}", c.batches);
        head(
            &mut out,
            "tributary_nginx_reloads_total",
            "counter",
            "nginx reloads after applied changes.",
        );
        let _ = writeln!(out, "tributary_nginx_reloads_total {}", c.reloads);
        head(
            &mut out,
            "tributary_nginx_test_failures_total",
            "counter",
            "Changed files refused by nginx -t (the previous file was restored).",
        );
        let _ = writeln!(
            out,
            "tributary_nginx_test_failures_total {}",
            c.test_failures
        );
        head(
            &mut out,
            "tributary_last_successful_reload_timestamp_seconds",
            "gauge",
            "Unix time of the last successful reload since the daemon started (0: none yet).",
        );
        let _ = writeln!(
            out,
            "tributary_last_successful_reload_timestamp_seconds {}",
            c.last_reload_ms.map_or(0.0, |ms| ms as f64 / 1000.0)
        );

        head(
            &mut out,
            "tributary_bindings",
            "gauge",
            "Bindings configured.",
        );
        let _ = writeln!(out, "tributary_bindings {}", bindings.len());
        head(
            &mut out,
            "tributary_binding_servers",
            "gauge",
            "Servers in the binding's file (from its last successful resolution).",
        );
        for b in &bindings {
            let _ = writeln!(
                out,
                "tributary_binding_servers{{binding=\"{}\"}} {}",
                label(&b.name),
                b.servers.len()
            );
        }
        head(
            &mut out,
            "tributary_binding_failing",
            "gauge",
            "1 when the binding's last resolution failed.",
        );
        for b in &bindings {
            let failing = b
                .last_outcome
                .as_ref()
                .is_some_and(|o| o.status == OutcomeStatus::Failed);
            let _ = writeln!(
                out,
                "tributary_binding_failing{{binding=\"{}\"}} {}",
                label(&b.name),
                u8::from(failing)
            );
        }
        head(&mut out, "tributary_binding_staleness_seconds", "gauge", "Seconds since the binding's last successful resolution (absent: never resolved successfully).");
        for b in &bindings {
            if let Some(at) = c.last_success_ms.get(&b.name) {
                let secs = (now - at).max(0) as f64 / 1000.0;
                let _ = writeln!(
                    out,
                    "tributary_binding_staleness_seconds{{binding=\"{}\"}} {secs}",
                    label(&b.name)
                );
            }
        }
        head(
            &mut out,
            "tributary_metrics_events_lost_total",
            "counter",
            "Engine events the metrics task missed because it fell behind.",
        );
        let _ = writeln!(out, "tributary_metrics_events_lost_total {}", c.lagged);
        out
    }
}

/// Escapes a label value (backslash, double quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(status: OutcomeStatus, ms: u64, code: Option<i64>) -> OutcomeRecord {
        OutcomeRecord {
            at_ms: 1_000,
            duration_ms: ms,
            status,
            failure: code.map(|_| tributary_store::Failure::PluginError),
            why: code.map(|_| "plugin \"x\": refused".to_string()),
            code,
            field: None,
            kept: vec![],
            dropped: vec![],
            ttl_seconds: None,
            changed: false,
            reloaded: false,
            nginx_error: None,
        }
    }

    #[test]
    fn counts_outcomes_codes_latency_and_batches() {
        let m = Metrics::default();
        let ev = |o| EngineEvent::Outcome {
            binding: "api".into(),
            outcome: o,
        };
        m.observe(&ev(outcome(OutcomeStatus::Ok, 3, None)));
        m.observe(&ev(outcome(OutcomeStatus::Unchanged, 40, None)));
        m.observe(&ev(outcome(OutcomeStatus::Failed, 2000, Some(-32003))));
        m.observe(&EngineEvent::Batch {
            changes: 2,
            reloaded: true,
            test_failures: 1,
            at_ms: 5_000,
        });
        let c = m.lock();
        assert_eq!(c.resolutions.get("ok"), Some(&1));
        assert_eq!(c.resolutions.get("failed"), Some(&1));
        assert_eq!(c.plugin_errors.get("-32003"), Some(&1));
        // 3 ms is under every bucket; 40 ms from 0.05 on; 2 s from 2.5 on.
        assert_eq!(c.buckets[0], 1);
        assert_eq!(c.buckets[3], 2);
        assert_eq!(c.buckets[8], 3);
        assert_eq!(c.latency_count, 3);
        assert_eq!(
            (c.reloads, c.test_failures, c.last_reload_ms),
            (1, 1, Some(5_000))
        );
        assert_eq!(c.last_success_ms.get("api"), Some(&1_040));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
