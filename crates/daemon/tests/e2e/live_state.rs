//! The daemon's read side, end to end: in live mode the daemon reads each server's live
//! state from the module (`GET <loc>/NAME`) and shows it in `binding show`, the API's binding view
//! (`live`), the binding page and `/metrics`; when the module cannot be reached each of them says
//! so and still answers. Real daemon, real `static` plugin, real nginx (`master_process on`, two
//! workers, the combined-upstreams module's release `.so`), a real backend that holds requests
//! (active connections), a closed port (fails) and a server marked down through the live API.

use crate::common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};

use common::live::{binding_page, counts, metric, module, page_row, promtool, wait};
use common::{http, Daemon};
use serde_json::{json, Value};
use tributary_fakes::daemon::FAST;
use tributary_testkit::Nginx;

/// Requests held open at the hanging backend.
const HELD: u64 = 4;

#[test]
fn binding_show_the_api_the_page_and_metrics_show_each_servers_live_state() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder()
        .workers(2)
        .live_api("")
        .backend("a")
        .start();
    // A backend that accepts and never answers: requests to it stay active.
    let hang = TcpListener::bind("127.0.0.1:0").unwrap();
    let hang_addr = format!("127.0.0.1:{}", hang.local_addr().unwrap().port());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hang.incoming().flatten() {
            held.push(s);
        }
    });
    // A closed port: connecting fails, nginx counts a fail.
    nginx.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let closed_addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let a_addr = format!("127.0.0.1:{}", nginx.backend_port("a"));

    let api = nginx.live_api_address();
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend_from_slice(&["--apply", "live", "--live-api", &api]);
    let mut d = Daemon::start_with(root.path(), &nginx, &args);
    let targets = format!("{a_addr} {hang_addr} {closed_addr}");
    let body = json!({"plugin": "static", "provider": "static", "service": "web",
                      "config": {"targets": targets}});
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert!(status == 200 || status == 201, "{status}: {v}");
    assert_eq!(v["binding"]["last_outcome"]["applied"], "reload", "{v}");

    // `a` marked down through the live API (as an operator would): every request now goes to the
    // hanging backend, directly or after the closed port failed.
    let set = module(&nginx, "GET", "web", None);
    let servers: Vec<Value> = set["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!({"address": s["address"], "weight": s["weight"], "down": s["address"] == a_addr.as_str()}))
        .collect();
    module(
        &nginx,
        "PUT",
        "web",
        Some(&json!({"servers": servers, "generation": set["generation"]})),
    );
    // Raw on purpose: requests left in flight (no answer read) so that nginx counts them active.
    let clients: Vec<TcpStream> = (0..HELD)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", nginx.port())).unwrap();
            write!(
                c,
                "GET {} HTTP/1.1\r\nHost: x\r\n\r\n",
                Nginx::upstream_path("web")
            )
            .unwrap();
            c
        })
        .collect();
    let now = wait("the held requests to be active", || {
        let set = module(&nginx, "GET", "web", None);
        (counts(&set, &hang_addr).0 == HELD).then_some(set)
    });
    let (_, closed_fails, _) = counts(&now, &closed_addr);
    assert!(closed_fails >= 1, "{now}");
    assert_eq!(counts(&now, &a_addr), (0, 0, true), "{now}");
    let expect = [
        (a_addr.as_str(), counts(&now, &a_addr)),
        (hang_addr.as_str(), (HELD, 0, false)),
        (closed_addr.as_str(), counts(&now, &closed_addr)),
    ];

    // The API: `live` per server, equal to what the module says.
    let (status, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(status, 200, "{v}");
    let live = &v["live"];
    assert_eq!(live["error"], Value::Null, "{v}");
    assert_eq!(live["generation"], now["generation"], "{v}");
    for (addr, want) in expect {
        assert_eq!(counts(live, addr), want, "{addr}: {live}");
    }
    // An old module's answer: no health fields are made up.
    for s in live["servers"].as_array().unwrap() {
        assert!(s.get("health").is_none(), "{s}");
    }

    // `binding show`: one line per server.
    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(ok, "{text}");
    eprintln!("tributary binding show web:\n{text}");
    assert!(text.contains("  live in nginx ("), "{text}");
    let line = |addr: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(addr) && l.contains(" active "))
            .unwrap_or_else(|| panic!("no live line for {addr}: {text}"))
            .to_string()
    };
    assert!(
        line(&hang_addr).contains(&format!("active {HELD}  fails 0")),
        "{text}"
    );
    assert!(
        line(&closed_addr).contains(&format!("active 0  fails {closed_fails}")),
        "{text}"
    );
    assert!(
        line(&a_addr).ends_with("active 0  fails 0  [down]"),
        "{text}"
    );
    // Each outcome says which path it took and why.
    assert!(
        text.contains("nginx reloaded (applied by reload, new_upstream: new upstream"),
        "{text}"
    );

    // The binding page: a row and a badge per server.
    let page = binding_page(&d, "web");
    let row = page_row(&page, &hang_addr);
    assert!(
        row.contains(&format!("<td class=\"num active\">{HELD}</td>")),
        "{row}"
    );
    assert!(row.contains("<span class=\"badge up\">up</span>"), "{row}");
    let row = page_row(&page, &closed_addr);
    assert!(
        row.contains(&format!("<td class=\"num fails\">{closed_fails}</td>")),
        "{row}"
    );
    let row = page_row(&page, &a_addr);
    assert!(
        row.contains("<span class=\"badge down\">down</span>"),
        "{row}"
    );
    assert!(
        page.contains("<dd class=\"applied\">reload (new_upstream) — new upstream"),
        "{page}"
    );

    // `/metrics`: the same numbers per server, promtool-clean.
    let series = |name: &str, addr: &str| format!("{name}{{binding=\"web\",server=\"{addr}\"}}");
    let text = wait("the live series in /metrics", || {
        let (status, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
        assert_eq!(status, 200, "{text}");
        (metric(
            &text,
            &series("tributary_server_active_connections", &hang_addr),
        ) == Some(HELD as f64))
        .then_some(text)
    });
    assert_eq!(
        metric(&text, &series("tributary_server_fails", &closed_addr)),
        Some(closed_fails as f64),
        "{text}"
    );
    assert_eq!(
        metric(&text, &series("tributary_server_down", &a_addr)),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, &series("tributary_server_down", &hang_addr)),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "tributary_binding_live_up{binding=\"web\"}"),
        Some(1.0),
        "{text}"
    );
    let complaints = promtool(&text);
    assert_eq!(
        complaints, "",
        "promtool check metrics:\n{complaints}\n{text}"
    );
    // A server change goes live: the CLI's history and the page's say so, and why; the removed
    // server that still holds requests is shown as such.
    let body = json!({"plugin": "static", "provider": "static", "service": "web",
                      "config": {"targets": format!("{a_addr} {closed_addr}")}});
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["last_outcome"]["applied"], "live", "{v}");
    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(
        ok && text.contains("applied live (no reload): server set changed"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "    removed, requests still in flight: {hang_addr} ({HELD} active, removed "
        )),
        "{text}"
    );
    let (_, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(
        v["live"]["retired"][0]["address"],
        hang_addr.as_str(),
        "{v}"
    );
    assert_eq!(v["live"]["retired"][0]["active"], HELD, "{v}");
    let page = binding_page(&d, "web");
    assert!(
        page.contains("<td class=\"applied\">live<span class=\"why\">: server set changed"),
        "{page}"
    );

    drop(clients);

    // The module cannot be reached: every view says so and still answers.
    let mut nginx = nginx;
    nginx.halt();
    let (status, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(status, 200, "{v}");
    let why = v["live"]["error"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(why.contains("cannot reach the live API"), "{v}");
    assert_eq!(v["live"]["servers"], json!([]), "{v}");
    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(
        ok && text.contains("  live state unavailable: cannot reach the live API"),
        "{text}"
    );
    let page = binding_page(&d, "web");
    assert!(
        page.contains("Live state unavailable: cannot reach the live API"),
        "{page}"
    );
    let text = wait("live_up 0 in /metrics", || {
        let (status, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
        assert_eq!(status, 200, "{text}");
        (metric(&text, "tributary_binding_live_up{binding=\"web\"}") == Some(0.0)).then_some(text)
    });
    assert!(
        !text.contains("tributary_server_active_connections{"),
        "{text}"
    );
    d.stop();
}

/// The binding's `probe` setting end to end: the daemon renders `probe …;` into the upstream
/// file, nginx (with the module) accepts it, the module probes each server, and the daemon shows
/// each server's real health in the API, `binding show`, the page and `/metrics`.
#[test]
fn a_binding_with_a_probe_shows_each_servers_real_health_everywhere() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder()
        .workers(2)
        .live_api("")
        .backend("a")
        .start();
    let closed_addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let a_addr = format!("127.0.0.1:{}", nginx.backend_port("a"));
    let api = nginx.live_api_address();
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend_from_slice(&["--apply", "live", "--live-api", &api]);
    let d = Daemon::start_with(root.path(), &nginx, &args);
    let probe = "uri=/ interval=300ms timeout=200ms fails=1 passes=1";
    let body = json!({"plugin": "static", "provider": "static", "service": "web",
                      "config": {"targets": format!("{a_addr} {closed_addr}")},
                      "probe": probe});
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert!(status == 200 || status == 201, "{status}: {v}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    let file = std::fs::read_to_string(nginx.upstreams_dir().join("web.conf")).unwrap();
    assert!(file.contains(&format!("    probe {probe};")), "{file}");

    // The module's own word first, then each view must say the same.
    let set = wait("both servers probed", || {
        let set = module(&nginx, "GET", "web", None);
        let health = |addr: &str| {
            set["servers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["address"] == addr)
                .and_then(|s| s["health"].as_str().map(str::to_string))
        };
        (health(&a_addr).as_deref() == Some("healthy")
            && health(&closed_addr).as_deref() == Some("unhealthy"))
        .then_some(set)
    });
    eprintln!("module: {set}");

    let (status, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(status, 200, "{v}");
    let server = |addr: &str| {
        v["live"]["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["address"] == addr)
            .unwrap_or_else(|| panic!("{addr} not in {v}"))
            .clone()
    };
    assert_eq!(server(&a_addr)["health"], "healthy", "{v}");
    let closed = server(&closed_addr);
    assert_eq!(closed["health"], "unhealthy", "{v}");
    assert!(
        closed["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{closed}"
    );

    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("probe: {probe}")), "{text}");
    let line = |addr: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(addr) && l.contains(" active "))
            .unwrap_or_else(|| panic!("no live line for {addr}: {text}"))
            .to_string()
    };
    assert!(line(&a_addr).contains("[healthy]"), "{text}");
    assert!(line(&closed_addr).contains("[unhealthy: "), "{text}");

    let page = binding_page(&d, "web");
    let a_row = page_row(&page, &a_addr);
    // The state badges (the health checks cell also says "unhealthy N times").
    assert!(
        a_row.contains("<span class=\"badge healthy\">") && !a_row.contains("badge unhealthy"),
        "{a_row}"
    );
    assert!(
        page_row(&page, &closed_addr).contains("<span class=\"badge unhealthy\""),
        "{page}"
    );
    // The probe's counters (the module's `stats.health_checks`): the refused server's
    // probes failed, the healthy one's did not.
    let checks = |row: &str| {
        let cell = "<td class=\"health-checks\">";
        let start = row
            .find(cell)
            .unwrap_or_else(|| panic!("no health checks in {row}"));
        let text = &row[start + cell.len()..];
        text[..text.find('<').unwrap()].to_string()
    };
    let said = checks(page_row(&page, &closed_addr));
    assert!(
        !said.starts_with("0 made") && !said.contains(" 0 failed"),
        "{said}"
    );
    let said = checks(a_row);
    assert!(
        !said.starts_with("0 made") && said.contains(" 0 failed"),
        "{said}"
    );

    let series = |addr: &str, state: &str| {
        format!("tributary_server_health{{binding=\"web\",server=\"{addr}\",state=\"{state}\"}}")
    };
    let text = wait("the health series in /metrics", || {
        let (status, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
        (status == 200 && metric(&text, &series(&closed_addr, "unhealthy")) == Some(1.0))
            .then_some(text)
    });
    assert_eq!(
        metric(&text, &series(&a_addr, "healthy")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, &series(&a_addr, "unhealthy")),
        Some(0.0),
        "{text}"
    );
    let stat = |name: &str, addr: &str| {
        metric(
            &text,
            &format!("{name}{{binding=\"web\",server=\"{addr}\"}}"),
        )
        .unwrap_or_else(|| panic!("no {name} of {addr}: {text}"))
    };
    assert!(stat("tributary_server_health_checks_total", &a_addr) >= 1.0);
    assert_eq!(
        stat("tributary_server_health_check_failures_total", &a_addr),
        0.0
    );
    assert!(stat("tributary_server_health_check_failures_total", &closed_addr) >= 1.0);
    let complaints = promtool(&text);
    assert!(complaints.trim().is_empty(), "promtool:\n{complaints}");
}
