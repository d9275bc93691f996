//! Helpers of the end-to-end tests of what the daemon shows of nginx's live state
//! (`e2e/live_state.rs`, `e2e/server_stats.rs`): HTTP with headers (testkit's client), a UI session, the module's API
//! on its unix socket, polling, `/metrics` values, `promtool`, the binding page's rows.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_testkit::{client, Nginx, Response};

use super::Daemon;

/// One request to the daemon with `tributary_testkit`'s client (`Host: 127.0.0.1:PORT`, a
/// `Content-Length` on every request): status, the `name=value` of each `Set-Cookie`, body.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<String>, String) {
    let host = format!("127.0.0.1:{port}");
    let length = body.len().to_string();
    let mut all = vec![("Host", host.as_str()), ("Content-Length", length.as_str())];
    all.extend_from_slice(headers);
    let timeout = Duration::from_secs(60);
    let a = client::http_request_within(port, method, path, &all, body.as_bytes(), timeout)
        .unwrap_or_else(|e| panic!("{method} {path}: {e:?}"));
    let cookies = a
        .headers_named("set-cookie")
        .into_iter()
        .map(|v| v.split(';').next().unwrap_or("").to_string())
        .collect();
    (a.status, cookies, a.text())
}

/// The web UI's page of binding `name`, read after logging in (asserts a 200).
pub fn binding_page(d: &Daemon, name: &str) -> String {
    let session = ui_session(d);
    let (status, _, page) = request(
        d.port,
        "GET",
        &format!("/ui/bindings/{name}"),
        &[("Cookie", &session)],
        "",
    );
    assert_eq!(status, 200, "{page}");
    page
}

/// Logs in to the web UI with the initial password: the `Cookie` value of the session.
pub fn ui_session(d: &Daemon) -> String {
    let (status, cookies, _) = request(d.port, "GET", "/login", &[], "");
    assert_eq!(status, 200);
    let login = cookies
        .into_iter()
        .find(|c| c.starts_with("tributary_login="))
        .expect("login cookie");
    let csrf = login.split_once('=').unwrap().1.to_string();
    let password = std::fs::read_to_string(d.data_dir.join("ui-initial-password")).unwrap();
    let (status, cookies, body) = request(
        d.port,
        "POST",
        "/login",
        &[
            ("Cookie", &login),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("csrf={csrf}&password={}", password.trim()),
    );
    assert_eq!(status, 303, "{body}");
    cookies
        .into_iter()
        .find(|c| c.starts_with("tributary_session="))
        .expect("session cookie")
}

/// One request to the module's API on its unix socket: the answer's JSON body (asserts a 200).
pub fn module(nginx: &Nginx, method: &str, name: &str, body: Option<&Value>) -> Value {
    let a = module_request(nginx, method, &format!("/api/{name}"), body);
    assert_eq!(a.status, 200, "{method} /api/{name}: {}", a.text());
    serde_json::from_slice(&a.body).unwrap()
}

/// Any request to the module's API on nginx's `logs/api.sock` (a `Content-Length` on every
/// request); panics when the socket does not answer.
pub fn module_request(nginx: &Nginx, method: &str, path: &str, body: Option<&Value>) -> Response {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let length = body.len().to_string();
    let socket = nginx.prefix().join("logs/api.sock");
    let headers = [("Content-Length", length.as_str())];
    client::http_request_unix(&socket, method, path, &headers, body.as_bytes())
        .unwrap_or_else(|e| panic!("{method} {path} on {}: {e:?}", socket.display()))
}

/// The module's `(active, fails, down)` of `address` in `GET <loc>/NAME`.
pub fn counts(set: &Value, address: &str) -> (u64, u64, bool) {
    let s = set["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == address)
        .unwrap_or_else(|| panic!("{address} not in {set}"));
    (
        s["active"].as_u64().unwrap(),
        s["fails"].as_u64().unwrap(),
        s["down"].as_bool().unwrap(),
    )
}

/// Polls `f` until it gives `Some` (at most 20 s).
pub fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// What `promtool check metrics` says of `text` ("" when it has no complaint).
pub fn promtool(text: &str) -> String {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is missing: scripts/setup.sh installs Debian's prometheus package");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `<tr>` of `address` in the binding page's live table.
pub fn page_row<'a>(page: &'a str, address: &str) -> &'a str {
    let start = page
        .find(&format!("<tr data-address=\"{address}\">"))
        .unwrap_or_else(|| panic!("no live row for {address} in {page}"));
    let len = page[start..].find("</tr>").unwrap();
    &page[start..start + len]
}

/// The families (`name type`) the OpenMetrics parser of Python's `prometheus_client` (in
/// `target/venv`, made by `scripts/setup.sh`; `TRIBUTARY_VENV` elsewhere) reads from `text`;
/// panics with the parser's error when it refuses the text.
pub fn openmetrics_families(text: &str) -> Vec<String> {
    let venv = std::env::var_os("TRIBUTARY_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| super::workspace_root().join("target/venv"));
    let mut child = std::process::Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\nfor f in p(sys.stdin.read()): print(f.name, f.type)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("target/venv/bin/python is missing: scripts/setup.sh makes it");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the text:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
