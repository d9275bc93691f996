//! Active health checks (`probe ...;`) on a real nginx with 2 workers: the backends
//! are small TCP servers of the test that answer probes (`/healthz`) with 200, 503, never, or
//! after a close, answer proxied requests (`/`) with their name, and count both.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::case::Case;
use ngx_harness::procfs::{self, Sig};
use ngx_harness::{check, config_test, CaseResult, Failed};

use super::helpers::both_workers_answer;
use super::master::Master;

/// How a backend answers probes.
const OK: u8 = 0;
const FAIL_503: u8 = 1;
const HANG: u8 = 2;

/// A test backend: answers `/healthz` by its mode and `/` with its name; counts both.
struct Backend {
    port: u16,
    mode: Arc<AtomicU8>,
    probes: Arc<Mutex<Vec<Instant>>>,
    /// The `Host` header of the last probe.
    host: Arc<Mutex<String>>,
    proxied: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Backend {
    fn start(name: &'static str) -> Result<Backend, Failed> {
        Backend::start_at(name, 0)
    }

    /// A backend on `port` (0: any free port).
    fn start_at(name: &'static str, port: u16) -> Result<Backend, Failed> {
        let l = TcpListener::bind(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let b = Backend {
            port,
            mode: Arc::new(AtomicU8::new(OK)),
            probes: Arc::new(Mutex::new(Vec::new())),
            host: Arc::default(),
            proxied: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (mode, probes, proxied, stop, host) = (
            b.mode.clone(),
            b.probes.clone(),
            b.proxied.clone(),
            b.stop.clone(),
            b.host.clone(),
        );
        std::thread::spawn(move || {
            let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
            while !stop.load(Ordering::SeqCst) {
                let s = match l.accept() {
                    Ok((s, _)) => s,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                };
                let (mode, probes, proxied, held, host) = (
                    mode.clone(),
                    probes.clone(),
                    proxied.clone(),
                    held.clone(),
                    host.clone(),
                );
                std::thread::spawn(move || serve(s, name, &mode, &probes, &proxied, &held, &host));
            }
        });
        Ok(b)
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// Probes received in `[from, to)`.
    fn probes_between(&self, from: Instant, to: Instant) -> usize {
        let p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().filter(|t| **t >= from && **t < to).count()
    }

    fn probe_times(&self) -> Vec<Instant> {
        self.probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(
    mut s: TcpStream,
    name: &str,
    mode: &AtomicU8,
    probes: &Mutex<Vec<Instant>>,
    proxied: &AtomicUsize,
    held: &Mutex<Vec<TcpStream>>,
    host: &Mutex<String>,
) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut req = Vec::new();
    let mut buf = [0u8; 2048];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    if req.starts_with(b"GET /healthz ") {
        let text = String::from_utf8_lossy(&req).into_owned();
        if let Some(h) = text.lines().find_map(|l| l.strip_prefix("Host: ")) {
            *host.lock().unwrap_or_else(|e| e.into_inner()) = h.to_string();
        }
        probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
        match mode.load(Ordering::SeqCst) {
            OK => {
                let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n");
            }
            FAIL_503 => {
                let _ = s.write_all(b"HTTP/1.0 503 Busy\r\nContent-Length: 5\r\n\r\nbusy\n");
            }
            _ => held.lock().unwrap_or_else(|e| e.into_inner()).push(s),
        }
        return;
    }
    proxied.fetch_add(1, Ordering::SeqCst);
    let body = format!("{name}\n");
    let _ = s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}

/// An nginx with upstream `app` (servers `servers`, probe `probe`) behind the front server.
fn conf(servers: &[u16], probe: &str) -> String {
    let list: String = servers
        .iter()
        .map(|p| format!("server 127.0.0.1:{p} max_fails=0; "))
        .collect();
    format!(
        "upstream app {{ zone app 256k; {list} probe {probe}; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream off; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n"
    )
}

/// The GET view of server `port` of `app`.
fn server_view(m: &Master, port: u16) -> Result<serde_json::Value, Failed> {
    let v = m.get_json("/app")?;
    let want = format!("127.0.0.1:{port}");
    v["servers"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["address"] == want.as_str()).cloned())
        .ok_or_else(|| format!("no server {want} in {v}").into())
}

/// Polls until server `port`'s `health` is `want`; the time it took.
fn until_health(m: &Master, port: u16, want: &str, within: Duration) -> Result<Duration, Failed> {
    let t = Instant::now();
    loop {
        let s = server_view(m, port)?;
        if s["health"] == want {
            return Ok(t.elapsed());
        }
        check(t.elapsed() < within, || {
            format!("server {port} not {want} after {within:?}: {s}")
        })?;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until server `port` has a probe's result: a server starts `healthy` (without
/// `mandatory`), so [`until_health`]`(.., "healthy", ..)` can return before any probe ended.
fn until_probed(m: &Master, port: u16, within: Duration) -> Result<serde_json::Value, Failed> {
    let t = Instant::now();
    loop {
        let s = server_view(m, port)?;
        if s["last_probe_ms_ago"].is_u64() {
            return Ok(s);
        }
        check(t.elapsed() < within, || {
            format!("server {port} not probed after {within:?}: {s}")
        })?;
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn case_failing_server_leaves_and_comes_back() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let m = Master::start(&conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=200ms timeout=150ms fails=2 passes=2",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    until_probed(&m, b1.port, Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1", "b2"], 5)?;
    b1.set(FAIL_503);
    // interval × fails + 1 s
    let took = until_health(&m, b1.port, "unhealthy", Duration::from_millis(1400))?;
    let s = server_view(&m, b1.port)?;
    check(
        s["last_error"] == "status 503" && s["last_status"] == 503,
        || format!("after {took:?}: {s}"),
    )?;
    check(s["probe_fails"].as_u64() >= Some(2), || format!("{s}"))?;
    let before = b1.proxied.load(Ordering::SeqCst);
    both_workers_answer(&m, &["b2"], 20)?;
    check_eq_usize(
        b1.proxied.load(Ordering::SeqCst),
        before,
        "requests proxied to b1 while unhealthy",
    )?;
    b1.set(OK);
    let back = until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    let s = server_view(&m, b1.port)?;
    check(s["probe_passes"].as_u64() >= Some(2), || {
        format!("back after {back:?}: {s}")
    })?;
    let seen = both_workers_answer(&m, &["b1", "b2"], 20)?;
    check(b1.proxied.load(Ordering::SeqCst) > before, || {
        format!("b1 got no request after it came back: {seen:?}")
    })?;
    m.check_workers_unchanged()
}

/// A server the probes bring back is not held out by nginx's passive failure count: the requests
/// that failed during its outage counted `fails` (here `max_fails=1 fail_timeout=10s`), which
/// would keep it skipped for `fail_timeout` after the probes say it is healthy again.
fn case_recovered_server_is_not_held_out_by_its_passive_fails() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let port = b1.port;
    let conf = format!(
        "upstream app {{ zone app 256k; \
         server 127.0.0.1:{port} max_fails=1 fail_timeout=10s; \
         server 127.0.0.1:{} max_fails=1 fail_timeout=10s; \
         probe uri=/healthz interval=1s timeout=500ms fails=1 passes=1; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n",
        b2.port
    );
    let m = Master::start(&conf)?;
    m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    until_health(&m, port, "healthy", Duration::from_secs(3))?;
    both_workers_answer(&m, &["b1", "b2"], 5)?;
    // b1's port closes: the requests nginx sends it before the next probe fail (and go on to b2).
    drop(b1);
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..10 {
        let (_, body) = m.front()?;
        check(body == "b2", || format!("answer {body:?} while b1 is down"))?;
    }
    until_health(&m, port, "unhealthy", Duration::from_secs(3))?;
    let s = server_view(&m, port)?;
    check(s["fails"].as_u64() >= Some(1), || {
        format!("no passive failure was counted for b1: {s}")
    })?;
    let b1 = Backend::start_at("b1", port)?;
    let back = until_health(&m, port, "healthy", Duration::from_secs(3))?;
    let t = Instant::now();
    while b1.proxied.load(Ordering::SeqCst) == 0 {
        check(t.elapsed() < Duration::from_secs(2), || {
            format!(
                "b1 healthy again (after {back:?}) but got no request in 2 s: {}",
                server_view(&m, port)
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            )
        })?;
        m.front()?;
    }
    m.check_workers_unchanged()
}

fn check_eq_usize(got: usize, want: usize, what: &str) -> CaseResult {
    check(got == want, || format!("{what}: {got}, expected {want}"))
}

fn case_hung_server_is_marked_unhealthy_by_the_timeout() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let m = Master::start(&conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=200ms timeout=100ms fails=2 passes=1",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    b1.set(HANG);
    until_health(&m, b1.port, "unhealthy", Duration::from_millis(1400))?;
    let s = server_view(&m, b1.port)?;
    check(
        s["last_error"] == "timeout" && s.get("last_status").is_none(),
        || format!("{s}"),
    )?;
    both_workers_answer(&m, &["b2"], 10)?;
    m.check_workers_unchanged()
}

fn case_closed_port_is_unhealthy_with_type_tcp() -> CaseResult {
    let b2 = Backend::start("b2")?;
    // A port nobody listens on: bound, then closed.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        l.local_addr().map_err(|e| e.to_string())?.port()
    };
    let m = Master::start(&conf(
        &[dead, b2.port],
        "type=tcp interval=200ms timeout=100ms fails=1 passes=1",
    ))?;
    until_health(&m, dead, "unhealthy", Duration::from_millis(1200))?;
    let s = server_view(&m, dead)?;
    check(
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("connect: connection refused")),
        || format!("{s}"),
    )?;
    // Probes of a round are spread over half an interval: b2's may come a little later.
    let t = Instant::now();
    let ok = loop {
        let ok = server_view(&m, b2.port)?;
        if ok["probe_passes"].as_u64() >= Some(1) || t.elapsed() > Duration::from_secs(1) {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    check(
        ok["health"] == "healthy" && ok["probe_passes"].as_u64() >= Some(1),
        || format!("{ok}"),
    )?;
    // type=tcp sends no request: the backend saw connections, never a probe request.
    check(b2.probe_times().is_empty(), || {
        "type=tcp sent a request".into()
    })?;
    both_workers_answer(&m, &["b2"], 10)?;
    m.check_workers_unchanged()
}

/// Probes per server over `n` intervals of `ms` (counted at the backends) must be `n` ± 1.
fn probes_per_interval(b: &[&Backend], n: u32, ms: u64, what: &str) -> CaseResult {
    let from = Instant::now();
    std::thread::sleep(Duration::from_millis(ms) * n);
    let to = Instant::now();
    for (i, x) in b.iter().enumerate() {
        let got = x.probes_between(from, to);
        check(got + 1 >= n as usize && got <= n as usize + 1, || {
            format!("{what}: backend {i} got {got} probes in {n} intervals (one per interval expected, not one per worker)")
        })?;
    }
    Ok(())
}

fn case_one_probe_per_server_per_interval_for_all_workers() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let http = conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=300ms timeout=200ms",
    );
    let mut m = Master::start(&http)?;
    // The case SIGKILLs the probes' owner: the master logs it as "exited on signal 9".
    m.expect_log("exited on signal 9");
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    std::thread::sleep(Duration::from_millis(300));
    probes_per_interval(&[&b1, &b2], 5, 300, "steady")?;

    // SIGKILL the probing worker: another takes over within about an interval.
    let owner = m.get_json("/app")?["probe"]["owner_pid"]
        .as_u64()
        .ok_or("no owner_pid")? as u32;
    check(m.workers().contains(&owner), || {
        format!("owner {owner} is not a worker: {:?}", m.workers())
    })?;
    let last_before = b1.probe_times().last().copied().ok_or("no probe")?;
    check(procfs::signal(owner, Sig::Kill), || {
        format!("kill {owner} failed")
    })?;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(3);
    let first_after = loop {
        if let Some(t) = b1.probe_times().into_iter().find(|t| *t > killed) {
            break t;
        }
        check(Instant::now() < deadline, || {
            "no probe within 3 s of the kill".into()
        })?;
        std::thread::sleep(Duration::from_millis(5));
    };
    let gap = first_after - last_before;
    // The lease goes stale one interval after the last heartbeat; the tick is interval / 4.
    check(gap <= Duration::from_millis(300 * 2 + 200), || {
        format!("probes stopped for {gap:?} after the owner was killed")
    })?;
    std::thread::sleep(Duration::from_millis(300));
    probes_per_interval(&[&b1, &b2], 5, 300, "after SIGKILL of the probing worker")?;
    let new_owner = m.get_json("/app")?["probe"]["owner_pid"]
        .as_u64()
        .unwrap_or(0) as u32;
    check(new_owner != owner && new_owner != 0, || {
        format!("owner still {new_owner}")
    })?;

    // A reload: the new workers probe the new zone, the old ones stop.
    m.reload(&http)?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    std::thread::sleep(Duration::from_millis(300));
    probes_per_interval(&[&b1, &b2], 5, 300, "after nginx -s reload")?;
    eprintln!("probe gap after SIGKILL of the owner: {gap:?}");
    Ok(())
}

fn case_mandatory_server_added_by_put_gets_nothing_before_its_first_pass() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let m = Master::start(&conf(
        &[b1.port],
        "uri=/healthz interval=200ms timeout=100ms fails=1 passes=1 mandatory",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    b2.set(FAIL_503);
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}}]}}"#,
        b1.port, b2.port
    );
    let r = m.put("app", &body)?;
    check(r.status == 200, || {
        format!("PUT: {} {}", r.status, r.text())
    })?;
    // Several intervals with failing probes: checking, no request.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1000) {
        let (_, body) = m.front()?;
        check(body == "b1", || {
            format!("answer {body:?} while b2 is checking")
        })?;
    }
    let s = server_view(&m, b2.port)?;
    check(
        s["health"] == "checking" && s["last_error"] == "status 503",
        || format!("{s}"),
    )?;
    check_eq_usize(
        b2.proxied.load(Ordering::SeqCst),
        0,
        "requests proxied to b2 before its first pass",
    )?;
    b2.set(OK);
    until_health(&m, b2.port, "healthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1", "b2"], 20)?;
    check(b2.proxied.load(Ordering::SeqCst) > 0, || {
        "b2 never got a request after it passed".into()
    })?;
    m.check_workers_unchanged()
}

