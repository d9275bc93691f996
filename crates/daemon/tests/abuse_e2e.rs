//! Section "the web UI and API resist abuse", end to end against the real `tributary serve`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Daemon;
use tributary_testkit::TestNginx;

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
    let nginx = TestNginx::builder().start();
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
    let nginx = TestNginx::builder().start();
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
