//! The per-server statistics of `/metrics`: what the module counts for each server of
//! a live upstream (`"stats"` of `GET <loc>/NAME`, [`ServerStats`]), labelled `binding` and
//! `server` (its address). The module's counters are the source: each scrape sets every series to
//! the module's value, so they are counters in Prometheus's sense (they only grow, and start over
//! when nginx reloads or a server leaves the set and comes back, which `rate()` takes as a reset).
//! Times: the module's milliseconds as seconds.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::families::{FloatGauge, ServerLabel};
use crate::live_state::{LiveState, ServerStats};

/// A server's responses of one status class.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClassLabel {
    pub(super) binding: String,
    pub(super) server: String,
    /// `1xx` ... `5xx`, as NGINX Plus and its exporter name them.
    pub(super) code: &'static str,
}

type FloatCounter = Counter<f64, AtomicU64>;

/// The families of the per-server statistics (counters registered without `_total`: the encoder
/// adds it).
#[derive(Debug, Default)]
pub(super) struct StatsFamilies {
    requests: Family<ServerLabel, Counter>,
    responses: Family<ClassLabel, Counter>,
    failures: Family<ServerLabel, Counter>,
    unavailable: Family<ServerLabel, Counter>,
    sent: Family<ServerLabel, Counter>,
    received: Family<ServerLabel, Counter>,
    downtime: Family<ServerLabel, FloatCounter>,
    header_time: Family<ServerLabel, FloatGauge>,
    response_time: Family<ServerLabel, FloatGauge>,
    health_checks: Family<ServerLabel, Counter>,
    health_check_failures: Family<ServerLabel, Counter>,
    unhealthy: Family<ServerLabel, Counter>,
}

impl StatsFamilies {
    /// Declares every family: name, help, kind.
    pub(super) fn register(&self, r: &mut Registry) {
        let from = "(module's per-server statistics; from 0 at each nginx reload and when the server joins the set)";
        r.register(
            "tributary_server_requests",
            format!("Requests sent to the server, each try counted once {from}"),
            self.requests.clone(),
        );
        r.register(
            "tributary_server_responses",
            format!("Responses received from the server by status class (code: 1xx..5xx) {from}"),
            self.responses.clone(),
        );
        r.register(
            "tributary_server_failures",
            format!("Unsuccessful tries to the server (what nginx counts toward max_fails) {from}"),
            self.failures.clone(),
        );
        r.register(
            "tributary_server_unavailable",
            format!(
                "Times the server became unavailable because its fails reached max_fails {from}"
            ),
            self.unavailable.clone(),
        );
        r.register(
            "tributary_server_sent_bytes",
            format!("Bytes sent to the server {from}"),
            self.sent.clone(),
        );
        r.register(
            "tributary_server_received_bytes",
            format!("Bytes received from the server {from}"),
            self.received.clone(),
        );
        r.register(
            "tributary_server_downtime_seconds",
            format!("Time the server spent unavailable or unhealthy, not counting a current spell {from}"),
            self.downtime.clone(),
        );
        r.register(
            "tributary_server_header_time_seconds",
            "Mean time from the start of a try to the response header, over every response of the server since it joined the set (module's per-server statistics)",
            self.header_time.clone(),
        );
        r.register(
            "tributary_server_response_time_seconds",
            "Mean time from the start of a try to the end of the response, over every response of the server since it joined the set (module's per-server statistics)",
            self.response_time.clone(),
        );
        r.register(
            "tributary_server_health_checks",
            format!("Probes made to the server (absent without a probe in the upstream) {from}"),
            self.health_checks.clone(),
        );
        r.register(
            "tributary_server_health_check_failures",
            format!("Probes of the server that failed (absent without a probe) {from}"),
            self.health_check_failures.clone(),
        );
        r.register(
            "tributary_server_unhealthy",
            format!(
                "Times the server went from healthy to unhealthy (absent without a probe) {from}"
            ),
            self.unhealthy.clone(),
        );
    }

    /// Clears every family and sets them from `live` (by binding name): the servers whose module
    /// gave `stats` (none for an older module, a binding not read, or no live mode).
    pub(super) fn set(&self, live: Option<&HashMap<String, LiveState>>) {
        self.requests.clear();
        self.responses.clear();
        self.failures.clear();
        self.unavailable.clear();
        self.sent.clear();
        self.received.clear();
        self.downtime.clear();
        self.header_time.clear();
        self.response_time.clear();
        self.health_checks.clear();
        self.health_check_failures.clear();
        self.unhealthy.clear();
        for (binding, state) in live.into_iter().flatten() {
            for s in &state.servers {
                if let Some(stats) = &s.stats {
                    self.set_server(binding, &s.address, stats);
                }
            }
        }
    }

