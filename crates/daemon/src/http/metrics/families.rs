//! Every metric of `/metrics`, declared in one place ([`Families`]): add a field there and
//! register it in [`Families::register`]; and their label sets.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the resolution latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The outcomes `tributary_resolutions_total` always shows (0 until one happens).
pub(super) const OUTCOMES: [&str; 3] = ["ok", "unchanged", "failed"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailureLabel {
    pub(super) failure: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PathLabel {
    pub(super) path: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CodeLabel {
    pub(super) code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabel {
    pub(super) state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BindingLabel {
    pub(super) binding: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ServerLabel {
    pub(super) binding: String,
    pub(super) server: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HealthLabel {
    pub(super) binding: String,
    pub(super) server: String,
    pub(super) state: &'static str,
}

/// The states `tributary_server_health` lists for a probed server (1 for its state, 0 for the
/// others).
pub(super) const HEALTH_STATES: [&str; 3] = ["healthy", "unhealthy", "checking"];

pub(super) type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric of `/metrics`. Counters are registered without `_total`: the encoder adds it.
#[derive(Debug, Default)]
pub(super) struct Families {
    pub(super) resolutions: Family<OutcomeLabel, Counter>,
    pub(super) failures: Family<FailureLabel, Counter>,
    pub(super) applied: Family<PathLabel, Counter>,
    pub(super) plugin_errors: Family<CodeLabel, Counter>,
    pub(super) latency: LatencyHistogram,
    pub(super) batches: Counter,
    pub(super) reloads: Counter,
    pub(super) test_failures: Counter,
    pub(super) last_reload_seconds: FloatGauge,
    pub(super) bindings: Gauge,
    pub(super) binding_servers: Family<BindingLabel, Gauge>,
    pub(super) binding_failing: Family<BindingLabel, Gauge>,
    pub(super) binding_staleness: Family<BindingLabel, FloatGauge>,
    pub(super) events_lost: Counter,
    pub(super) store_connected: Gauge,
    pub(super) store_refused_values: Gauge,
    pub(super) fleet_hosts: Family<StateLabel, Gauge>,
    pub(super) live_up: Family<BindingLabel, Gauge>,
    pub(super) server_active: Family<ServerLabel, Gauge>,
    pub(super) server_fails: Family<ServerLabel, Gauge>,
    pub(super) server_down: Family<ServerLabel, Gauge>,
    pub(super) server_draining: Family<ServerLabel, Gauge>,
    pub(super) server_health: Family<HealthLabel, Gauge>,
    pub(super) server_slow_start: Family<ServerLabel, FloatGauge>,
    /// The per-server statistics, declared in `server_stats.rs`.
    pub(super) server_stats: super::server_stats::StatsFamilies,
}

/// The latency histogram with [`LATENCY_BUCKETS`].
#[derive(Debug, Clone)]
pub(super) struct LatencyHistogram(pub(super) Histogram);

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram(Histogram::new(LATENCY_BUCKETS))
    }
}

impl Families {
    /// Declares every metric: name, help, kind (from the field's type).
    pub(super) fn register(&self, r: &mut Registry) {
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
            "tributary_store_refused_values",
            "Values from the store (etcd target sets and binding values) this host refused since it started: a MAC that did not verify, or none where the fleet requires one (docs/fleet.md, Integrity); a rise means someone wrote the prefix without the key",
            self.store_refused_values.clone(),
        );
        r.register(
            "tributary_fleet_host_states",
            "Hosts per state (applied, failed, stale) summed over every binding's fleet view, as this host sees it",
            self.fleet_hosts.clone(),
        );
        r.register(
            "tributary_binding_live_up",
            "1 when the binding's live state could be read from the module's upstreams API at this scrape (live mode only; read at most every 5 s)",
            self.live_up.clone(),
        );
        r.register(
            "tributary_server_active_connections",
            "Connections in use to the server now, over all nginx workers (module's live API)",
            self.server_active.clone(),
        );
        r.register(
            "tributary_server_fails",
            "Failures nginx counts for the server in its current fail_timeout window (module's live API)",
            self.server_fails.clone(),
        );
        r.register(
            "tributary_server_down",
            "1 when the server is marked down in nginx's live set",
            self.server_down.clone(),
        );
        r.register(
            "tributary_server_draining",
            "1 while the server is drained: no new requests, those in flight finish (absent: the module does not report drain)",
            self.server_draining.clone(),
        );
        r.register(
            "tributary_server_health",
            "The server's probe state: 1 for its state (healthy, unhealthy, checking), 0 for the others (absent: no probe in the upstream)",
            self.server_health.clone(),
        );
        r.register(
            "tributary_server_slow_start_remaining_seconds",
            "Time left of the server's slow start ramp (0: not ramping; absent: no slow_start)",
            self.server_slow_start.clone(),
        );
        self.server_stats.register(r);
        r.register(
            "tributary_metrics_events_lost",
            "Engine events the metrics task missed because it fell behind",
            self.events_lost.clone(),
        );
    }
}
