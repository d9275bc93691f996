//! Section "the web UI and API resist abuse", end to end against the real `tributary serve`.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Daemon;
use tributary_testkit::Nginx;

// Raw on purpose, not testkit's client: that one always sends a `Host`, and these cases need none.
/// A raw HTTP/1.1 request with the given `Host` header (`None`: no Host header, HTTP/1.0);
/// returns (status, headers, body).
fn request(
    port: u16,
    method: &str,
    path: &str,
    host: Option<&str>,
    extra: &str,
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (version, host_line) = match host {
        Some(h) => ("HTTP/1.1", format!("Host: {h}\r\n")),
        None => ("HTTP/1.0", String::new()),
    };
    let req = format!(
        "{method} {path} {version}\r\n{host_line}Connection: close\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

#[test]
fn requests_for_another_host_name_are_refused_api_and_ui() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start(root.path(), &nginx);
    let port = d.port;
    let auth = format!("Authorization: Bearer {}\r\n", d.token());
    let own = format!("127.0.0.1:{port}");
    // The listen address and localhost are this daemon.
    for host in [own.as_str(), &format!("localhost:{port}")] {
        assert_eq!(
            request(port, "GET", "/api/v1/health", Some(host), "", "").0,
            200,
            "{host}"
        );
        assert_eq!(
            request(port, "GET", "/api/v1/bindings", Some(host), &auth, "").0,
            200
        );
        assert_eq!(
            request(port, "GET", "/login", Some(host), "", "").0,
            200,
            "{host}"
        );
    }
    // A re-pointed name (DNS rebinding) is refused everywhere, even with the token.
    let evil = format!("rebind.attacker.example:{port}");
    let (status, _, body) = request(port, "GET", "/api/v1/bindings", Some(&evil), &auth, "");
    assert_eq!(status, 421, "{body}");
    assert!(
        body.contains("\"error\"") && body.contains("--allowed-host rebind.attacker.example"),
        "{body}"
    );
    for (method, path) in [
        ("GET", "/api/v1/health"),
        ("GET", "/login"),
        ("GET", "/ui/"),
        ("GET", "/metrics"),
        ("POST", "/login"),
    ] {
        let (status, _, body) = request(port, method, path, Some(&evil), &auth, "");
        assert_eq!(status, 421, "{method} {path}: {body}");
        assert!(body.contains("DNS rebinding"), "{body}");
    }
    // No Host at all: refused too.
    assert_eq!(request(port, "GET", "/api/v1/health", None, "", "").0, 421);
}

#[test]
fn allowed_host_names_are_answered() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(
        root.path(),
        &nginx,
        &[
            "--allowed-host",
            "tributary.internal.example",
            "--allowed-host",
            "Proxy.Example.",
        ],
    );
    let port = d.port;
    let auth = format!("Authorization: Bearer {}\r\n", d.token());
    for host in [
        "tributary.internal.example:443",
        "proxy.example",
        "PROXY.EXAMPLE:8080",
    ] {
        assert_eq!(
            request(port, "GET", "/api/v1/bindings", Some(host), &auth, "").0,
            200,
            "{host}"
        );
        assert_eq!(
            request(port, "GET", "/login", Some(host), "", "").0,
            200,
            "{host}"
        );
    }
    assert_eq!(
        request(port, "GET", "/login", Some("other.example"), "", "").0,
        421
    );
    // A bad --allowed-host stops the daemon at start with a clear error.
    let out = std::process::Command::new(common::tributary_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--allowed-host",
            "http://x/",
        ])
        .arg("--data-dir")
        .arg(root.path().join("other-data"))
        .arg("--plugins-dir")
        .arg(&d.plugins_dir)
        .arg("--conf-dir")
        .arg(nginx.conf_dir())
        .args(["--test-cmd", "true", "--reload-cmd", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--allowed-host \"http://x/\" is not a host name"),
        "{err}"
    );
}

#[test]
fn binding_names_are_unique_regardless_of_case() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start(root.path(), &nginx);
    let b = |name: &str| {
        serde_json::json!({"name": name, "plugin": "static", "provider": "static",
            "service": "s", "config": {"targets": "127.0.0.1:9"}})
    };
    let (status, v) = d.api("POST", "/api/v1/bindings", Some(&b("Api").to_string()));
    assert_eq!(status, 201, "{v}");
    for (method, path) in [
        ("POST", "/api/v1/bindings"),
        ("PUT", "/api/v1/bindings/api"),
    ] {
        let (status, v) = d.api(method, path, Some(&b("api").to_string()));
        assert_eq!(status, 409, "{method} {path}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("\"Api\" already exists") && msg.contains("regardless of case"),
            "{msg}"
        );
    }
    let bulk = serde_json::json!({"bindings": [b("one"), b("ONE")]}).to_string();
    let (status, v) = d.api("POST", "/api/v1/bindings/bulk", Some(&bulk));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "name", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("differ only in case"),
        "{v}"
    );
    let bulk = serde_json::json!({"bindings": [b("two"), b("API")]}).to_string();
    let (status, v) = d.api("POST", "/api/v1/bindings/bulk", Some(&bulk));
    assert_eq!(status, 409, "{v}");
    let (_, list) = d.api("GET", "/api/v1/bindings", None);
    let names: Vec<&str> = list["bindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Api"], "nothing else was saved");
    // The same name, same case, still replaces.
    let (status, v) = d.api("PUT", "/api/v1/bindings/Api", Some(&b("Api").to_string()));
    assert!(status == 200, "{v}");
}

#[test]
fn wrong_passwords_are_rate_limited_per_client_address() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start(root.path(), &nginx);
    let port = d.port;
    let password = std::fs::read_to_string(d.data_dir.join("ui-initial-password"))
        .unwrap()
        .trim()
        .to_string();
    let csrf = "ab".repeat(32);
    let login = |pw: &str| {
        let body = format!("csrf={csrf}&password={pw}");
        request(
            port,
            "POST",
            "/login",
            Some(&format!("127.0.0.1:{port}")),
            &format!(
                "Cookie: tributary_login={csrf}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            ),
            &body,
        )
    };
    for i in 1..=4 {
        let (status, _, _) = login("wrong-password");
        assert_eq!(status, 401, "attempt {i}");
    }
    // The fifth wrong password locks the address out: 429 with Retry-After.
    let (status, head, body) = login("wrong-password");
    assert_eq!(status, 429, "{body}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 60"),
        "{head}"
    );
    assert!(body.contains("Too many wrong passwords"), "{body}");
    // Even the right password is refused while locked out.
    let (status, head, _) = login(&password);
    assert_eq!(status, 429);
    let secs: u64 = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_string)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!((1..=60).contains(&secs), "{secs}");
}
