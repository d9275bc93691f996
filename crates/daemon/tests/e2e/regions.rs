//! "the two halves together": one service in two regions as two live, probed bindings
//! (`api-a`, `api-b`) and one `upstrand api { upstream ~^api-; … }` in front. Every server of
//! region A stops answering (accepts and hangs): requests keep succeeding through region B once
//! the probes marked A's servers unhealthy (no client error after the first probe window), and
//! none fails at all when `next_upstream_statuses` also lists `timeout`; A answers again: its
//! share returns within one probe interval. No reload during the run. The control run without
//! `probe` shows what nginx's passive check alone does: region A stays out of rotation for
//! `fail_timeout` after it recovered.
//!
//! Real daemon (live mode, `static` plugin), real nginx (`master_process on`, two workers, the
//! combined-upstreams module's release `.so`), four small HTTP servers in this test (two per
//! region) that answer `200 region-a` / `200 region-b` or hang. docs/multi-region-failover.md is
//! the guide built on this test.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{json, Value};
use tributary_fakes::daemon::FAST;
use tributary_testkit::{client, Nginx};

/// The bindings' probe: one probe per server every 300 ms, 200 ms to answer, one failure makes
/// a server unhealthy, one pass makes it healthy again.
const PROBE: &str = "uri=/ interval=300ms timeout=200ms fails=1 passes=1";
/// `interval × fails` of [`PROBE`], plus its `timeout` (a probe sent just before the outage only
/// fails when its timeout runs out) and 100 ms for the probe timer's granularity (a quarter of
/// the interval) and the test's own scheduling.
const WINDOW: Duration = Duration::from_millis(300 + 200 + 100);
/// How long region A stays silent.
const OUTAGE: Duration = Duration::from_secs(3);

/// Two servers of one region: they answer `200 region-<name>` while `up`, and otherwise accept,
/// read the request and hang until the region is up again (then close without an answer).
struct Region {
    up: Arc<AtomicBool>,
    addrs: Vec<String>,
}

impl Region {
    fn start(name: &str) -> Region {
        let up = Arc::new(AtomicBool::new(true));
        let addrs = (0..2)
            .map(|_| {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
                let (up, body) = (up.clone(), format!("region-{name}"));
                std::thread::spawn(move || {
                    for stream in listener.incoming().flatten() {
                        let (up, body) = (up.clone(), body.clone());
                        std::thread::spawn(move || serve(stream, &up, &body));
                    }
                });
                addr
            })
            .collect();
        Region { up, addrs }
    }

    fn targets(&self) -> String {
        self.addrs.join(" ")
    }
}

fn serve(mut s: TcpStream, up: &AtomicBool, body: &str) {
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    if !up.load(Ordering::SeqCst) {
        // Silent: hold the connection until the region is up again (or 15 s), then close it.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !up.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        return;
    }
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// One client request's start, status (0: no HTTP answer) and body.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    start: Instant,
    end: Instant,
    status: u16,
    body: String,
}

fn get(port: u16) -> (u16, String) {
    let headers = [("Host", "api")];
    let timeout = Duration::from_secs(15);
    match client::http_request_within(port, "GET", "/api/items", &headers, b"", timeout) {
        Ok(a) => (a.status, a.text()),
        Err(_) => (0, String::new()),
    }
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    samples: Vec<Sample>,
    outage: Instant,
    recovery: Instant,
    /// When a request started after the recovery first got region A's answer (`None`: never).
    a_back: Option<Instant>,
    reloads_during_run: usize,
}

impl Run {
    fn failed(&self, from: Instant, until: Instant) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.start >= from && s.start < until && s.status != 200)
            .collect()
    }

    fn served_by(&self, from: Instant, until: Instant, region: &str) -> (usize, usize) {
        let in_range: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.start >= from && s.start < until)
            .collect();
        let n = in_range
            .iter()
            .filter(|s| s.status == 200 && s.body == region)
            .count();
        (n, in_range.len())
    }

    fn report(&self, label: &str) {
        let far = self.outage + Duration::from_secs(3600);
        let before = self.failed(self.samples[0].start, self.outage).len();
        let window = self.failed(self.outage, self.outage + WINDOW).len();
        let after = self.failed(self.outage + WINDOW, self.recovery).len();
        let rec = self.failed(self.recovery, far).len();
        eprintln!(
            "{label}: {} requests; failed: before the outage {before}, in the first {WINDOW:?} of \
             the outage {window}, later in the outage {after}, after the recovery {rec}; region A \
             answered again {:?} after its recovery; reloads during the run {}",
            self.samples.len(),
            self.a_back.map(|t| t - self.recovery),
            self.reloads_during_run
        );
    }
}

