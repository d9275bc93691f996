//! `/metrics`: the text exposition (crate `prometheus-client`) of what the engine reports
//! ([`EngineEvent`]), in the format the scraper asks for ([`Format`], by `Accept`): OpenMetrics 1.0
//! (`application/openmetrics-text`, what Prometheus asks for first) or the Prometheus text format
//! 0.0.4 (`text/plain`, everyone else: curl, browsers, other scrapers). The two differ where it
//! matters to a parser: a 0.0.4 counter family is named with its `_total` (`# HELP x_total`,
//! `# TYPE x_total counter`) and the text has no `# EOF`; an OpenMetrics counter family is named
//! without it and the text ends with `# EOF`. Both come from the same registry, encoded by the crate.
//!
//! A task subscribed to the engine counts resolutions by outcome, failures by their kind (the
//! outcome's [`Failure`] tag, never its prose), plugin errors by code, the resolution latency
//! histogram, confirmed reloads, changes refused by `nginx -t`, the last successful
//! reload, and each binding's last successful resolution (for staleness). The per-binding gauges
//! are set from the engine at scrape time, so removed bindings disappear.
//!
//! Every metric is declared in one place, `Families`: add a field there and register it in
//! `Families::register`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::error::RecvError;
use tributary_store::{lock, now_ms, Applied, Failure, HostState, OutcomeRecord, OutcomeStatus};

use crate::engine::{Engine, EngineEvent};
use crate::view::BindingView;

/// Upper bounds (seconds) of the resolution latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The outcomes `tributary_resolutions_total` always shows (0 until one happens).
const OUTCOMES: [&str; 3] = ["ok", "unchanged", "failed"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabel {
    failure: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BindingLabel {
    binding: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric of `/metrics`. Counters are registered without `_total`: the encoder adds it.
#[derive(Debug, Default)]
struct Families {
    resolutions: Family<OutcomeLabel, Counter>,
    failures: Family<FailureLabel, Counter>,
    applied: Family<PathLabel, Counter>,
    plugin_errors: Family<CodeLabel, Counter>,
    latency: LatencyHistogram,
    batches: Counter,
    reloads: Counter,
    test_failures: Counter,
    last_reload_seconds: FloatGauge,
    bindings: Gauge,
    binding_servers: Family<BindingLabel, Gauge>,
    binding_failing: Family<BindingLabel, Gauge>,
    binding_staleness: Family<BindingLabel, FloatGauge>,
    events_lost: Counter,
    store_connected: Gauge,
    fleet_hosts: Family<StateLabel, Gauge>,
}

/// The latency histogram with [`LATENCY_BUCKETS`].
#[derive(Debug, Clone)]
struct LatencyHistogram(Histogram);

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram(Histogram::new(LATENCY_BUCKETS))
    }
}

impl Families {
    /// Declares every metric: name, help, kind (from the field's type).
    fn register(&self, r: &mut Registry) {
        r.register(
            "tributary_resolutions",
            "Resolutions by outcome (ok: file changed and applied; unchanged; failed: current file kept)",
            self.resolutions.clone(),
        );
        r.register(
            "tributary_resolution_failures",
            "Failed resolutions by kind (plugin_error, plugin_no_answer, no_valid_target, test_failed, reload_failed, restore_failed, write_failed, stopping)",
            self.failures.clone(),
        );
        r.register(
            "tributary_changes_applied",
            "Changes made live, by path: live (the module's upstreams API, no reload) or reload",
            self.applied.clone(),
        );
        r.register(
            "tributary_plugin_errors",
            "Failed resolutions by the plugin's JSON-RPC error code (\"none\": no error answer, e.g. timeout or crash)",
            self.plugin_errors.clone(),
        );
        r.register(
            "tributary_resolution_duration_seconds",
            "Time from plugin call to applied (or refused) file",
            self.latency.0.clone(),
        );
        r.register(
            "tributary_apply_batches",
            "Batches of changed files handed to nginx (one test, at most one reload each)",
            self.batches.clone(),
        );
        r.register(
            "tributary_nginx_reloads",
            "nginx reloads after applied changes, confirmed live (new workers only)",
            self.reloads.clone(),
        );
        r.register(
            "tributary_nginx_test_failures",
            "Changed files refused by nginx -t (the previous file was restored)",
            self.test_failures.clone(),
        );
        r.register(
            "tributary_last_successful_reload_timestamp_seconds",
            "Unix time of the last successful reload since the daemon started (0: none yet)",
            self.last_reload_seconds.clone(),
        );
        r.register(
            "tributary_bindings",
            "Bindings configured",
            self.bindings.clone(),
        );
        r.register(
            "tributary_binding_servers",
            "Servers in the binding's file (from its last successful resolution)",
            self.binding_servers.clone(),
        );
        r.register(
            "tributary_binding_failing",
            "1 when the binding's last resolution failed",
            self.binding_failing.clone(),
        );
        r.register(
            "tributary_binding_staleness_seconds",
            "Seconds since the binding's last successful resolution (absent: never resolved successfully)",
            self.binding_staleness.clone(),
        );
        r.register(
            "tributary_store_connected",
            "1 while the binding store (sqlite, or etcd for a fleet) answers; 0: this host serves its last applied servers and catches up when it answers again",
            self.store_connected.clone(),
        );
        r.register(
            "tributary_fleet_host_states",
            "Hosts per state (applied, failed, stale) summed over every binding's fleet view, as this host sees it",
            self.fleet_hosts.clone(),
        );
        r.register(
            "tributary_metrics_events_lost",
            "Engine events the metrics task missed because it fell behind",
            self.events_lost.clone(),
        );
    }
}

/// The two text formats `/metrics` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The Prometheus text format, version 0.0.4.
    Prometheus,
}