fn put_servers(m: &Master, servers: &[(u16, u32)]) -> CaseResult {
    let list: Vec<String> = servers
        .iter()
        .map(|(p, w)| format!(r#"{{"address":"127.0.0.1:{p}","weight":{w},"max_fails":0}}"#))
        .collect();
    let r = m.put("app", &format!(r#"{{"servers":[{}]}}"#, list.join(",")))?;
    check(r.status == 200, || {
        format!("PUT: {} {}", r.status, r.text())
    })
}

fn case_health_follows_the_live_set() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let b3 = Backend::start("b3")?;
    let m = Master::start(&conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=200ms timeout=100ms fails=1 passes=3",
    ))?;
    b1.set(FAIL_503);
    until_health(&m, b1.port, "unhealthy", Duration::from_secs(2))?;
    // Kept across a PUT (with another weight): still unhealthy, still skipped.
    put_servers(&m, &[(b1.port, 2), (b2.port, 1)])?;
    let s = server_view(&m, b1.port)?;
    check(s["health"] == "unhealthy" && s["weight"] == 2, || {
        format!("after the PUT: {s}")
    })?;
    let before = b1.proxied.load(Ordering::SeqCst);
    both_workers_answer(&m, &["b2"], 10)?;
    check_eq_usize(
        b1.proxied.load(Ordering::SeqCst),
        before,
        "requests to the kept unhealthy b1",
    )?;
    // Removed: no longer probed. Added: probed from the next round.
    put_servers(&m, &[(b2.port, 1), (b3.port, 1)])?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let late = b1.probes_between(t + Duration::from_millis(300), Instant::now());
    check_eq_usize(late, 0, "probes of the removed b1 after one round")?;
    let new = b3.probes_between(t, Instant::now());
    check(new >= 3, || format!("the added b3 got {new} probes in 1 s"))?;
    let s = server_view(&m, b3.port)?;
    check(s["health"] == "healthy" && s["last_status"] == 200, || {
        format!("{s}")
    })?;
    // Re-added: a new server again (healthy without mandatory), not the old record.
    put_servers(&m, &[(b1.port, 1), (b2.port, 1), (b3.port, 1)])?;
    b1.set(OK);
    std::thread::sleep(Duration::from_millis(300));
    let s = server_view(&m, b1.port)?;
    check(s["health"] == "healthy", || format!("re-added b1: {s}"))?;
    m.check_workers_unchanged()
}

fn case_backup_serves_when_primaries_are_unhealthy_and_none_gives_502() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let http = conf(
        &[b1.port],
        "uri=/healthz interval=200ms timeout=100ms fails=1 passes=1",
    )
    .replace(
        &format!("server 127.0.0.1:{} max_fails=0; ", b1.port),
        &format!(
            "server 127.0.0.1:{} max_fails=0; server 127.0.0.1:{} backup max_fails=0; ",
            b1.port, b2.port
        ),
    );
    let m = Master::start(&http)?;
    m.expect_log("no live upstreams while connecting to upstream");
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1"], 5)?;
    b1.set(FAIL_503);
    until_health(&m, b1.port, "unhealthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b2"], 10)?;
    // Everything unhealthy: nginx's answer when every server is down (502).
    b2.set(FAIL_503);
    until_health(&m, b2.port, "unhealthy", Duration::from_secs(2))?;
    for _ in 0..10 {
        let r = ngx_harness::http_request(m.port(0), "GET", "/", &[], b"")?;
        check(r.status == 502, || {
            format!("every server unhealthy: {} {}", r.status, r.text())
        })?;
    }
    check(m.error_log().contains("no live upstreams"), || {
        "no \"no live upstreams\" line".into()
    })?;
    b1.set(OK);
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1"], 5)?;
    m.check_workers_unchanged()
}

