//! The daemon's side, end to end: the module counts each server's requests, responses
//! by class, failures and times; the daemon reads them (`"id"`, `"stats"` of `GET <loc>/NAME`) and
//! shows them in `/metrics` (labelled `binding`, `server`), the API's `live`, the binding page and
//! `binding show`. Real daemon in live mode, real `static` plugin, real nginx (`master_process
//! on`, two workers, the module's release `.so`), a backend answering 200, one answering 500 after
//! 25 ms and a closed port. A known number of requests is sent; every view must show the counts the clients
//! saw, exactly (a quiet upstream: nothing else reaches it).

use crate::common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::live::{
    binding_page, metric, module, openmetrics_families, page_row, promtool, request, wait,
};
use common::{http, Daemon};
use serde_json::{json, Value};
use tributary_fakes::daemon::FAST;
use tributary_testkit::{free_port, http_get, Nginx};

/// Requests sent through nginx to the upstream.
const SENT: usize = 60;

/// How long the broken backend takes to answer: its average response time is at least this.
const SLOW: Duration = Duration::from_millis(25);

/// A backend that answers every request `500` after [`SLOW`] (one thread per connection, for
/// the life of the test): its address.
fn slow_broken_backend() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                std::thread::sleep(SLOW);
                let _ = c.write_all(
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 6\r\n\
                      Connection: close\r\n\r\nbroken",
                );
            });
        }
    });
    addr
}

/// `prometheus-nginx-exporter -nginx.plus` (Debian's package) reading the Plus-compatible API on
/// `127.0.0.1:port/api`, serving its metrics on a free port; killed on drop.
struct Exporter {
    child: Child,
    port: u16,
}

