//! The web side of `tributary serve` over real HTTP: the OpenAPI document against the routers,
//! access control (health open, bearer API, session UI, CSRF), bad input through the API and the
//! form, write-only secrets, `/metrics`, and a bounded schemathesis run. Real daemon, real
//! `static` plugin, real nginx.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::Command;
use std::time::Duration;

use common::{workspace_root, Daemon};
use serde_json::{json, Value};
use tributary_testkit::{client, Nginx, Response};

/// One request to the daemon with `tributary_testkit`'s client: `Host: 127.0.0.1:PORT` (the
/// daemon's host check), a `Content-Length` on every request, answers awaited up to 120 s.
fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let host = format!("127.0.0.1:{port}");
    let length = body.len().to_string();
    let mut all = vec![("Host", host.as_str()), ("Content-Length", length.as_str())];
    all.extend_from_slice(headers);
    let timeout = Duration::from_secs(120);
    client::http_request_within(port, method, path, &all, body.as_bytes(), timeout)
        .unwrap_or_else(|e| panic!("{method} {path}: {e:?}"))
}

/// The answer's body as JSON (`Null` when it is not JSON).
fn json(a: &Response) -> Value {
    serde_json::from_slice(&a.body).unwrap_or(Value::Null)
}

fn bearer(d: &Daemon) -> String {
    format!("Bearer {}", d.token())
}

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

