//! The OpenAPI document against the routers both ways, and a bounded schemathesis run against it.

use std::collections::BTreeSet;
use std::process::Command;

use crate::common::{workspace_root, Daemon};
use serde_json::{json, Value};

use super::{bearer, json, nginx_with_backend, request};

/// `(method, path)` of every `.route("...", ...)` in a Rust source text.
fn routes_in_source(src: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find(".route(") {
        rest = &rest[i + ".route(".len()..];
        let Some(q1) = rest.find('"') else { break };
        let after = &rest[q1 + 1..];
        let Some(q2) = after.find('"') else { break };
        let path = after[..q2].to_string();
        // The handler expression runs to the call's closing parenthesis.
        let mut depth = 1;
        let mut end = 0;
        for (j, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let handler = &rest[q1 + q2 + 2..end];
        for m in ["get", "post", "put", "delete", "patch"] {
            let call = format!("{m}(");
            let found = handler.match_indices(&call).any(|(k, _)| {
                k == 0
                    || !handler.as_bytes()[k - 1].is_ascii_alphanumeric()
                        && handler.as_bytes()[k - 1] != b'_'
            });
            if found {
                out.insert((m.to_string(), path.clone()));
            }
        }
        rest = &rest[end..];
    }
    out
}

fn openapi_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (m, _) in item.as_object().unwrap() {
            if ["get", "post", "put", "delete", "patch"].contains(&m.as_str()) {
                out.insert((m.clone(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn openapi_document_matches_the_routers_both_ways() {
    let src_dir = workspace_root().join("crates/daemon/src");
    let mut in_code = BTreeSet::new();
    for f in ["http/api/mod.rs", "http/metrics/mod.rs"] {
        let text = std::fs::read_to_string(src_dir.join(f)).unwrap();
        in_code.extend(routes_in_source(&text));
    }
    // The JSON API and /metrics are documented; the UI pages (HTML) are not part of it.
    let in_code: BTreeSet<_> = in_code
        .into_iter()
        .filter(|(_, p)| p.starts_with("/api/") || p == "/metrics")
        .collect();
    assert!(
        in_code.len() >= 14,
        "route scan found too little: {in_code:?}"
    );
    let doc: Value = serde_json::from_str(tributary::http::api::openapi::DOCUMENT).unwrap();
    let documented = openapi_operations(&doc);
    let missing: Vec<_> = in_code.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&in_code).collect();
    assert!(
        missing.is_empty(),
        "routes missing from the OpenAPI document: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "documented operations without a route: {extra:?}"
    );

    // And the running daemon answers every documented operation (no "no such endpoint", no 405).
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start(root.path(), &nginx);
    let served = request(
        d.port,
        "GET",
        "/api/v1/openapi.json",
        &[("Authorization", &bearer(&d))],
        "",
    );
    assert_eq!(served.status, 200);
    assert_eq!(json(&served), doc, "the served document is the checked one");
    for (m, p) in &documented {
        let path = p.replace("{name}", "no-such-binding");
        let body = if m == "get" || m == "delete" {
            ""
        } else {
            "{}"
        };
        let a = request(
            d.port,
            &m.to_uppercase(),
            &path,
            &[
                ("Authorization", &bearer(&d)),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        assert_ne!(a.status, 405, "{m} {path}: {}", a.text());
        assert!(
            !a.text().contains("no such endpoint"),
            "{m} {path}: {}",
            a.text()
        );
        assert!(a.status < 500, "{m} {path}: {} {}", a.status, a.text());
    }
}

#[test]
fn schemathesis_no_server_errors_and_answers_match_the_document() {
    let venv = std::env::var_os("TRIBUTARY_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/venv"));
    let st = venv.join("bin/schemathesis");
    assert!(
        st.is_file(),
        "{} is missing: scripts/setup.sh installs schemathesis into target/venv",
        st.display()
    );
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start(root.path(), &nginx);
    let alpha = nginx.backend_port("alpha");
    // One real binding, so the operations on {name} also meet one that exists.
    let web = json!({"name": "web", "plugin": "static", "provider": "static", "service": "demo",
                     "config": {"targets": format!("127.0.0.1:{alpha}")}});
    let (status, v) = d.api("POST", "/api/v1/bindings?wait=true", Some(&web.to_string()));
    assert_eq!(status, 201, "{v}");
    let out = Command::new(&st)
        .arg("run")
        .arg(format!("http://127.0.0.1:{}/api/v1/openapi.json", d.port))
        .args(["--header", &format!("Authorization: {}", bearer(&d))])
        .args(["--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"])
        .args(["--max-examples", "25", "--seed", "1", "--workers", "1"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--request-timeout", "60"])
        .args(["--generation-database", "none", "--no-color"])
        .current_dir(root.path())
        .output()
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "schemathesis found problems ({}):\n{stdout}\n{stderr}\ndaemon log:\n{}",
        out.status,
        d.log_text()
    );
    assert!(!d.log_text().contains("panicked"), "{}", d.log_text());
}
