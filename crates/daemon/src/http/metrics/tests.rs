//! Tests of the metrics registry and its text.

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
        drain_secs: 0,
        probe: None,
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
    let t = m.encode(&[], None, 10_000, Format::OpenMetrics);
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
    let t = m.encode(&[], None, 0, Format::Prometheus);
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
    let t = m.encode(&[a, b], None, 0, Format::Prometheus);
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
        None,
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
    let t = m.encode(&[], None, 4_000, Format::Prometheus);
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
    let om = m.encode(&[], None, 0, Format::OpenMetrics);
    let text = m.encode(&[], None, 0, Format::Prometheus);
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