fn nginx_with_backend() -> Nginx {
    Nginx::builder().backend("alpha").start()
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
fn access_control_health_open_api_bearer_ui_session_metrics_either() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start(root.path(), &nginx);
    let tok = bearer(&d);
    assert_eq!(
        request(d.port, "GET", "/api/v1/health", &[], "").status,
        200
    );
    for p in [
        "/api/v1/bindings",
        "/api/v1/nginx",
        "/api/v1/openapi.json",
        "/api/v1/bindings/x/history",
        "/metrics",
    ] {
        let a = request(d.port, "GET", p, &[], "");
        assert_eq!(a.status, 401, "{p} without a token");
        assert_eq!(a.header("www-authenticate"), Some("Bearer"), "{p}");
        let a = request(
            d.port,
            "GET",
            p,
            &[("Authorization", "Bearer wrong-token-wrong-token")],
            "",
        );
        assert_eq!(a.status, 401, "{p} with a wrong token");
    }
    let a = request(d.port, "POST", "/api/v1/resolve", &[], "{}");
    assert_eq!(a.status, 401);
    // UI pages redirect to the login page; so does a POST without a session.
    for (m, p) in [
        ("GET", "/ui/bindings"),
        ("GET", "/ui/new"),
        ("GET", "/ui/nginx"),
        ("POST", "/ui/new"),
        ("POST", "/ui/bindings/x/delete"),
    ] {
        let a = request(d.port, m, p, &[], "");
        assert_eq!(a.status, 303, "{m} {p}");
        assert_eq!(a.header("location"), Some("/login"), "{m} {p}");
    }
    // The bearer token does not open the UI (it is for the API).
    let a = request(
        d.port,
        "GET",
        "/ui/bindings",
        &[("Authorization", &tok)],
        "",
    );
    assert_eq!(a.status, 303);

    // Login: CSRF double-submit token, wrong password, right password.
    let form = request(d.port, "GET", "/login", &[], "");
    assert_eq!(form.status, 200);
    let csp = form.header("content-security-policy").unwrap_or("");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let login_cookie = form
        .headers_named("set-cookie")
        .into_iter()
        .find(|c| c.starts_with("tributary_login="))
        .expect("login cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let csrf = login_cookie.split_once('=').unwrap().1.to_string();
    assert!(form.text().contains(&csrf));
    let password = std::fs::read_to_string(d.data_dir.join("ui-initial-password")).unwrap();
    let password = password.trim();
    let post = |cookie: &str, body: String| {
        request(
            d.port,
            "POST",
            "/login",
            &[
                ("Cookie", cookie),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &body,
        )
    };
    let a = post(
        &login_cookie,
        format!("csrf={csrf}&password=wrong-password"),
    );
    assert_eq!(a.status, 401);
    assert!(a.text().contains("Wrong password."));
    let a = post("", format!("csrf={csrf}&password={password}"));
    assert_eq!(a.status, 403, "a login without the CSRF cookie is refused");
    let a = post(&login_cookie, format!("csrf={csrf}&password={password}"));
    assert_eq!(a.status, 303, "{}", a.text());
    let set = a
        .headers_named("set-cookie")
        .into_iter()
        .find(|c| c.starts_with("tributary_session="))
        .expect("session cookie")
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let session = set.split(';').next().unwrap().to_string();

    let page = request(d.port, "GET", "/ui/bindings", &[("Cookie", &session)], "");
    assert_eq!(page.status, 200);
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let m = request(d.port, "GET", "/metrics", &[("Cookie", &session)], "");
    assert_eq!(m.status, 200);
    let m = request(d.port, "GET", "/metrics", &[("Authorization", &tok)], "");
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    assert!(
        m.text()
            .contains("# TYPE tributary_resolutions_total counter")
            && !m.text().contains("# EOF"),
        "{}",
        m.text()
    );
    // A scraper that asks for OpenMetrics gets it, with its content type.
    let om = request(
        d.port,
        "GET",
        "/metrics",
        &[
            ("Authorization", &tok),
            (
                "Accept",
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            ),
        ],
        "",
    );
    assert_eq!(om.status, 200);
    assert!(om
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    assert!(
        om.text().contains("# TYPE tributary_resolutions counter")
            && om.text().ends_with("# EOF\n"),
        "{}",
        om.text()
    );
    // A session does not open the JSON API.
    let a = request(
        d.port,
        "GET",
        "/api/v1/bindings",
        &[("Cookie", &session)],
        "",
    );
    assert_eq!(a.status, 401);

    // Forms need the session's CSRF token.
    let page_csrf = {
        let b = &page.text();
        let i = b.find("name=\"csrf\" value=\"").unwrap() + "name=\"csrf\" value=\"".len();
        b[i..i + 64].to_string()
    };
    let form_post = |path: &str, body: &str| {
        request(
            d.port,
            "POST",
            path,
            &[
                ("Cookie", &session),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            body,
        )
    };
    let a = form_post(
        "/ui/new",
        "plugin=static&provider=static&name=x&service=demo&cfg.targets=127.0.0.1%3A80&action=save",
    );
    assert_eq!(a.status, 403, "no CSRF token");
    let a = form_post("/ui/new", "csrf=0000&plugin=static&provider=static&name=x&service=demo&cfg.targets=127.0.0.1%3A80&action=save");
    assert_eq!(a.status, 403, "wrong CSRF token");
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // Bad input through the form: each invalid field gets its message next to it; nothing saved.
    for (body, field, words) in [
        (
            "name=bad%20name&service=demo&cfg.targets=127.0.0.1%3A80",
            "name",
            "upstream name",
        ),
        (
            "name=ok&service=&cfg.targets=127.0.0.1%3A80",
            "service",
            "service",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&interval_secs=3",
            "interval_secs",
            "too short",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&interval_secs=x",
            "interval_secs",
            "whole number",
        ),
        ("name=ok&service=demo&cfg.targets=", "targets", "required"),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&cfg.ttl_seconds=abc",
            "ttl_seconds",
            "ttl_seconds",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&directives=include+%2Fetc%2Fpasswd%3B",
            "directives",
            "directive",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&probe=uri%3D%2Fhealthz",
            "probe",
            "live apply mode",
        ),
        (
            "name=ok&service=demo&cfg.targets=127.0.0.1%3A80&drain_secs=soon",
            "drain_secs",
            "whole number",
        ),
    ] {
        let a = form_post(
            "/ui/new",
            &format!("csrf={page_csrf}&plugin=static&provider=static&action=save&{body}"),
        );
        assert_eq!(a.status, 400, "{body}: {}", a.text());
        let marker = format!("id=\"err-{field}\"");
        let text = a.text();
        let i = text
            .find(&marker)
            .unwrap_or_else(|| panic!("{body}: no error for {field}: {text}"));
        let msg = &text[i..text[i..].find("</span>").map_or(text.len(), |j| i + j)];
        assert!(msg.contains(words), "{body}: {msg}");
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // Several invalid fields at once: each gets its own message.
    let a = form_post(
        "/ui/new",
        &format!(
            "csrf={page_csrf}&plugin=static&provider=static&action=save&name=.bad&service=\
             &interval_secs=3&cfg.targets=&cfg.ttl_seconds=abc&directives=include+x%3B"
        ),
    );
    assert_eq!(a.status, 400);
    for field in [
        "name",
        "service",
        "interval_secs",
        "targets",
        "ttl_seconds",
        "directives",
    ] {
        assert!(
            a.text().contains(&format!("id=\"err-{field}\"")),
            "no error for {field}: {}",
            a.text()
        );
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // An interval that is not a number is reported with the other fields' problems.
    let a = form_post(
        "/ui/new",
        &format!(
            "csrf={page_csrf}&plugin=static&provider=static&action=save&name=ok&service=\
             &interval_secs=soon&cfg.targets=127.0.0.1%3A80"
        ),
    );
    assert_eq!(a.status, 400);
    assert!(a.text().contains("whole number"), "{}", a.text());
    assert!(a.text().contains("id=\"err-service\""), "{}", a.text());

    // Logout ends the session.
    let a = form_post("/logout", &format!("csrf={page_csrf}"));
    assert_eq!(a.status, 303);
    let a = request(d.port, "GET", "/ui/bindings", &[("Cookie", &session)], "");
    assert_eq!(a.status, 303);
}

#[test]
fn api_bad_input_names_the_field_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start(root.path(), &nginx);
    let alpha = nginx.backend_port("alpha");
    let good = json!({"name": "api", "plugin": "static", "provider": "static", "service": "demo",
                      "config": {"targets": format!("127.0.0.1:{alpha}")}});
    let cases: Vec<(Value, &str)> = vec![
        (json!({"name": "bad name"}), "name"),
        (json!({"plugin": "nope"}), "plugin"),
        (json!({"provider": "nope"}), "provider"),
        (json!({"service": ""}), "service"),
        (json!({"interval_secs": 1}), "interval_secs"),
        (
            json!({"directives": ["include /etc/passwd;"]}),
            "directives",
        ),
        (
            json!({"config": {"targets": "127.0.0.1:80", "unknown_key": "v"}}),
            "unknown_key",
        ),
        (json!({"config": {"targets": ""}}), "targets"),
        (
            json!({"config": {"targets": "127.0.0.1:80", "ttl_seconds": "soon"}}),
            "ttl_seconds",
        ),
    ];
    for (patch, field) in cases {
        let mut body = good.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        for path in ["/api/v1/bindings", "/api/v1/resolve"] {
            let (status, v) = d.api("POST", path, Some(&body.to_string()));
            assert_eq!(status, 400, "{path} {body}: {v}");
            assert_eq!(v["error"]["field"], field, "{path} {body}: {v}");
            assert!(!v["error"]["message"].as_str().unwrap().is_empty());
        }
    }
    // Bodies that do not parse: the member is named, string values are not repeated.
    let raw_cases = [
        (
            r#"{"name":"api","plugin":"static","provider":"static"}"#,
            "service",
        ),
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","config":"raw-secret-text"}"#,
            "config",
        ),
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","interval_secs":"raw-secret-text"}"#,
            "interval_secs",
        ),
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","colour":"blue"}"#,
            "colour",
        ),
        // A member given twice is refused, not read as its last value.
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","config":{"targets":"raw-secret-text","targets":"127.0.0.1:1"}}"#,
            "config.targets",
        ),
    ];
    for (body, field) in raw_cases {
        for path in [
            "/api/v1/bindings",
            "/api/v1/resolve",
            "/api/v1/bindings/api",
        ] {
            let method = if path.ends_with("/api") {
                "PUT"
            } else {
                "POST"
            };
            let (status, v) = d.api(method, path, Some(body));
            assert_eq!(status, 400, "{method} {path} {body}: {v}");
            assert_eq!(v["error"]["field"], field, "{method} {path} {body}: {v}");
            assert!(!v.to_string().contains("raw-secret-text"), "{v}");
        }
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );
    assert!(!nginx.upstreams_dir().join("api.conf").exists());
    // Required members left out are checked with the other fields (not by the parser): each is
    // listed in `errors`, next to the other invalid fields.
    for (method, path) in [
        ("POST", "/api/v1/bindings"),
        ("POST", "/api/v1/resolve"),
        ("PUT", "/api/v1/bindings/api"),
        ("POST", "/api/v1/bindings/bulk"),
    ] {
        let one = json!({"name": "api", "interval_secs": 1});
        let body = if path.ends_with("/bulk") {
            json!({"bindings": [one]})
        } else {
            one
        };
        let (status, v) = d.api(method, path, Some(&body.to_string()));
        assert_eq!(status, 400, "{method} {path}: {v}");
        let errors: Vec<(&str, &str)> = v["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path}: {v}"))
            .iter()
            .map(|e| (e["field"].as_str().unwrap(), e["message"].as_str().unwrap()))
            .collect();
        let fields: Vec<&str> = errors.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            ["interval_secs", "plugin", "provider", "service"],
            "{method} {path}: {v}"
        );
        assert!(errors[1].1.ends_with("plugin is required"), "{v}");
    }

    // Several invalid fields at once: `errors` lists each; nothing is created.
    let bad = json!({"name": "bad name", "plugin": "static", "provider": "static", "service": "",
                     "interval_secs": 1, "directives": ["include x;"],
                     "config": {"targets": "", "ttl_seconds": "soon", "colour": "blue"}});
    for (method, path) in [
        ("POST", "/api/v1/bindings"),
        ("POST", "/api/v1/resolve"),
        ("PUT", "/api/v1/bindings/new"),
    ] {
        let mut body = bad.clone();
        if method == "PUT" {
            body["name"] = json!("new");
        }
        let (status, v) = d.api(method, path, Some(&body.to_string()));
        assert_eq!(status, 400, "{method} {path}: {v}");
        let fields: Vec<&str> = v["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        let mut want = vec![
            "colour",
            "directives",
            "interval_secs",
            "service",
            "targets",
            "ttl_seconds",
        ];
        if method == "POST" {
            want.insert(3, "name");
        }
        assert_eq!(fields, want, "{method} {path}: {v}");
        assert_eq!(v["error"], v["errors"][0], "{v}");
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // A bad query string is a JSON error naming the parameter too.
    let (status, v) = d.api(
        "POST",
        "/api/v1/bindings?wait=maybe",
        Some(&good.to_string()),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "wait", "{v}");
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // Test resolve answers what would be written and writes nothing.
    let (status, v) = d.api("POST", "/api/v1/resolve", Some(&good.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "ok");
    assert!(
        v["rendered"]
            .as_str()
            .unwrap()
            .contains(&format!("server 127.0.0.1:{alpha} weight=1;")),
        "{v}"
    );
    assert!(!nginx.upstreams_dir().join("api.conf").exists());
    let mut failing = good.clone();
    failing["config"]["targets"] = json!("not a target list");
    let (status, v) = d.api("POST", "/api/v1/resolve", Some(&failing.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "failed");
    assert!(v["code"].is_i64(), "{v}");
    assert!(v["rendered"].is_null());
}

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

#[test]
fn tags_from_the_plugin_are_shown_but_never_written() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let alpha = nginx.backend_port("alpha");
    // The real `file` plugin next to `static` (its tags are labels for display); the daemon is
    // restarted to load it.
    let mut d = Daemon::start(root.path(), &nginx);
    let bin = common::tributary_bin()
        .parent()
        .unwrap()
        .join("tributary-plugin-file");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --workspace --bins",
        bin.display()
    );
    let mut manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("plugins/file/plugin.json")).unwrap(),
    )
    .unwrap();
    manifest["executable"] = json!(bin.display().to_string());
    std::fs::create_dir_all(d.plugins_dir.join("file")).unwrap();
    std::fs::write(d.plugins_dir.join("file/plugin.json"), manifest.to_string()).unwrap();
    d.stop();
    d.spawn();
    let services = root.path().join("services.json");
    std::fs::write(
        &services,
        json!({"api": [{"address": "127.0.0.1", "port": alpha, "tags": ["zone-a", "canary"]}]})
            .to_string(),
    )
    .unwrap();
    let body = json!({"name": "tagged", "plugin": "file", "provider": "file", "service": "api",
                      "config": {"path": services.display().to_string()}});
    let (status, v) = d.api(
        "POST",
        "/api/v1/bindings?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        v["binding"]["servers"][0]["tags"],
        json!(["zone-a", "canary"]),
        "{v}"
    );
    let file = std::fs::read_to_string(nginx.upstreams_dir().join("tagged.conf")).unwrap();
    assert!(
        file.contains(&format!("server 127.0.0.1:{alpha} weight=1;")),
        "{file}"
    );
    assert!(
        !file.contains("zone-a") && !file.contains("canary"),
        "{file}"
    );
    let (_, p) = d.api("POST", "/api/v1/resolve", Some(&body.to_string()));
    assert_eq!(p["targets"][0]["tags"], json!(["zone-a", "canary"]), "{p}");
}
