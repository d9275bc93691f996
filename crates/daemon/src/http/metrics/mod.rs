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
//! In live mode each server's live state (active connections, fails, down, drain, probe health,
//! and its statistics when the module keeps them) is read from the module's upstreams API through a cache ([`LiveCache`]: at most one read per
//! binding per 5 s, shared by concurrent scrapes, at most ~1 s per scrape).
//!
//! Files: `mod.rs` the registry, the event task and the `/metrics` route; `families.rs` every
//! metric (declared in one place, `Families`); `format.rs` the two text formats; `live.rs` the
//! per-server gauges of the live state; `server_stats.rs` the per-server statistics the module
//! counts (requests, responses by class, fails, bytes, response times, probes); `reloads.rs` the
//! changes applied by a reload, by reason; `fleet.rs` the fleet's series (set age, resolver,
//! hosts behind), declared there.

mod families;
mod fleet;
mod format;
mod live;
mod reloads;
mod server_stats;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State as AxumState;
use axum::http::{header, HeaderMap};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::error::RecvError;
use tributary_store::{lock, now_ms, Applied, Failure, HostState, OutcomeRecord, OutcomeStatus};

use crate::engine::{Engine, EngineEvent};
use crate::http::auth::require_bearer_or_session;
use crate::http::AppState;
use crate::live_state::LiveCache;
use crate::live_state::LiveState;
use crate::view::{BindingView, NginxNumbers, TestFailure};
pub use families::LATENCY_BUCKETS;
use families::{
    BindingLabel, CodeLabel, FailureLabel, Families, OutcomeLabel, PathLabel, StateLabel, OUTCOMES,
};
pub use format::Format;

/// `GET /metrics`: the bearer token or a UI session.
pub fn router(st: AppState) -> Router {
    Router::new()
        .route("/metrics", get(serve))
        .layer(middleware::from_fn_with_state(
            st.clone(),
            require_bearer_or_session,
        ))
        .with_state(st)
}

/// `/metrics`: the format the scraper asks for in `Accept` ([`Format`]).
/// In live mode the servers' live state comes from [`LiveCache`] (read at most once per
/// [`crate::live_state::LIVE_TTL`] whatever the scrape rate, at most ~1 s per scrape).
async fn serve(AxumState(st): AxumState<AppState>, headers: HeaderMap) -> Response {
    let format = Format::from_accept(
        headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    // No read of the other hosts' outcomes here: the fleet series come from what this host
    // watches and its own outcomes (`fleet.rs`), so a scrape costs etcd nothing.
    let bindings = st.engine.list();
    let live = match crate::http::live_api_of(&st.engine) {
        Some(api) => {
            let names: Vec<String> = bindings.iter().map(|b| b.name.clone()).collect();
            Some(st.metrics.live.get(api, &names).await)
        }
        None => None,
    };
    (
        [(header::CONTENT_TYPE, format.content_type())],
        st.metrics
            .render(&st.engine, &bindings, live.as_deref(), format),
    )
        .into_response()
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
    /// The fleet's series (`fleet.rs`).
    fleet: fleet::FleetFamilies,
    registry: Registry,
    state: Mutex<State>,
    /// One scrape at a time (the per-binding gauges are reset and set at each scrape).
    scrape: Mutex<()>,
    /// The servers' live state, read at most once per TTL.
    live: LiveCache,
    /// Changes applied by a reload, by reason.
    reload_reasons: reloads::ReloadReasons,
}

impl Default for Metrics {
    fn default() -> Self {
        let families = Families::default();
        let mut registry = Registry::default();
        families.register(&mut registry);
        let reload_reasons = reloads::ReloadReasons::register(&mut registry);
        let fleet = fleet::FleetFamilies::default();
        fleet.register(&mut registry);
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
            fleet,
            registry,
            state: Mutex::new(State::default()),
            scrape: Mutex::new(()),
            live: LiveCache::default(),
            reload_reasons,
        }
    }
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
        self.reload_reasons.observe(o);
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

    /// The text exposition in `format`, with the per-binding gauges of `bindings` (the engine's
    /// now, listed by the caller) and, when given, the servers' `live` state.
    fn render(
        &self,
        engine: &Engine,
        bindings: &[BindingView],
        live: Option<&HashMap<String, LiveState>>,
        format: Format,
    ) -> String {
        let store = engine.store_status();
        self.families
            .store_connected
            .set(i64::from(store.connected));
        self.families
            .store_refused_values
            .set(engine.store_refused_values() as i64);
        let now = now_ms();
        let fleet = (store.kind != "sqlite").then(|| engine.fleet_summary(bindings, now));
        self.encode_with(bindings, live, fleet.as_ref(), now, format)
    }

    /// The text exposition in `format` with the per-binding gauges of `bindings` at time `now`,
    /// and per server the gauges of `live` (by binding name) when given.
    #[cfg(test)]
    fn encode(
        &self,
        bindings: &[BindingView],
        live: Option<&HashMap<String, LiveState>>,
        now: i64,
        format: Format,
    ) -> String {
        self.encode_with(bindings, live, None, now, format)
    }

    /// [`Metrics::encode`] with the fleet's series of `fleet` (`None`: no fleet).
    fn encode_with(
        &self,
        bindings: &[BindingView],
        live: Option<&HashMap<String, LiveState>>,
        fleet: Option<&crate::view::FleetHosts>,
        now: i64,
        format: Format,
    ) -> String {
        let _one = lock(&self.scrape);
        self.fleet.set(fleet);
        let f = &self.families;
        f.bindings.set(bindings.len() as i64);
        f.binding_servers.clear();
        f.binding_failing.clear();
        f.binding_staleness.clear();
        live::set(f, live);
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