/// Share of `name` among `answers` (time since the PUT answer, body) in `[from, to)`.
fn share(answers: &[(Duration, String)], name: &str, from: Duration, to: Duration) -> (f64, usize) {
    let w: Vec<&(Duration, String)> = answers
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .collect();
    let hits = w.iter().filter(|(_, b)| b == name).count();
    (hits as f64 / w.len().max(1) as f64, w.len())
}

fn case_slow_start_ramps_an_added_server() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    // Probes that a loaded machine cannot fail (1 s to answer, three misses): a server marked
    // unhealthy, or a lease that moves to the other worker when a tick comes late (a heartbeat
    // older than an interval), would change the shares this case measures, not the ramp.
    let m = Master::start(&conf(
        &[b1.port],
        "uri=/healthz interval=1s timeout=1s fails=3 slow_start=4s",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    put_servers(&m, &[(b1.port, 1), (b2.port, 1)])?;
    let t = Instant::now();
    let mut answers = Vec::new();
    let mut remaining_seen = None;
    while t.elapsed() < Duration::from_millis(5500) {
        let (_, body) = m.front()?;
        answers.push((t.elapsed(), body));
        if remaining_seen.is_none() && t.elapsed() > Duration::from_millis(100) {
            remaining_seen = server_view(&m, b2.port)?["slow_start_remaining_ms"].as_u64();
        }
    }
    let steady = 0.5;
    let (first, n1) = share(&answers, "b2", Duration::ZERO, Duration::from_millis(400));
    let (last, n2) = share(
        &answers,
        "b2",
        Duration::from_millis(4300),
        Duration::from_millis(5500),
    );
    let (mid, _) = share(
        &answers,
        "b2",
        Duration::from_millis(1800),
        Duration::from_millis(2200),
    );
    eprintln!(
        "slow start 4s: b2 share {first:.3} of {n1} requests in the first 400 ms, {mid:.3} around 2 s, \
         {last:.3} of {n2} after 4.3 s (steady {steady})"
    );
    check(first <= 0.15 * steady, || {
        format!("b2 got {first:.3} of the first 400 ms (at most 15 % of its steady share {steady})")
    })?;
    check((last - steady).abs() <= 0.05, || {
        format!("b2 got {last:.3} after the ramp, steady share {steady}")
    })?;
    check(mid > first && mid < last, || {
        format!("no ramp: {first:.3}, {mid:.3}, {last:.3}")
    })?;
    check(
        remaining_seen.is_some_and(|r| r > 3000 && r <= 4000),
        || format!("slow_start_remaining_ms right after the PUT: {remaining_seen:?}"),
    )?;
    let s = server_view(&m, b2.port)?;
    check(
        s["slow_start_remaining_ms"] == 0 && s["weight"] == 1,
        || format!("{s}"),
    )?;
    m.check_workers_unchanged()
}

fn case_port_host_and_body_parameters() -> CaseResult {
    let b1 = Backend::start("b1")?;
    // Nothing listens on the servers' own ports: `port=` sends the probes to b1's.
    let dead: Vec<u16> = (0..2)
        .map(|_| {
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            Ok(l.local_addr().map_err(|e| e.to_string())?.port())
        })
        .collect::<Result<_, String>>()?;
    let m = Master::start(&conf(
        &dead,
        &format!(
            "uri=/healthz interval=200ms timeout=100ms port={} host=probe.example body=ok",
            b1.port
        ),
    ))?;
    until_health(&m, dead[0], "healthy", Duration::from_secs(2))?;
    let s = until_probed(&m, dead[1], Duration::from_secs(2))?;
    check(s["last_status"] == 200, || format!("{s}"))?;
    check(!b1.probe_times().is_empty(), || "b1 saw no probe".into())?;
    let host = b1.host.lock().unwrap_or_else(|e| e.into_inner()).clone();
    check(host == "probe.example", || format!("probe Host: {host:?}"))?;
    drop(m);
    // A body without the text fails the probe.
    let m = Master::start(&conf(
        &dead,
        &format!(
            "uri=/healthz interval=200ms timeout=100ms port={} body=ready",
            b1.port
        ),
    ))?;
    until_health(&m, dead[0], "unhealthy", Duration::from_secs(2))?;
    let s = server_view(&m, dead[0])?;
    check(
        s["last_error"] == "body mismatch" && s["last_status"] == 200,
        || format!("{s}"),
    )?;
    Ok(())
}

fn case_refusal_names_the_upstream_file_and_line() -> CaseResult {
    let t = config_test(
        "upstream nz {\n server 127.0.0.1:1;\n probe uri=/h;\n}\nserver { listen 127.0.0.1:{P0}; location / { proxy_pass http://nz; } }",
    )?;
    check(!t.ok, || "nginx -t accepted probe without zone".into())?;
    let line = t
        .stderr
        .lines()
        .find(|l| l.contains("[emerg]"))
        .unwrap_or_default()
        .to_string();
    check(
        line.contains("\"probe\" in upstream \"nz\" needs a \"zone\" in ")
            && line.contains("nginx.conf:"),
        || format!("nginx said: {}", t.stderr),
    )
}

pub fn trials() -> Vec<Case> {
    vec![
        Case::test(
            "health_refusal_names_the_upstream_file_and_line",
            case_refusal_names_the_upstream_file_and_line,
        ),
        Case::emerg(
            "health_probe_refused_with_ip_hash",
            "upstream u { zone u 64k; ip_hash; server 127.0.0.1:1; probe; }\nserver { listen 127.0.0.1:{P0}; location / { proxy_pass http://u; } }",
            "\"probe\" in upstream \"u\" needs round robin or least_conn (with or without keepalive), not ip_hash",
        ),
        Case::emerg(
            "health_probe_refuses_unknown_parameters",
            "upstream u { zone u 64k; server 127.0.0.1:1; probe uri=/h intervall=1s; }",
            "invalid parameter \"intervall=1s\" in \"probe\" directive: the parameters are",
        ),
        Case::emerg(
            "health_probe_refuses_bad_values",
            "upstream u { zone u 64k; server 127.0.0.1:1; probe interval=1s timeout=2s; }",
            "invalid \"probe\" directive: timeout is longer than interval",
        ),
        Case::emerg(
            "health_probe_once_per_upstream",
            "upstream u { zone u 64k; server 127.0.0.1:1; probe; probe; }",
            "\"probe\" directive is duplicate",
        ),
        Case::emerg(
            "health_probe_only_in_an_upstream",
            "server { listen 127.0.0.1:{P0}; probe; }",
            "\"probe\" directive is not allowed here",
        ),
        Case::test(
            "health_slow_start_ramps_an_added_server",
            case_slow_start_ramps_an_added_server,
        ),
        Case::test("health_follows_the_live_set", case_health_follows_the_live_set),
        Case::test(
            "health_port_host_and_body_parameters",
            case_port_host_and_body_parameters,
        ),
        Case::test(
            "health_backup_serves_when_primaries_are_unhealthy_and_none_gives_502",
            case_backup_serves_when_primaries_are_unhealthy_and_none_gives_502,
        ),
        Case::test(
            "health_failing_server_leaves_and_comes_back",
            case_failing_server_leaves_and_comes_back,
        ),
        Case::test(
            "health_recovered_server_is_not_held_out_by_its_passive_fails",
            case_recovered_server_is_not_held_out_by_its_passive_fails,
        ),
        Case::test(
            "health_hung_server_is_marked_unhealthy_by_the_timeout",
            case_hung_server_is_marked_unhealthy_by_the_timeout,
        ),
        Case::test(
            "health_closed_port_is_unhealthy_with_type_tcp",
            case_closed_port_is_unhealthy_with_type_tcp,
        ),
        Case::test(
            "health_one_probe_per_server_per_interval_for_all_workers",
            case_one_probe_per_server_per_interval_for_all_workers,
        ),
        Case::test(
            "health_mandatory_server_added_by_put_gets_nothing_before_its_first_pass",
            case_mandatory_server_added_by_put_gets_nothing_before_its_first_pass,
        ),
    ]
}
