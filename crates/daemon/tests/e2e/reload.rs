//! End to end: "reloaded" means the new configuration is live. Real daemon,
//! real `static` plugin, real nginx with `master_process on` and two workers; the testkit's main
//! server is the front server that proxies `/u/<name>/` to the upstream the daemon writes.

use crate::common;

use std::fs;
use std::net::{Ipv4Addr, TcpListener};

use common::{http, Daemon};
use serde_json::{json, Value};
use tributary_testkit::Nginx;

fn static_binding(targets: &str) -> Value {
    json!({"plugin": "static", "provider": "static", "service": "web",
           "config": {"targets": targets}})
}

fn put_wait(d: &Daemon, name: &str, body: &Value) -> (u16, Value) {
    d.api(
        "PUT",
        &format!("/api/v1/bindings/{name}?wait=true"),
        Some(&body.to_string()),
    )
}

fn metrics(d: &Daemon) -> String {
    let (status, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
    assert_eq!(status, 200, "{text}");
    text
}

/// The value of one metric line (`name{labels} value`), 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn nginx_with(backends: &[&str]) -> Nginx {
    let mut b = Nginx::builder().workers(2);
    for name in backends {
        b = b.backend(name);
    }
    b.start()
}

/// Right after a save with `?wait=true` answers, every new connection through the front server
/// reaches the new servers: the old workers are all shutting down by then.
#[test]
fn save_with_wait_then_every_request_through_the_front_server_reaches_the_new_servers() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with(&["old1", "old2", "new1", "new2"]);
    let d = Daemon::start(root.path(), &nginx);
    let set = |a: &str, b: &str| {
        format!(
            "127.0.0.1:{} 127.0.0.1:{}",
            nginx.backend_port(a),
            nginx.backend_port(b)
        )
    };
    let old = set("old1", "old2");
    let new = set("new1", "new2");
    let path = Nginx::upstream_path("web");
    let (status, v) = put_wait(&d, "web", &static_binding(&old));
    assert_eq!(status, 201, "{v}");

    for round in 0..6 {
        let (targets, expect) = if round % 2 == 0 {
            (&new, ["new1", "new2"])
        } else {
            (&old, ["old1", "old2"])
        };
        let (status, v) = put_wait(&d, "web", &static_binding(targets));
        assert_eq!(status, 200, "round {round}: {v}");
        let o = &v["binding"]["last_outcome"];
        assert_eq!(o["status"], "ok", "round {round}: {v}");
        assert_eq!(o["reloaded"], true, "round {round}: {v}");
        // At once, no polling: many requests, on new connections, from several threads.
        let answers: Vec<(u16, String)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..50)
                            .map(|_| nginx.get(&path))
                            .collect::<Vec<(u16, String)>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(answers.len(), 200);
        let stale: Vec<&(u16, String)> = answers
            .iter()
            .filter(|(st, body)| *st != 200 || !expect.contains(&body.as_str()))
            .collect();
        assert!(
            stale.is_empty(),
            "round {round}: {} of 200 answers not from {expect:?}: {:?}",
            stale.len(),
            &stale[..stale.len().min(5)]
        );
    }
    let m = metrics(&d);
    assert_eq!(metric(&m, "tributary_nginx_reloads_total"), 7.0, "{m}");
}

/// The master rejects a reload (a port another socket holds; `nginx -t` does not bind, so it
/// passes): the save fails with nginx's `[emerg]` text, the file is restored, the binding is
/// failed, a later refresh is not "unchanged", and no reload is counted.
#[test]
fn reload_rejected_by_the_master_fails_the_binding_with_nginx_emerg_text() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with(&["a", "b"]);
    let d = Daemon::start(root.path(), &nginx);
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    let path = Nginx::upstream_path("web");
    let file = nginx.upstreams_dir().join("web.conf");
    let (status, v) = put_wait(&d, "web", &static_binding(&format!("127.0.0.1:{pa}")));
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["binding"]["last_outcome"]["reloaded"], true, "{v}");
    let good = fs::read_to_string(&file).unwrap();
    assert_eq!(nginx.get(&path), (200, "a".to_string()));
    let reloads = metric(&metrics(&d), "tributary_nginx_reloads_total");
    assert_eq!(reloads, 1.0);

    let holder = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let held = holder.local_addr().unwrap().port();
    // The master's reload fails on purpose: the new configuration listens on a port this test
    // holds (nginx retries the bind, then gives up).
    nginx.expect_log(&format!("bind() to 127.0.0.1:{held} failed"));
    nginx.expect_log("still could not bind()");
    let conf = fs::read_to_string(nginx.conf_path()).unwrap().replacen(
        "http {\n",
        &format!("http {{\n    server {{ listen 127.0.0.1:{held}; return 204; }}\n"),
        1,
    );
    fs::write(nginx.conf_path(), conf).unwrap();

    let (status, v) = put_wait(&d, "web", &static_binding(&format!("127.0.0.1:{pb}")));
    assert_eq!(status, 200, "{v}");
    let o = &v["binding"]["last_outcome"];
    assert_eq!(o["status"], "failed", "{v}");
    assert_eq!(o["failure"], "reload_failed", "{v}");
    assert_eq!(o["reloaded"], false, "{v}");
    let nginx_error = o["nginx_error"].as_str().unwrap();
    assert!(
        nginx_error.contains("[emerg]")
            && nginx_error.contains(&format!("bind() to 127.0.0.1:{held} failed")),
        "nginx's own text: {nginx_error}"
    );
    assert_eq!(v["binding"]["consecutive_failures"], 1, "{v}");
    assert_eq!(fs::read_to_string(&file).unwrap(), good, "file restored");
    assert_eq!(nginx.get(&path), (200, "a".to_string()));

    // A refresh resolves to the same new bytes: not "unchanged", it fails the same way.
    let (status, o) = d.api("POST", "/api/v1/bindings/web/refresh", None);
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["status"], "failed", "{o}");
    assert_eq!(o["failure"], "reload_failed", "{o}");
    assert!(
        o["nginx_error"].as_str().unwrap().contains("[emerg]"),
        "{o}"
    );
    assert_eq!(d.show("web")["consecutive_failures"], 2);
    assert_eq!(fs::read_to_string(&file).unwrap(), good);

    let m = metrics(&d);
    assert_eq!(metric(&m, "tributary_nginx_reloads_total"), reloads, "{m}");
    assert_eq!(
        metric(
            &m,
            "tributary_resolution_failures_total{failure=\"reload_failed\"}"
        ),
        2.0,
        "{m}"
    );

    // The CLI shows the kind too.
    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(ok, "{text}");
    assert!(text.contains("reload_failed"), "{text}");

    // Port free again: the next refresh goes live.
    drop(holder);
    let (status, o) = d.api("POST", "/api/v1/bindings/web/refresh", None);
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["reloaded"], true, "{o}");
    assert_eq!(o["failure"], Value::Null, "{o}");
    assert_eq!(nginx.get(&path), (200, "b".to_string()));
}