/// The module's `health` of each server of upstream `name` (`GET <loc>/NAME` on its socket).
fn health(nginx: &Nginx, name: &str) -> Vec<String> {
    let a = common::live::module_request(nginx, "GET", &format!("/api/{name}"), None);
    let set: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
    set["servers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s["health"].as_str().unwrap_or("-").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Sets up both regions behind the upstrand (`next_upstream_statuses STATUSES`), runs a steady
/// client loop, silences region A for [`OUTAGE`], brings it back and waits for its answers.
fn run(probe: Option<&str>, statuses: &str) -> Run {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (Region::start("a"), Region::start("b"));
    // The front server listens from nginx's start (a port picked by the builder, a new one if it
    // was taken meanwhile) and gets its location at the reload below: a port picked here and
    // listened on only at that reload, seconds later, was once taken by another test's nginx in
    // between, and every request of the run got that nginx's 404.
    let nginx = Nginx::builder()
        .workers(2)
        .live_api("")
        .named_port("front")
        .http_snippet("include regions/*.conf;")
        .http_snippet("server { listen 127.0.0.1:{port:front}; include regions/front/*.conf; }")
        .conf_file("regions/front/api.conf", "location / { return 503; }\n")
        // Region A's outage on purpose: requests to its hanging servers time out, and once both
        // are marked down the walk finds no live server there before it moves on to region B.
        .expect_log("upstream timed out (110: Connection timed out) while reading response header")
        .expect_log("no live upstreams while connecting to upstream")
        .start();
    let front = nginx.named_port("front");
    let api = nginx.live_api_address();
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend_from_slice(&["--apply", "live", "--live-api", &api]);
    let mut d = Daemon::start_with(root.path(), &nginx, &args);
    for (name, region) in [("api-a", &a), ("api-b", &b)] {
        let mut body = json!({"plugin": "static", "provider": "static", "service": "api",
                              "config": {"targets": region.targets()}});
        if let Some(p) = probe {
            body["probe"] = json!(p);
        }
        let (status, v) = d.api(
            "PUT",
            &format!("/api/v1/bindings/{name}?wait=true"),
            Some(&body.to_string()),
        );
        assert!(status == 200 || status == 201, "{name}: {status}: {v}");
        assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    }
    let file = std::fs::read_to_string(nginx.upstreams_dir().join("api-a.conf")).unwrap();
    assert!(file.contains("upstream api-a {"), "{file}");
    assert_eq!(
        file.contains(&format!("    probe {};", probe.unwrap_or("<none>"))),
        probe.is_some(),
        "{file}"
    );

    // The front: an upstrand over every `api-*` upstream, added once both upstreams exist (an
    // upstrand's regex only sees upstreams defined before it), with one reload before the run.
    let dir = nginx.conf_dir().join("regions");
    std::fs::write(
        dir.join("api.conf"),
        format!(
            "upstrand api {{\n    upstream ~^api-;\n    next_upstream_statuses {statuses};\n}}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("front/api.conf"),
        "location / {\n    proxy_connect_timeout 1s;\n    proxy_read_timeout 1s;\n    \
         proxy_pass http://$upstrand_api;\n}\n",
    )
    .unwrap();
    let reload = nginx.reload_cmd();
    let out = std::process::Command::new(&reload[0])
        .args(&reload[1..])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Until the front answers through the upstrand (before the reload: 503 from the placeholder).
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(front).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the front never served: {:?}",
            get(front)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nginx.wait_settled(Duration::from_secs(10)).unwrap();
    if probe.is_some() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while ["api-a", "api-b"]
            .iter()
            .any(|n| health(&nginx, n) != ["healthy", "healthy"])
        {
            assert!(Instant::now() < deadline, "servers never probed healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let reloads = nginx.reloads_seen();

    // The steady client loop: two clients, one request after the other.
    let samples = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let start = Instant::now();
                    let (status, body) = get(front);
                    samples.lock().unwrap().push(Sample {
                        start,
                        end: Instant::now(),
                        status,
                        body,
                    });
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));

    let outage = Instant::now();
    a.up.store(false, Ordering::SeqCst);
    if probe.is_some() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while health(&nginx, "api-a") != ["unhealthy", "unhealthy"] {
            assert!(
                Instant::now() < deadline,
                "region A never unhealthy: {:?}",
                health(&nginx, "api-a")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "region A unhealthy in the module {:?} after it went silent",
            outage.elapsed()
        );
        assert_eq!(health(&nginx, "api-b"), ["healthy", "healthy"]);
    }
    std::thread::sleep(OUTAGE.saturating_sub(outage.elapsed()));

    let recovery = Instant::now();
    a.up.store(true, Ordering::SeqCst);
    let deadline = recovery + Duration::from_secs(5);
    let a_back = loop {
        let seen = samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.start >= recovery && s.body == "region-a")
            .map(|s| s.start)
            .min();
        if seen.is_some() || Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("after the recovery: api-a {:?}", health(&nginx, "api-a"));
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let reloads_during_run = nginx.reloads_seen() - reloads;
    d.stop();
    let mut samples = samples.lock().unwrap().clone();
    samples.sort_by_key(|s| s.start);
    Run {
        samples,
        outage,
        recovery,
        a_back,
        reloads_during_run,
    }
}

/// The checks both probed runs share: traffic reached both regions before the outage without an
/// error; from [`WINDOW`] after A went silent until it came back, every request succeeded and
/// was answered by region B; after the recovery region A answered again (its share returned) and
/// nothing failed; no reload.
fn assert_failover(r: &Run) {
    let far = r.outage + Duration::from_secs(3600);
    let first = r.samples[0].start;
    let before: Vec<&Sample> = r
        .samples
        .iter()
        .filter(|s| s.end < r.outage && s.status != 200)
        .collect();
    assert_eq!(before, Vec::<&Sample>::new(), "errors before the outage");
    let (by_a, total) = r.served_by(first, r.outage, "region-a");
    assert!(by_a > 0 && by_a < total, "before: A {by_a} of {total}");
    let late = r.failed(r.outage + WINDOW, r.recovery);
    assert_eq!(late, Vec::<&Sample>::new(), "errors after the probe window");
    let (by_b, total) = r.served_by(r.outage + WINDOW, r.recovery, "region-b");
    assert!(total > 10, "too few requests in the outage: {total}");
    assert_eq!(
        by_b, total,
        "in the outage, after the window, only B answers"
    );
    let back = r.a_back.expect("region A's answers never came back");
    assert!(
        back - r.recovery < Duration::from_secs(2),
        "{:?}",
        back - r.recovery
    );
    assert_eq!(r.failed(r.recovery, far), Vec::<&Sample>::new());
    // Its share: the upstrand's round robin sends every other walk to A first.
    let (by_a, total) = r.served_by(back, far, "region-a");
    assert!(
        total >= 10 && by_a * 10 >= total * 3,
        "after the recovery: A {by_a} of {total}"
    );
    assert_eq!(r.reloads_during_run, 0, "no reload during the run");
}

/// `next_upstream_statuses error`: a walk moves on when region A's upstream gives nginx's own 502
/// (once every A server is unhealthy: "no live upstreams", at once), not on a time-out, so only
/// requests sent to A before the probes noticed can fail.
#[test]
fn probed_regions_fail_over_with_no_client_error_after_the_probe_window() {
    let r = run(Some(PROBE), "error");
    r.report("probe, next_upstream_statuses error");
    assert_failover(&r);
}

/// `next_upstream_statuses error timeout`: the requests caught in the probe window time out at
/// A and move on to B as well: no client error at all.
#[test]
fn probed_regions_with_timeouts_listed_lose_no_request_at_all() {
    let r = run(Some(PROBE), "error timeout");
    r.report("probe, next_upstream_statuses error timeout");
    assert_failover(&r);
    let first = r.samples[0].start;
    let far = r.outage + Duration::from_secs(3600);
    assert_eq!(r.failed(first, far), Vec::<&Sample>::new());
}

/// The control: the same bindings without `probe`. Only nginx's passive check is left
/// (`max_fails=1 fail_timeout=10s`, the defaults, counted in the zone for both workers): it learns
/// of the outage from failed user requests and then holds region A's servers out for
/// `fail_timeout` after their last failure, so A's share does not come back when A does — the
/// failover checks of the probed runs fail here.
#[test]
fn without_probes_a_recovered_region_stays_out_of_rotation() {
    let r = run(None, "error");
    r.report("no probe, next_upstream_statuses error");
    assert_eq!(
        r.a_back, None,
        "region A answered again within 5 s of its recovery without probes"
    );
    assert_eq!(r.reloads_during_run, 0);
}