impl Exporter {
    fn start(plus_port: u16) -> Exporter {
        let port = free_port();
        let child = Command::new("prometheus-nginx-exporter")
            .args([
                "-nginx.plus",
                &format!("-nginx.scrape-uri=http://127.0.0.1:{plus_port}/api"),
                &format!("-web.listen-address=127.0.0.1:{port}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-nginx-exporter is missing: scripts/setup.sh installs it");
        Exporter { child, port }
    }

    /// Its `/metrics` (polled until it answers 200 with the upstream's series, at most 20 s).
    fn scrape(&self) -> String {
        wait("the exporter's upstream series", || {
            match http_get(self.port, "/metrics") {
                Ok((200, text)) if text.contains("nginxplus_upstream_server_requests{") => {
                    Some(text)
                }
                _ => None,
            }
        })
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The exporter's `nginxplus_upstream_server_<name>` of upstream `web`'s server `address` (with
/// `code` for responses).
fn exported(text: &str, name: &str, address: &str, code: Option<&str>) -> Option<f64> {
    let prefix = format!("nginxplus_upstream_server_{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| l.contains(&format!("server=\"{address}\"")) && l.contains("upstream=\"web\""))
        .find(|l| code.is_none_or(|c| l.contains(&format!("code=\"{c}\""))))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The server `address` of a `GET <loc>/NAME` answer (or of the API's `live`).
fn server<'a>(set: &'a Value, address: &str) -> &'a Value {
    set["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == address)
        .unwrap_or_else(|| panic!("{address} not in {set}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn each_servers_statistics_match_the_requests_sent_in_every_view() {
    let root = tempfile::tempdir().unwrap();
    // The module's NGINX Plus-compatible API too, for the official exporter to read.
    let nginx = Nginx::builder()
        .workers(2)
        .live_api("")
        .backend("a")
        .named_port("plus")
        .http_snippet(
            "server { listen 127.0.0.1:{port:plus}; location /api { upstreams_api plus; } }",
        )
        .start();
    let plus_port = nginx.named_port("plus");
    let a = format!("127.0.0.1:{}", nginx.backend_port("a"));
    let broken = slow_broken_backend();
    // A closed port: connecting fails, nginx counts a failed try and passes the request on.
    nginx.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };

    let api = nginx.live_api_address();
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend_from_slice(&["--apply", "live", "--live-api", &api]);
    let mut d = Daemon::start_with(root.path(), &nginx, &args);
    let body = json!({"plugin": "static", "provider": "static", "service": "web",
                      "config": {"targets": format!("{a} {broken} {closed}")}});
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert!(status == 200 || status == 201, "{status}: {v}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");

    // Nothing has reached the upstream yet: every server's counters are 0.
    let before = module(&nginx, "GET", "web", None);
    for s in before["servers"].as_array().unwrap() {
        assert!(s["id"].is_u64(), "a module without ids: {s}");
        assert_eq!(n(&s["stats"]["requests"]), 0, "{s}");
    }

    // The traffic: what the clients saw, by status.
    let mut seen: HashMap<u16, u64> = HashMap::new();
    for _ in 0..SENT {
        let (status, _) = nginx.get(&Nginx::upstream_path("web"));
        *seen.entry(status).or_default() += 1;
    }
    let ok = seen.get(&200).copied().unwrap_or(0);
    let five = seen.get(&500).copied().unwrap_or(0);
    assert_eq!(ok + five, SENT as u64, "answers by status: {seen:?}");
    assert!(ok > 0 && five > 0, "both servers answered: {seen:?}");

    // The module's word: the counts the clients saw, exactly.
    let now = module(&nginx, "GET", "web", None);
    eprintln!("module: {now}");
    let st = |addr: &str| server(&now, addr)["stats"].clone();
    assert_eq!(n(&st(&a)["requests"]), ok, "{now}");
    assert_eq!(n(&st(&a)["responses"]["2xx"]), ok, "{now}");
    assert_eq!(n(&st(&broken)["requests"]), five, "{now}");
    assert_eq!(n(&st(&broken)["responses"]["5xx"]), five, "{now}");
    assert_eq!(n(&st(&closed)["responses"]["total"]), 0, "{now}");
    let closed_fails = n(&st(&closed)["fails"]);
    assert!(closed_fails >= 1, "{now}");

    // The API's `live`: each server's id and statistics, as the module gives them.
    let (status, v) = d.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(status, 200, "{v}");
    let live = &v["live"];
    assert_eq!(live["error"], Value::Null, "{v}");
    for addr in [&a, &broken, &closed] {
        let (mine, theirs) = (server(live, addr), server(&now, addr));
        assert_eq!(mine["id"], theirs["id"], "{addr}: {live}");
        assert_eq!(mine["stats"], theirs["stats"], "{addr}: {live}");
    }

    // `/metrics`: one series per server, the clients' counts; promtool-clean.
    let series = |name: &str, addr: &str| format!("{name}{{binding=\"web\",server=\"{addr}\"}}");
    let class = |addr: &str, code: &str| {
        format!(
            "tributary_server_responses_total{{binding=\"web\",server=\"{addr}\",code=\"{code}\"}}"
        )
    };
    let text = wait("the statistics in /metrics", || {
        let (status, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
        assert_eq!(status, 200, "{text}");
        (metric(&text, &series("tributary_server_requests_total", &a)) == Some(ok as f64))
            .then_some(text)
    });
    assert_eq!(metric(&text, &class(&a, "2xx")), Some(ok as f64), "{text}");
    assert_eq!(metric(&text, &class(&a, "5xx")), Some(0.0), "{text}");
    assert_eq!(
        metric(&text, &series("tributary_server_requests_total", &broken)),
        Some(five as f64),
        "{text}"
    );
    assert_eq!(
        metric(&text, &class(&broken, "5xx")),
        Some(five as f64),
        "{text}"
    );
    assert_eq!(
        metric(&text, &series("tributary_server_failures_total", &closed)),
        Some(closed_fails as f64),
        "{text}"
    );
    for (name, field) in [
        ("tributary_server_sent_bytes_total", "sent"),
        ("tributary_server_received_bytes_total", "received"),
        ("tributary_server_unavailable_total", "unavail"),
    ] {
        for addr in [&a, &broken, &closed] {
            assert_eq!(
                metric(&text, &series(name, addr)),
                Some(n(&st(addr)[field]) as f64),
                "{name} {addr}: {text}"
            );
        }
    }
    assert!(n(&st(&a)["received"]) > 0, "{now}");
    // The slow server's average times are at least SLOW; /metrics gives them in seconds.
    let rt_broken = n(&st(&broken)["response_time"]);
    assert!(rt_broken >= SLOW.as_millis() as u64, "{now}");
    for addr in [&a, &broken] {
        for (name, field) in [
            ("tributary_server_response_time_seconds", "response_time"),
            ("tributary_server_header_time_seconds", "header_time"),
        ] {
            assert_eq!(
                metric(&text, &series(name, addr)),
                Some(n(&st(addr)[field]) as f64 / 1000.0),
                "{name} {addr}: {text}"
            );
        }
    }
    let complaints = promtool(&text);
    assert_eq!(
        complaints, "",
        "promtool check metrics:\n{complaints}\n{text}"
    );
    // The same samples in OpenMetrics (what Prometheus asks for), read by a real parser.
    let bearer = format!("Bearer {}", d.token());
    let (status, _, om) = request(
        d.port,
        "GET",
        "/metrics",
        &[
            ("Authorization", &bearer),
            ("Accept", "application/openmetrics-text; version=1.0.0"),
        ],
        "",
    );
    assert_eq!(status, 200, "{om}");
    let families = openmetrics_families(&om);
    for want in [
        "tributary_server_requests counter",
        "tributary_server_responses counter",
        "tributary_server_failures counter",
        "tributary_server_sent_bytes counter",
        "tributary_server_response_time_seconds gauge",
    ] {
        assert!(families.iter().any(|f| f == want), "{want}: {families:?}");
    }
    assert_eq!(
        metric(&om, &class(&broken, "5xx")),
        Some(five as f64),
        "{om}"
    );

    // The official exporter scraping the module's Plus-compatible API directly
    // (docs/operations.md): its per-server series carry the same numbers, times in ms.
    let exporter = Exporter::start(plus_port);
    let plus = exporter.scrape();
    for addr in [&a, &broken, &closed] {
        for (theirs, ours, code) in [
            ("requests", "tributary_server_requests_total", None),
            ("responses", "tributary_server_responses_total", Some("2xx")),
            ("responses", "tributary_server_responses_total", Some("5xx")),
            ("fails", "tributary_server_failures_total", None),
            ("unavail", "tributary_server_unavailable_total", None),
            ("sent", "tributary_server_sent_bytes_total", None),
            ("received", "tributary_server_received_bytes_total", None),
        ] {
            let mine = match code {
                Some(c) => metric(&text, &class(addr, c)),
                None => metric(&text, &series(ours, addr)),
            };
            assert_eq!(
                exported(&plus, theirs, addr, code),
                mine,
                "{theirs} {code:?} of {addr}: exporter\n{plus}\nours\n{text}"
            );
        }
        let ms = exported(&plus, "response_time", addr, None);
        let ours = metric(
            &text,
            &series("tributary_server_response_time_seconds", addr),
        );
        assert_eq!(ms.map(|v| v / 1000.0), ours, "{addr}: {plus}");
    }
    assert_eq!(
        exported(&plus, "responses", &broken, Some("5xx")),
        Some(five as f64)
    );
    drop(exporter);

    // The binding page: per server requests, 5xx, failed tries, response time.
    let page = binding_page(&d, "web");
    let row = page_row(&page, &a);
    assert!(
        row.contains(&format!("<td class=\"num requests\">{ok}</td>")),
        "{row}"
    );
    assert!(row.contains("<td class=\"num r5xx\">0</td>"), "{row}");
    let rt = n(&st(&a)["response_time"]);
    assert!(
        row.contains(&format!("<td class=\"num response-time\">{rt} ms</td>")),
        "{row}"
    );
    let row = page_row(&page, &broken);
    assert!(
        row.contains(&format!("<td class=\"num r5xx\">{five}</td>")),
        "{row}"
    );
    assert!(
        row.contains(&format!(
            "<td class=\"num response-time\">{rt_broken} ms</td>"
        )),
        "{row}"
    );
    let row = page_row(&page, &closed);
    assert!(
        row.contains(&format!(
            "<td class=\"num failed-tries\">{closed_fails}</td>"
        )),
        "{row}"
    );

    // `binding show`: under each server its id and statistics.
    let (okcli, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(okcli, "{text}");
    eprintln!("tributary binding show web:\n{text}");
    let id_a = n(&server(&now, &a)["id"]);
    assert!(
        text.contains(&format!(
            "      id {id_a}  requests {ok}  5xx 0  failed tries 0  response time {rt} ms"
        )),
        "{text}"
    );
    let id_b = n(&server(&now, &broken)["id"]);
    assert!(
        text.contains(&format!(
            "      id {id_b}  requests {five}  5xx {five}  failed tries 0  \
             response time {rt_broken} ms"
        )),
        "{text}"
    );

    // A live change (the closed port leaves the set through the module's API, no reload): the
    // servers that stay keep their ids and counts, the one that left has no series any more.
    let body = json!({"plugin": "static", "provider": "static", "service": "web",
                      "config": {"targets": format!("{a} {broken}")}});
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["last_outcome"]["applied"], "live", "{v}");
    let (_, v) = d.api("GET", "/api/v1/bindings/web", None);
    let kept = server(&v["live"], &a);
    assert_eq!(kept["id"], server(&now, &a)["id"], "{v}");
    assert_eq!(n(&kept["stats"]["requests"]), ok, "{v}");
    let text = wait("the removed server's series gone from /metrics", || {
        let (_, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
        (!text.contains(&format!("server=\"{closed}\""))).then_some(text)
    });
    assert_eq!(
        metric(&text, &series("tributary_server_requests_total", &a)),
        Some(ok as f64),
        "{text}"
    );
    d.stop();
}
