//! The daemon's graceful removal end to end: real daemon in live mode, the real `file`
//! plugin, real nginx (`master_process on`, 2 workers, the combined-upstreams module). A target
//! that leaves discovery is first drained (the live API shows `drain: true`, it gets no new
//! request, the file keeps it `down`), its request in flight finishes with 200, and it is removed
//! once it has none left — no reload, no failed client request. A target that comes back while
//! drained is undrained. And the binding's `probe`/`drain_secs` are refused, naming the field and
//! changing nothing, when they cannot work.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::{workspace_root, Daemon};
use serde_json::{json, Value};
use tributary_fakes::daemon::{plugin_folder, sibling_bin, FAST};
use tributary_testkit::{client, Nginx};

/// How long the slow backend holds a `/slow` request.
const HOLD: Duration = Duration::from_secs(4);

/// A backend that answers `slow` at once, or after [`HOLD`] for a path ending in `/slow`
/// (signalled when it arrives), counting every request.
struct SlowBackend {
    port: u16,
    requests: Arc<AtomicUsize>,
    arrived: mpsc::Receiver<()>,
}

impl SlowBackend {
    fn start() -> SlowBackend {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let (tx, arrived) = mpsc::channel();
        let count = requests.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let (count, tx) = (count.clone(), tx.clone());
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let path = line.split_whitespace().nth(1).unwrap_or("");
                    if path.ends_with("/slow") {
                        let _ = tx.send(());
                        std::thread::sleep(HOLD);
                    }
                    let _ = w.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nslow",
                    );
                });
            }
        });
        SlowBackend {
            port,
            requests,
            arrived,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// `GET path` on nginx's front with a read timeout longer than [`HOLD`]: (status, body).
fn long_get(port: u16, path: &str) -> (u16, String) {
    let timeout = HOLD + Duration::from_secs(20);
    let a = client::http_request_within(port, "GET", path, &[], b"", timeout)
        .unwrap_or_else(|e| panic!("GET {path}: {e:?}"));
    (a.status, a.text())
}

/// Sends `/slow` through nginx from a thread until one reaches the slow backend (the others are
/// answered at once by the other server); returns the thread, which ends with that request's
/// answer and how long it took.
fn hold_one(nginx: &Nginx, slow: &SlowBackend) -> std::thread::JoinHandle<(u16, String, Duration)> {
    let port = nginx.port();
    let path = format!("{}slow", Nginx::upstream_path("web"));
    let h = std::thread::spawn(move || {
        for _ in 0..50 {
            let t = Instant::now();
            let (status, body) = long_get(port, &path);
            if body == "slow" || status != 200 {
                return (status, body, t.elapsed());
            }
        }
        panic!("50 requests for /slow and none reached the slow backend");
    });
    slow.arrived
        .recv_timeout(Duration::from_secs(10))
        .expect("a /slow request reached the slow backend");
    h
}

/// One request to the live API on its unix socket: the answer's JSON.
fn live_get(nginx: &Nginx, name: &str) -> Value {
    common::live::module(nginx, "GET", name, None)
}

/// The live API's view of server `addr` of `web` (`None`: not in the set).
fn live_server(nginx: &Nginx, addr: &str) -> Option<Value> {
    live_get(nginx, "web")["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == addr)
        .cloned()
}

fn services(path: &Path, ports: &[u16]) {
    let servers: Vec<Value> = ports
        .iter()
        .map(|p| json!({"address": "127.0.0.1", "port": p}))
        .collect();
    std::fs::write(path, json!({ "web": servers }).to_string()).unwrap();
}

fn refresh(d: &Daemon) -> Value {
    let (status, o) = d.api("POST", "/api/v1/bindings/web/refresh", None);
    assert_eq!(status, 200, "{o}");
    o
}

/// Front requests on new connections while `until` is not finished (at least 40): every one
/// must answer 200 `a`. Returns how many were sent.
fn only_a_while<T>(nginx: &Nginx, until: &std::thread::JoinHandle<T>) -> usize {
    let path = Nginx::upstream_path("web");
    let mut n = 0;
    while n < 40 || !until.is_finished() {
        assert_eq!(nginx.get(&path), (200, "a".to_string()), "request {n}");
        n += 1;
    }
    n
}

#[test]
fn a_deregistered_target_is_drained_first_then_removed_and_no_request_fails() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder()
        .workers(2)
        .live_api("")
        .backend("a")
        .start();
    let slow = SlowBackend::start();
    let a = nginx.backend_port("a");
    let slow_addr = format!("127.0.0.1:{}", slow.port);
    let plugins = root.path().join("plugins");
    plugin_folder(
        &plugins,
        &workspace_root().join("plugins/file"),
        &sibling_bin(&common::tributary_bin(), "tributary-plugin-file"),
        None,
    );
    let api = nginx.live_api_address();
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend(["--apply", "live", "--live-api", &api]);
    let d = Daemon::start_with(root.path(), &nginx, &args);
    let file = root.path().join("services.json");
    services(&file, &[a, slow.port]);
    // drain_secs well over the test: the removal here comes from `active` reaching 0.
    let body_json = json!({"plugin": "file", "provider": "file", "service": "web",
                      "config": {"path": file.display().to_string()}, "drain_secs": 60});
    let body = body_json.clone();
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["binding"]["drain_secs"], 60, "{v}");
    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(ok && text.contains("drain before removal: 60 s"), "{text}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    nginx.wait_settled(Duration::from_secs(10)).unwrap();
    let reloads = nginx.reloads_seen();
    let conf = nginx.upstreams_dir().join("web.conf");
    // Malformed probe parameters in live mode: refused naming the field, nothing changed.
    let bytes = std::fs::read(&conf).unwrap();
    let mut bad = body.clone();
    bad["probe"] = json!("uri=/healthz interval=");
    let (status, v) = d.api("PUT", "/api/v1/bindings/web", Some(&bad.to_string()));
    assert_eq!(status, 400, "{v}");
    assert!(v.to_string().contains("\"probe\""), "{v}");
    let (_, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert!(v["binding"].get("probe").is_none(), "{v}");
    assert_eq!(std::fs::read(&conf).unwrap(), bytes);

    // A long request held by the slow server; then it leaves discovery.
    let long = hold_one(&nginx, &slow);
    services(&file, &[a]);
    let o = refresh(&d);
    assert_eq!(
        (&o["status"], &o["applied"]),
        (&json!("ok"), &json!("live")),
        "{o}"
    );
    let s = live_server(&nginx, &slow_addr).expect("the drained server is still in the set");
    assert_eq!(
        (&s["drain"], &s["down"], &s["active"]),
        (&json!(true), &json!(false), &json!(1)),
        "{s}"
    );
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(
        text.contains(&format!("    server {slow_addr} weight=1 down;\n")),
        "the file keeps it down: {text}"
    );
    let before = slow.requests();
    let sent = only_a_while(&nginx, &long);
    let (status, body, took) = long.join().unwrap();
    eprintln!("drained: {sent} requests all to a; the held request {status} {body:?} in {took:?}");
    assert_eq!((status, body.as_str()), (200, "slow"));
    assert!(took + Duration::from_millis(200) >= HOLD, "{took:?}");
    assert_eq!(
        slow.requests(),
        before,
        "new requests to the drained server"
    );

    // Idle now: the daemon removes it (the watcher sees active 0 and refreshes the binding).
    let t = Instant::now();
    while live_server(&nginx, &slow_addr).is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still in the set: {}",
            live_get(&nginx, "web")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("removed {:?} after its request ended", t.elapsed());
    let t = Instant::now();
    while std::fs::read_to_string(&conf).unwrap().contains(&slow_addr) {
        assert!(t.elapsed() < Duration::from_secs(5), "still in the file");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(nginx.reloads_seen(), reloads, "no reload");

    // Back in discovery, drained again by another departure, then back while drained: undrained.
    services(&file, &[a, slow.port]);
    assert_eq!(refresh(&d)["applied"], "live");
    let long = hold_one(&nginx, &slow);
    services(&file, &[a]);
    refresh(&d);
    let s = live_server(&nginx, &slow_addr).expect("drained");
    assert_eq!(s["drain"], true, "{s}");
    services(&file, &[a, slow.port]);
    let o = refresh(&d);
    assert_eq!(o["applied"], "live", "{o}");
    let s = live_server(&nginx, &slow_addr).expect("kept");
    assert_eq!(s["drain"], false, "undrained: {s}");
    assert!(!std::fs::read_to_string(&conf).unwrap().contains(" down;"));
    let before = slow.requests();
    let path = Nginx::upstream_path("web");
    let mut n = 0;
    while slow.requests() == before {
        let (status, body) = nginx.get(&path);
        assert_eq!(status, 200, "{body}");
        n += 1;
        assert!(n < 50, "the undrained server got no request in 50");
    }
    let (status, body, _) = long.join().unwrap();
    assert_eq!((status, body.as_str()), (200, "slow"));
    assert_eq!(nginx.reloads_seen(), reloads, "no reload");

    // drain_secs shorter than the request: removed when the time is up, request still in flight
    // (the module retires it); the request still ends with 200.
    let mut short = body_json.clone();
    short["drain_secs"] = json!(1);
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&short.to_string()),
    );
    assert_eq!(status, 200, "{v}");
    let long = hold_one(&nginx, &slow);
    services(&file, &[a]);
    let t = Instant::now();
    refresh(&d);
    assert_eq!(
        live_server(&nginx, &slow_addr).expect("drained")["drain"],
        true
    );
    while live_server(&nginx, &slow_addr).is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "not removed after drain_secs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let removed = t.elapsed();
    let v = live_get(&nginx, "web");
    assert_eq!(v["retiring"], 1, "removed with its request in flight: {v}");
    assert!(
        !long.is_finished(),
        "the request was still in flight at the removal"
    );
    let (status, body, took) = long.join().unwrap();
    eprintln!("drain_secs 1: removed after {removed:?}; the held request {status} in {took:?}");
    assert!(removed >= Duration::from_millis(900), "{removed:?}");
    assert_eq!((status, body.as_str()), (200, "slow"));
    assert_eq!(nginx.reloads_seen(), reloads, "no reload");
}

/// `probe` and `drain_secs` need the live mode; malformed `probe` parameters are refused before
/// nginx sees them. Each answer names the field, and nothing is saved or written.
#[test]
fn probe_and_drain_secs_are_refused_naming_the_field_when_they_cannot_work() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().backend("a").start();
    let d = Daemon::start_with(root.path(), &nginx, &["--apply", "reload"]);
    let target = format!("127.0.0.1:{}", nginx.backend_port("a"));
    let with = |extra: Value| {
        let mut b = json!({"plugin": "static", "provider": "static", "service": "web",
                           "config": {"targets": target}});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    for (extra, field, words) in [
        (json!({"probe": "uri=/healthz"}), "probe", "live apply mode"),
        (json!({"drain_secs": 5}), "drain_secs", "live apply mode"),
        (
            json!({"probe": "uri=/x; include x"}),
            "probe",
            "contains ';'",
        ),
        (json!({"drain_secs": 100000}), "drain_secs", "too long"),
    ] {
        let (status, v) = d.api("PUT", "/api/v1/bindings/web", Some(&with(extra.clone())));
        assert_eq!(status, 400, "{extra}: {v}");
        let text = v.to_string();
        assert!(
            text.contains(&format!("\"{field}\"")) && text.contains(words),
            "{extra}: {v}"
        );
    }
    // The command line's flags reach the same check.
    let config = format!("targets={target}");
    for (flag, value, field) in [
        ("--probe", "uri=/x", "probe"),
        ("--drain-secs", "5", "drain_secs"),
    ] {
        let (ok, v) = d.cli_json(&[
            "binding",
            "add",
            "web",
            "--plugin",
            "static",
            "--provider",
            "static",
            "--service",
            "web",
            "--config",
            &config,
            flag,
            value,
        ]);
        assert!(!ok, "{flag}: {v}");
        assert_eq!(v["error"]["field"], field, "{flag}: {v}");
    }
    let (status, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(status, 404, "nothing saved: {v}");
    assert!(!nginx.upstreams_dir().join("web.conf").exists());
    // Without them the same binding is saved, in reload mode as before.
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&with(json!({}))),
    );
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["binding"]["drain_secs"], 0, "{v}");
    assert!(v["binding"].get("probe").is_none(), "{v}");
}