impl Format {
    /// The format for a request's `Accept` values: OpenMetrics when `application/openmetrics-text`
    /// is accepted (q > 0) at least as much as `text/plain`; else (no `Accept`, `*/*`, `text/plain`)
    /// the Prometheus text format.
    pub fn from_accept<'a>(accept: impl IntoIterator<Item = &'a str>) -> Format {
        let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.into_iter().flat_map(|v| v.split(',')) {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(0.0));
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The `Content-Type` of the format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The last change refused by `nginx -t` (for the nginx status endpoint and page).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TestFailure {
    pub binding: String,
    pub at_ms: i64,
    pub nginx_error: String,
}

/// What the JSON endpoints and the UI read besides the counters.
#[derive(Debug, Default)]
struct State {
    last_reload_ms: Option<i64>,
    last_test_failure: Option<TestFailure>,
    /// Binding → time of its last ok/unchanged resolution (ms since the epoch).
    last_success_ms: HashMap<String, i64>,
}

/// The metrics registry. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    families: Families,
    registry: Registry,
    state: Mutex<State>,
    /// One scrape at a time (the per-binding gauges are reset and set at each scrape).
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        let families = Families::default();
        let mut registry = Registry::default();
        families.register(&mut registry);
        for outcome in OUTCOMES {
            let _ = families
                .resolutions
                .get_or_create(&OutcomeLabel { outcome });
        }
        for path in [Applied::Live, Applied::Reload] {
            let _ = families.applied.get_or_create(&PathLabel {
                path: path.as_str(),
            });
        }
        for kind in Failure::ALL {
            let _ = families.failures.get_or_create(&FailureLabel {
                failure: kind.as_str(),
            });
        }
        Metrics {
            families,
            registry,
            state: Mutex::new(State::default()),
            scrape: Mutex::new(()),
        }
    }
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
                    Err(RecvError::Lagged(n)) => {
                        m.families.events_lost.inc_by(n);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        metrics
    }

    fn note_success(&self, binding: &str, at_ms: i64) {
        let mut c = lock(&self.state);
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
                let f = &self.families;
                f.batches.inc();
                f.test_failures.inc_by(*test_failures as u64);
                if *reloaded {
                    f.reloads.inc();
                    f.last_reload_seconds.set(*at_ms as f64 / 1000.0);
                    lock(&self.state).last_reload_ms = Some(*at_ms);
                }
            }
        }
    }

    fn observe_outcome(&self, binding: &str, o: &OutcomeRecord) {
        let f = &self.families;
        f.resolutions
            .get_or_create(&OutcomeLabel {
                outcome: o.status.as_str(),
            })
            .inc();
        f.latency.0.observe(o.duration_ms as f64 / 1000.0);
        if let Some(path) = o.applied {
            f.applied
                .get_or_create(&PathLabel {
                    path: path.as_str(),
                })
                .inc();
        }
        if o.status == OutcomeStatus::Failed {
            if let Some(kind) = o.failure {
                f.failures
                    .get_or_create(&FailureLabel {
                        failure: kind.as_str(),
                    })
                    .inc();
            }
            let code = match o.failure {
                Some(Failure::PluginError) => Some(
                    o.code
                        .map_or_else(|| "unknown".to_string(), |c| c.to_string()),
                ),
                // The plugin failed without an error answer (timeout, crash, malformed answer).
                Some(Failure::PluginNoAnswer) => Some("none".to_string()),
                _ => None,
            };
            if let Some(code) = code {
                f.plugin_errors.get_or_create(&CodeLabel { code }).inc();
            }
            if let Some(e) = &o.nginx_error {
                lock(&self.state).last_test_failure = Some(TestFailure {
                    binding: binding.to_string(),
                    at_ms: o.at_ms,
                    nginx_error: e.clone(),
                });
            }
        } else {
            self.note_success(binding, o.at_ms + o.duration_ms as i64);
        }
    }

    /// When `binding` last resolved successfully (ok or unchanged), ms since the epoch.
    pub fn last_success_ms(&self, binding: &str) -> Option<i64> {
        lock(&self.state).last_success_ms.get(binding).copied()
    }

    /// The nginx-related numbers.
    pub fn nginx_numbers(&self) -> NginxNumbers {
        let f = &self.families;
        let st = lock(&self.state);
        NginxNumbers {
            apply_batches: f.batches.get(),
            reloads: f.reloads.get(),
            test_failures: f.test_failures.get(),
            last_reload_ms: st.last_reload_ms,
            last_test_failure: st.last_test_failure.clone(),
        }
    }

    /// The text exposition in `format`, with the per-binding gauges of the engine's bindings now.
    pub fn render(&self, engine: &Engine, format: Format) -> String {
        self.families
            .store_connected
            .set(i64::from(engine.store_status().connected));
        self.encode(&engine.list(), now_ms(), format)
    }

    /// The text exposition in `format` with the per-binding gauges of `bindings` at time `now`.
    fn encode(&self, bindings: &[BindingView], now: i64, format: Format) -> String {
        let _one = lock(&self.scrape);
        let f = &self.families;
        f.bindings.set(bindings.len() as i64);
        f.binding_servers.clear();
        f.binding_failing.clear();
        f.binding_staleness.clear();
        let mut states = [0i64; 3];
        for h in bindings.iter().flat_map(|b| &b.fleet.hosts) {
            states[match h.state {
                HostState::Applied => 0,
                HostState::Failed => 1,
                HostState::Stale => 2,
            }] += 1;
        }
        for (state, n) in [HostState::Applied, HostState::Failed, HostState::Stale]
            .iter()
            .zip(states)
        {
            f.fleet_hosts
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(n);
        }
        {
            let st = lock(&self.state);
            for b in bindings {
                let label = BindingLabel {
                    binding: b.name.clone(),
                };
                f.binding_servers
                    .get_or_create(&label)
                    .set(b.servers.len() as i64);
                let failing = b
                    .last_outcome
                    .as_ref()
                    .is_some_and(|o| o.status == OutcomeStatus::Failed);
                f.binding_failing
                    .get_or_create(&label)
                    .set(i64::from(failing));
                if let Some(at) = st.last_success_ms.get(&b.name) {
                    f.binding_staleness
                        .get_or_create(&label)
                        .set((now - at).max(0) as f64 / 1000.0);
                }
            }
        }
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
        };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(status: OutcomeStatus, ms: u64, code: Option<i64>) -> OutcomeRecord {
        OutcomeRecord {
            duration_ms: ms,
            failure: code.map(|_| Failure::PluginError),
            why: code.map(|_| "plugin \"x\": refused".to_string()),
            code,
            ..OutcomeRecord::new(1_000, status)
        }
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    }

    fn binding(name: &str, servers: usize, last: Option<OutcomeStatus>) -> BindingView {
        BindingView {
            name: name.into(),
            plugin: "p".into(),
            provider: "r".into(),
            service: "s".into(),
            interval_secs: 60,
            directives: vec![],
            config: Default::default(),
            secrets: Default::default(),
            include_line: String::new(),
            file: String::new(),
            last_outcome: last.map(|s| outcome(s, 1, None)),
            servers: vec![serde_json::json!({}); servers],
            next_refresh_ms: None,
            consecutive_failures: 0,
            fleet: Default::default(),
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
        let t = m.encode(&[], 10_000, Format::OpenMetrics);
        assert_eq!(
            value(&t, "tributary_resolutions_total{outcome=\"ok\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "tributary_resolutions_total{outcome=\"failed\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "tributary_resolutions_total{outcome=\"unchanged\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "tributary_plugin_errors_total{code=\"-32003\"}"),
            1.0
        );
        // 3 ms is under every bucket; 40 ms from 0.05 on; 2 s from 2.5 on.
        let bucket = |le: &str| {
            value(
                &t,
                &format!("tributary_resolution_duration_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(bucket("0.005"), 1.0);
        assert_eq!(bucket("0.05"), 2.0);
        assert_eq!(bucket("2.5"), 3.0);
        assert_eq!(bucket("+Inf"), 3.0);
        assert_eq!(
            value(&t, "tributary_resolution_duration_seconds_count"),
            3.0
        );
        assert_eq!(
            value(&t, "tributary_resolution_duration_seconds_sum"),
            2.043
        );
        assert_eq!(value(&t, "tributary_apply_batches_total"), 1.0);
        assert_eq!(value(&t, "tributary_nginx_reloads_total"), 1.0);
        assert_eq!(value(&t, "tributary_nginx_test_failures_total"), 1.0);
        assert_eq!(
            value(&t, "tributary_last_successful_reload_timestamp_seconds"),
            5.0
        );
        assert_eq!(value(&t, "tributary_metrics_events_lost_total"), 0.0);
        assert_eq!(m.last_success_ms("api"), Some(1_040));
        let n = m.nginx_numbers();
        assert_eq!(
            (
                n.apply_batches,
                n.reloads,
                n.test_failures,
                n.last_reload_ms
            ),
            (1, 1, 1, Some(5_000))
        );
        // Every family is declared with its kind.
        for (name, kind) in [
            ("tributary_resolutions", "counter"),
            ("tributary_resolution_duration_seconds", "histogram"),
            ("tributary_bindings", "gauge"),
        ] {
            assert!(t.contains(&format!("# TYPE {name} {kind}\n")), "{t}");
        }
        assert!(t.ends_with("# EOF\n"), "{t}");
        assert!(
            t.contains("# HELP tributary_bindings Bindings configured.\n"),
            "{t}"
        );
    }

    #[test]
    fn failures_are_counted_by_their_kind_tag_not_their_words() {
        let m = Metrics::default();
        let failed = |kind: Option<Failure>, why: &str| EngineEvent::Outcome {
            binding: "api".into(),
            outcome: OutcomeRecord {
                failure: kind,
                why: Some(why.into()),
                ..outcome(OutcomeStatus::Failed, 1, None)
            },
        };
        // The words do not matter: a "plugin ..." text on a reload failure is a reload failure.
        m.observe(&failed(Some(Failure::ReloadFailed), "plugin-like words"));
        m.observe(&failed(Some(Failure::ReloadFailed), "anything"));
        m.observe(&failed(
            Some(Failure::PluginNoAnswer),
            "no answer within 2 s",
        ));
        m.observe(&failed(
            Some(Failure::NoValidTarget),
            "plugin \"x\" said nothing",
        ));
        let t = m.encode(&[], 0, Format::Prometheus);
        let kind = |k: &str| {
            value(
                &t,
                &format!("tributary_resolution_failures_total{{failure=\"{k}\"}}"),
            )
        };
        assert_eq!(kind("reload_failed"), 2.0);
        assert_eq!(kind("plugin_no_answer"), 1.0);
        assert_eq!(kind("no_valid_target"), 1.0);
        // Every kind is listed, also at zero.
        for k in Failure::ALL {
            let _ = kind(k.as_str());
        }
        assert_eq!(kind("test_failed"), 0.0);
        assert_eq!(
            value(&t, "tributary_plugin_errors_total{code=\"none\"}"),
            1.0
        );
        assert!(!t.contains("code=\"-"), "no plugin error code: {t}");
    }

    #[test]
    fn fleet_host_states_are_summed_over_the_bindings() {
        let m = Metrics::default();
        let host = |state| crate::view::FleetHostView {
            host: "h".into(),
            state,
            alive: true,
            at_ms: 0,
            generation: 1,
            servers: 1,
            message: None,
        };
        let mut a = binding("a", 1, None);
        a.fleet.hosts = vec![host(HostState::Applied), host(HostState::Failed)];
        let mut b = binding("b", 1, None);
        b.fleet.hosts = vec![host(HostState::Applied), host(HostState::Stale)];
        let t = m.encode(&[a, b], 0, Format::Prometheus);
        let n = |s: &str| value(&t, &format!("tributary_fleet_host_states{{state=\"{s}\"}}"));
        assert_eq!((n("applied"), n("failed"), n("stale")), (2.0, 1.0, 1.0));
        assert!(t.contains("tributary_store_connected"), "{t}");
    }

    #[test]
    fn per_binding_gauges_follow_the_bindings_at_scrape_time() {
        let m = Metrics::default();
        m.observe(&EngineEvent::Outcome {
            binding: "web".into(),
            outcome: outcome(OutcomeStatus::Ok, 0, None),
        });
        let t = m.encode(
            &[
                binding("web", 2, Some(OutcomeStatus::Failed)),
                binding("new\"x", 0, None),
            ],
            4_000,
            Format::Prometheus,
        );
        assert_eq!(value(&t, "tributary_bindings"), 2.0);
        assert!(
            t.contains("# TYPE tributary_binding_staleness_seconds gauge\n"),
            "{t}"
        );
        assert_eq!(value(&t, "tributary_binding_servers{binding=\"web\"}"), 2.0);
        assert_eq!(value(&t, "tributary_binding_failing{binding=\"web\"}"), 1.0);
        assert_eq!(
            value(&t, "tributary_binding_staleness_seconds{binding=\"web\"}"),
            3.0
        );
        // Label values are escaped; a binding never resolved has no staleness.
        assert_eq!(
            value(&t, "tributary_binding_failing{binding=\"new\\\"x\"}"),
            0.0
        );
        assert!(
            !t.contains("tributary_binding_staleness_seconds{binding=\"new"),
            "{t}"
        );
        // A removed binding disappears at the next scrape.
        let t = m.encode(&[], 4_000, Format::Prometheus);
        assert_eq!(value(&t, "tributary_bindings"), 0.0);
        assert!(!t.contains("binding=\"web\""), "{t}");
    }

    #[test]
    fn the_accept_header_chooses_the_format() {
        let f = |accept: &[&str]| Format::from_accept(accept.iter().copied());
        // What Prometheus sends.
        assert_eq!(
            f(&["application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"]),
            Format::OpenMetrics
        );
        assert_eq!(f(&["Application/OpenMetrics-Text"]), Format::OpenMetrics);
        assert_eq!(
            f(&["text/plain", "application/openmetrics-text"]),
            Format::OpenMetrics
        );
        // curl, a browser, a 0.0.4 scraper, or a client that prefers text/plain.
        assert_eq!(f(&[]), Format::Prometheus);
        assert_eq!(f(&["*/*"]), Format::Prometheus);
        assert_eq!(
            f(&["text/html,application/xhtml+xml,*/*;q=0.8"]),
            Format::Prometheus
        );
        assert_eq!(f(&["text/plain;version=0.0.4"]), Format::Prometheus);
        assert_eq!(
            f(&["application/openmetrics-text;q=0.4, text/plain;q=0.9"]),
            Format::Prometheus
        );
        assert_eq!(f(&["application/openmetrics-text;q=0"]), Format::Prometheus);
        assert_eq!(
            f(&["application/openmetrics-text;q=oops"]),
            Format::Prometheus
        );
    }

    #[test]
    fn each_format_names_counter_families_its_own_way() {
        let m = Metrics::default();
        m.observe(&EngineEvent::Outcome {
            binding: "api".into(),
            outcome: outcome(OutcomeStatus::Ok, 3, None),
        });
        let om = m.encode(&[], 0, Format::OpenMetrics);
        let text = m.encode(&[], 0, Format::Prometheus);
        // The samples are the same; the family names and the end are not.
        for t in [&om, &text] {
            assert_eq!(value(t, "tributary_resolutions_total{outcome=\"ok\"}"), 1.0);
        }
        assert!(
            om.contains("# TYPE tributary_resolutions counter\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(
            text.contains("# HELP tributary_resolutions_total "),
            "{text}"
        );
        assert!(
            text.contains("# TYPE tributary_resolutions_total counter\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        // Every sample of the 0.0.4 text belongs to a family declared before it (its name, or a
        // histogram's name plus _bucket/_sum/_count).
        let mut declared = Vec::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                assert!(
                    declared.iter().any(|d| name == d
                        || ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name == format!("{d}{s}"))),
                    "{name} has no # TYPE before it:\n{text}"
                );
            }
        }
    }
}
