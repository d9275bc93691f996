//! Write-only secrets, and `/metrics` following the outcomes (checked by promtool and by
//! prometheus_client's OpenMetrics parser).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Command;

use crate::common::{workspace_root, Daemon};
use serde_json::json;

use super::{bearer, nginx_with_backend, request};

/// Runs `cmd` with `input` on its stdin; `missing` says what to install when it cannot start.
fn run_with_input(cmd: &mut Command, input: &str, missing: &str) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{missing} ({e})"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// What `promtool check metrics` (Prometheus' own check of the text format) says of `text`: ""
/// when it has no complaint.
fn promtool_check(text: &str) -> String {
    let out = run_with_input(
        Command::new("promtool").args(["check", "metrics"]),
        text,
        "promtool is missing: scripts/setup.sh installs Debian's prometheus package",
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() || !said.is_empty() {
        said
    } else {
        format!("promtool exited with {}", out.status)
    }
}

/// The families (`name type`) prometheus_client's OpenMetrics parser reads from `text`; panics
/// with the parser's error when it refuses the text.
fn openmetrics_families(text: &str) -> Vec<String> {
    let venv = std::env::var_os("TRIBUTARY_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/venv"));
    let out = run_with_input(
        Command::new(venv.join("bin/python")).args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\nfor f in p(sys.stdin.read()): print(f.name, f.type)",
        ]),
        text,
        "target/venv/bin/python is missing: scripts/setup.sh makes it",
    );
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the text (scripts/setup.sh installs prometheus-client into target/venv):\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn secrets_are_write_only_and_metrics_follow_outcomes() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start_with(
        root.path(),
        &nginx,
        &[
            "--min-reload-gap-ms",
            "100",
            "--batch-quiet-ms",
            "50",
            "--with-testplug",
        ],
    );
    let alpha = nginx.backend_port("alpha");
    let secret = "metrics-secret-value-0815";
    let body = json!({"name": "sec", "plugin": "testplug", "provider": "t", "service": "ok",
                      "config": {"token": secret, "note": "plain"}});
    let (status, v) = d.api(
        "POST",
        "/api/v1/bindings?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    let web = json!({"name": "web", "plugin": "static", "provider": "static", "service": "demo",
                     "config": {"targets": format!("127.0.0.1:{alpha}")}});
    let (status, v) = d.api("POST", "/api/v1/bindings?wait=true", Some(&web.to_string()));
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    // Break `web` with a target set nginx rejects: the test fails, the file stays.
    let mut broken = web.clone();
    broken["config"]["targets"] = json!("nonexistent.invalid:80");
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&broken.to_string()),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "failed", "{v}");
    // And a plugin error with a code.
    let mut refused = web.clone();
    refused["name"] = json!("refused");
    refused["config"]["targets"] = json!("this is not a target list");
    let (status, v) = d.api(
        "POST",
        "/api/v1/bindings?wait=true",
        Some(&refused.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    let code = v["binding"]["last_outcome"]["code"]
        .as_i64()
        .expect("plugin error code");

    let tok = bearer(&d);
    let m = request(d.port, "GET", "/metrics", &[("Authorization", &tok)], "").text();
    let value = |line_start: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in:\n{m}"))
    };
    assert!(
        value("tributary_resolutions_total{outcome=\"ok\"}") >= 2.0,
        "{m}"
    );
    assert!(
        value("tributary_resolutions_total{outcome=\"failed\"}") >= 2.0,
        "{m}"
    );
    assert!(
        value(&format!("tributary_plugin_errors_total{{code=\"{code}\"}}")) >= 1.0,
        "{m}"
    );
    assert!(value("tributary_nginx_test_failures_total") >= 1.0, "{m}");
    assert!(value("tributary_nginx_reloads_total") >= 1.0, "{m}");
    assert!(
        value("tributary_last_successful_reload_timestamp_seconds") > 1.7e9,
        "{m}"
    );
    assert!(
        value("tributary_resolution_duration_seconds_count") >= 4.0,
        "{m}"
    );
    assert_eq!(
        value("tributary_resolution_duration_seconds_bucket{le=\"+Inf\"}"),
        value("tributary_resolution_duration_seconds_count")
    );
    assert_eq!(value("tributary_bindings"), 3.0);
    assert_eq!(value("tributary_binding_failing{binding=\"web\"}"), 1.0);
    assert_eq!(value("tributary_binding_servers{binding=\"web\"}"), 1.0);
    assert!(value("tributary_binding_staleness_seconds{binding=\"web\"}") >= 0.0);
    assert_eq!(
        value("tributary_store_connected"),
        1.0,
        "the sqlite store always answers"
    );
    assert!(
        !m.contains("tributary_binding_staleness_seconds{binding=\"refused\"}"),
        "never succeeded"
    );
    // Each format passes its real parser: Prometheus' promtool for the text format (what curl
    // gets), prometheus_client's OpenMetrics parser for what Prometheus asks for.
    let complaints = promtool_check(&m);
    assert_eq!(complaints, "", "promtool check metrics:\n{complaints}\n{m}");
    let om = request(
        d.port,
        "GET",
        "/metrics",
        &[
            ("Authorization", &tok),
            ("Accept", "application/openmetrics-text"),
        ],
        "",
    )
    .text();
    let families = openmetrics_families(&om);
    for (family, kind) in [
        ("tributary_resolutions", "counter"),
        ("tributary_plugin_errors", "counter"),
        ("tributary_resolution_duration_seconds", "histogram"),
        ("tributary_binding_failing", "gauge"),
    ] {
        assert!(
            families.contains(&format!("{family} {kind}")),
            "{family} {kind} not in {families:?}:\n{om}"
        );
    }
    assert_eq!(
        families.len(),
        om.matches("# TYPE ").count(),
        "{families:?}\n{om}"
    );

    let (_, n) = d.api("GET", "/api/v1/nginx", None);
    assert!(
        n["last_test_failure"]["nginx_error"]
            .as_str()
            .unwrap()
            .contains("host not found"),
        "{n}"
    );
    assert_eq!(n["last_test_failure"]["binding"], "web");
    assert!(
        n["files"].as_array().unwrap().contains(&json!("web.conf")),
        "{n}"
    );
    let (_, h) = d.api("GET", "/api/v1/bindings/web/history", None);
    let statuses: Vec<&str> = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.first(), Some(&"failed"), "{h}");
    assert!(statuses.contains(&"ok"), "{h}");

    // The secret is in no answer, page or log.
    let mut answers: BTreeMap<&str, String> = BTreeMap::new();
    for p in [
        "/api/v1/bindings",
        "/api/v1/bindings/sec",
        "/api/v1/bindings/sec/history",
        "/api/v1/nginx",
        "/api/v1/openapi.json",
        "/metrics",
    ] {
        answers.insert(
            p,
            request(d.port, "GET", p, &[("Authorization", &tok)], "").text(),
        );
    }
    let (_, v) = d.api("POST", "/api/v1/resolve", Some(&body.to_string()));
    answers.insert("resolve", v.to_string());
    for (p, text) in &answers {
        assert!(!text.contains(secret), "{p} shows the secret: {text}");
    }
    let (_, v) = d.api("GET", "/api/v1/bindings/sec", None);
    assert_eq!(v["binding"]["secrets"]["token"], true, "{v}");
    assert_eq!(v["binding"]["config"]["note"], "plain", "{v}");
    // No example in the OpenAPI document carries a secret field's value.
    assert!(!tributary::http::api::openapi::DOCUMENT.contains("tok_live"));
    assert!(!d.log_text().contains(secret));
}
