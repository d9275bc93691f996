//! Helpers of the end-to-end tests of what the daemon shows of nginx's live state
//! (`e2e/live_state.rs`, `e2e/server_stats.rs`): raw HTTP with headers, a UI session, the module's API
//! on its unix socket, polling, `/metrics` values, `promtool`, the binding page's rows.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_testkit::TestNginx;

use super::Daemon;

/// A raw HTTP/1.1 exchange with extra headers: status, `Set-Cookie` values, body.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<String>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad answer {text:?}"));
    let cookies = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.trim().split(';').next().unwrap_or("").to_string())
        .collect();
    (status, cookies, body.to_string())
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

/// One request to the module's API on its unix socket: the answer's JSON body.
pub fn module(nginx: &TestNginx, method: &str, name: &str, body: Option<&Value>) -> Value {
    let mut s =
        std::os::unix::net::UnixStream::connect(nginx.prefix().join("logs/api.sock")).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} /api/{name} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{answer}");
    serde_json::from_str(body).unwrap()
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
