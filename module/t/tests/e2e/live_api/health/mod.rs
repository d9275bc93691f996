//! Active health checks (`probe ...;`) on a real nginx with 2 workers: the backends
//! are small TCP servers of the test that answer probes (`/healthz`) with 200, 503, never, or
//! after a close, answer proxied requests (`/`) with their name, and count both. The backends,
//! the configuration and the polls are here; the cases by theme: a server's health states
//! (`states`), probes across workers and the live set (`probes`), what the probes change in
//! serving and the directive's parameters (`serving`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::case::Case;
use ngx_harness::{check, CaseResult, Failed};

use super::master::Master;

mod probes;
mod serving;
mod states;
use probes::*;
use serving::*;
use states::*;

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

fn check_eq_usize(got: usize, want: usize, what: &str) -> CaseResult {
    check(got == want, || format!("{what}: {got}, expected {want}"))
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