    /// One server's series. A counter just cleared is 0, so adding the module's value sets it.
    /// (The live API refuses an address listed twice in a set, so an address names one server;
    /// should two ever share one, their counters would add up and the times be the last one's.)
    fn set_server(&self, binding: &str, server: &str, st: &ServerStats) {
        let label = ServerLabel {
            binding: binding.to_string(),
            server: server.to_string(),
        };
        self.requests.get_or_create(&label).inc_by(st.requests);
        let r = &st.responses;
        for (code, n) in [
            ("1xx", r.c1xx),
            ("2xx", r.c2xx),
            ("3xx", r.c3xx),
            ("4xx", r.c4xx),
            ("5xx", r.c5xx),
        ] {
            self.responses
                .get_or_create(&ClassLabel {
                    binding: binding.to_string(),
                    server: server.to_string(),
                    code,
                })
                .inc_by(n);
        }
        self.failures.get_or_create(&label).inc_by(st.fails);
        self.unavailable.get_or_create(&label).inc_by(st.unavail);
        self.sent.get_or_create(&label).inc_by(st.sent);
        self.received.get_or_create(&label).inc_by(st.received);
        self.downtime
            .get_or_create(&label)
            .inc_by(seconds(st.downtime));
        self.header_time
            .get_or_create(&label)
            .set(seconds(st.header_time));
        self.response_time
            .get_or_create(&label)
            .set(seconds(st.response_time));
        if let Some(h) = &st.health_checks {
            self.health_checks.get_or_create(&label).inc_by(h.checks);
            self.health_check_failures
                .get_or_create(&label)
                .inc_by(h.fails);
            self.unhealthy.get_or_create(&label).inc_by(h.unhealthy);
        }
    }
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::super::live::tests::{promtool, scrape, state, value};
    use super::super::{Format, Metrics};
    use crate::live_state::fixtures::{
        OLD_JSON, PROBED_JSON, RECORDED_JSON, RECORDED_PROBED_JSON, STATS_JSON,
    };

    fn series(name: &str, server: &str) -> String {
        format!("{name}{{binding=\"web\",server=\"{server}\"}}")
    }

    /// A module with statistics: each counter per server at the module's value,
    /// responses by class, times in seconds, probe counters only where the module gave them;
    /// promtool-clean.
    #[test]
    fn each_servers_statistics_are_series_labelled_binding_and_server() {
        let t = scrape(&[("web", state(STATS_JSON))]);
        let g = |name: &str, server: &str| value(&t, &series(name, server));
        let one = "10.0.0.1:80";
        assert_eq!(g("tributary_server_requests_total", one), Some(12.0), "{t}");
        let class = |server: &str, code: &str| {
            value(
                &t,
                &format!(
                    "tributary_server_responses_total{{binding=\"web\",server=\"{server}\",code=\"{code}\"}}"
                ),
            )
        };
        assert_eq!(class(one, "2xx"), Some(10.0), "{t}");
        assert_eq!(class(one, "3xx"), Some(1.0), "{t}");
        assert_eq!(class(one, "5xx"), Some(1.0), "{t}");
        assert_eq!(class(one, "1xx"), Some(0.0), "{t}");
        assert_eq!(class(one, "4xx"), Some(0.0), "{t}");
        assert_eq!(g("tributary_server_sent_bytes_total", one), Some(1800.0));
        assert_eq!(
            g("tributary_server_received_bytes_total", one),
            Some(5400.0)
        );
        assert_eq!(g("tributary_server_header_time_seconds", one), Some(0.003));
        assert_eq!(
            g("tributary_server_response_time_seconds", one),
            Some(0.025)
        );
        assert_eq!(g("tributary_server_health_checks_total", one), Some(5.0));
        let two = "10.0.0.2:80";
        assert_eq!(g("tributary_server_failures_total", two), Some(4.0), "{t}");
        assert_eq!(g("tributary_server_unavailable_total", two), Some(2.0));
        assert_eq!(
            g("tributary_server_downtime_seconds_total", two),
            Some(20.0)
        );
        assert_eq!(
            g("tributary_server_health_check_failures_total", two),
            Some(6.0)
        );
        assert_eq!(g("tributary_server_unhealthy_total", two), Some(1.0));
        // The window's fails (nginx's `fails`) stay their own gauge.
        assert_eq!(g("tributary_server_fails", two), Some(1.0));
        let three = "10.0.0.3:80";
        assert_eq!(g("tributary_server_requests_total", three), Some(0.0));
        assert_eq!(class(three, "5xx"), Some(0.0));
        let complaints = promtool(&t);
        assert_eq!(complaints, "", "promtool check metrics:\n{complaints}\n{t}");
    }

    /// Answers recorded from the real module: the counts as series, promtool-clean, in both
    /// formats' samples.
    #[test]
    fn answers_recorded_from_the_module_give_promtool_clean_series() {
        let t = scrape(&[
            ("web", state(RECORDED_JSON)),
            ("probed", state(RECORDED_PROBED_JSON)),
        ]);
        let g = |name: &str, server: &str| value(&t, &series(name, server));
        assert_eq!(
            g("tributary_server_requests_total", "127.0.0.1:39549"),
            Some(30.0)
        );
        assert_eq!(
            g("tributary_server_failures_total", "127.0.0.1:33969"),
            Some(1.0)
        );
        assert_eq!(
            g("tributary_server_unavailable_total", "127.0.0.1:33969"),
            Some(1.0)
        );
        assert_eq!(
            g("tributary_server_response_time_seconds", "127.0.0.1:41159"),
            Some(0.026)
        );
        assert_eq!(
            value(
                &t,
                "tributary_server_health_check_failures_total{binding=\"probed\",server=\"127.0.0.1:44617\"}"
            ),
            Some(1.0),
            "{t}"
        );
        let complaints = promtool(&t);
        assert_eq!(complaints, "", "promtool check metrics:\n{complaints}\n{t}");
    }

    /// A module before no statistics series at all (not zeros); the issue-21 gauges
    /// are still there.
    #[test]
    fn a_module_without_statistics_gives_no_statistics_series() {
        let t = scrape(&[("web", state(PROBED_JSON)), ("old", state(OLD_JSON))]);
        for absent in [
            "tributary_server_requests_total{",
            "tributary_server_responses_total{",
            "tributary_server_failures_total{",
            "tributary_server_response_time_seconds{",
            "tributary_server_health_checks_total{",
        ] {
            assert!(!t.contains(absent), "{absent}\n{t}");
        }
        assert_eq!(
            value(
                &t,
                &series("tributary_server_active_connections", "10.0.0.4:80")
            ),
            Some(7.0),
            "{t}"
        );
    }

    /// Each scrape shows the module's numbers of that scrape (not a sum over scrapes), and a
    /// server gone from the set leaves no series behind.
    #[test]
    fn a_scrape_sets_the_modules_values_and_forgets_removed_servers() {
        let m = Metrics::default();
        let map = |json: &str| {
            std::iter::once(("web".to_string(), state(json)))
                .collect::<std::collections::HashMap<_, _>>()
        };
        let first = m.encode(&[], Some(&map(STATS_JSON)), 0, Format::Prometheus);
        let again = m.encode(&[], Some(&map(STATS_JSON)), 0, Format::Prometheus);
        // The same samples (a family's order of series is a hash map's, so compare them sorted).
        let sorted = |t: &str| {
            let mut l: Vec<String> = t.lines().map(str::to_string).collect();
            l.sort();
            l
        };
        assert_eq!(sorted(&first), sorted(&again));
        let req = series("tributary_server_requests_total", "10.0.0.1:80");
        assert_eq!(value(&again, &req), Some(12.0), "{again}");
        let mut later = state(STATS_JSON);
        later.servers[0].stats.as_mut().unwrap().requests = 20;
        later.servers.truncate(1);
        let map2 = std::iter::once(("web".to_string(), later)).collect();
        let t = m.encode(&[], Some(&map2), 0, Format::OpenMetrics);
        assert!(
            t.contains("# TYPE tributary_server_requests counter"),
            "{t}"
        );
        assert_eq!(value(&t, &req), Some(20.0), "{t}");
        assert!(!t.contains("10.0.0.2:80"), "{t}");
        // Not in live mode: none.
        let t = m.encode(&[], None, 0, Format::Prometheus);
        assert!(!t.contains("tributary_server_requests_total{"), "{t}");
    }
}
