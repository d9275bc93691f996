//! Robustness of the upstrand FFI code:
//! 1. valgrind memcheck: nginx (one process, `master_process off`) with the module runs every
//!    upstrand scenario `PER_SCENARIO` times (4 clients at a time); fails when valgrind reports any
//!    error at all (invalid read/write/free, use of uninitialised memory, …).
//! 2. RSS: a plain nginx worker serves `REQUESTS` requests through a failover walk
//!    (u01 503 -> u02 502 -> u03 200); the worker's RSS after 10 % of them and at the end are
//!    printed (flat = no per-request leak).
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/upstrand-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench upstrand_memcheck
//! ```
//! Needs valgrind, wrk and Debian's echo module (`libnginx-mod-http-echo`). Environment:
//! `NGINX_BIN`, `PER_SCENARIO` (default 200), `REQUESTS` (default 100000), `KEEP=1` keeps the
//! valgrind log (path printed).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::memcheck::{self, Behaviour};
use common::{env_num, env_str, Res, Scratch};
use ngx_harness::{free_ports, procfs, KeepAlive, Nginx, Options, PORTS};

const ECHO_SO: &str = "/usr/lib/nginx/modules/ngx_http_echo_module.so";

/// The configuration; `{LOG}` becomes the access log line of every server (or nothing).
const CONF: &str = r#"
log_format us '$request_uri $status $upstrand_path|$upstrand_addr|$upstrand_status|$upstrand_cache_status|$upstrand_connect_time|$upstrand_header_time|$upstrand_response_length|$upstrand_response_time';
proxy_read_timeout 200ms;
server { listen 127.0.0.1:{P1}; {LOG} location / { return 503 "u01 503\n"; } }
server { listen 127.0.0.1:{P2}; {LOG} location / { add_header X-Accel-Redirect /plain; return 502 "u02 502\n"; } }
server { listen 127.0.0.1:{P3}; {LOG} location / { echo_read_request_body; echo "u03 $request_method $request_body"; }
                               location /ssi { return 200 "[<!--# include virtual=\"/plain\" -->]"; } }
server { listen 127.0.0.1:{P4}; {LOG} root {PREFIX}/html; location / { error_page 503 /err.txt; return 503; } location = /err.txt { internal; } }
server { listen 127.0.0.1:{P5}; {LOG} root {PREFIX}/html; }
server { listen 127.0.0.1:{P6}; {LOG} location / { return 200 "b01 200\n"; } }
upstream u01 { server 127.0.0.1:{P1}; }
upstream u02 { server 127.0.0.1:{P2}; }
upstream u03 { server 127.0.0.1:{P3}; keepalive 8; }
upstream b01 { server 127.0.0.1:{P6}; }
upstream err { server 127.0.0.1:{P4}; }
upstream big { server 127.0.0.1:{P5}; }
upstream hole { server 127.0.0.1:{P7}; }
upstream dead { server 127.0.0.1:{DEAD}; }
upstream s { server 127.0.0.1:{DEAD}; server 127.0.0.1:{P3}; combine_server_singlets _single_ nobackup; }
upstrand walk { upstream ~^u0; upstream b01 backup; order per_request; next_upstream_statuses error timeout non_idempotent 5xx; }
upstrand rr { upstream ~^u0; upstream b01 backup; order start_random; next_upstream_statuses 5xx; }
upstrand rnd { upstream ~^u0; upstream b01 backup; order start_random per_request; next_upstream_statuses 5xx; }
upstrand bl { upstream u01 blacklist_interval=50ms; upstream u02 blacklist_interval=50ms; order per_request; next_upstream_statuses 5xx; }
upstrand ic { upstream u01; upstream u02; order per_request; next_upstream_statuses 5xx; intercept_statuses 5xx /failover; }
upstrand tmo { upstream hole; upstream dead; upstream u03; order per_request; next_upstream_statuses error timeout; next_upstream_timeout 100ms; intercept_statuses 504 /failover; }
upstrand large { upstream err; upstream big; order per_request; next_upstream_statuses 503; }
upstrand first { upstream u03; upstream u01; next_upstream_statuses 5xx; }
upstrand single { upstream ~^s_single_; order per_request; next_upstream_statuses error; }
upstrand post { upstream u01; upstream u03; order per_request; next_upstream_statuses 503; }
server {
  listen 127.0.0.1:{P0};
  {LOG}
  proxy_http_version 1.1; proxy_set_header Connection "";
  dynamic_upstrand $dus1 $arg_a walk;
  location /walk { proxy_pass http://$upstrand_walk; }
  location /rr { proxy_pass http://$upstrand_rr; }
  location /rnd { proxy_pass http://$upstrand_rnd; }
  location /bl { proxy_pass http://$upstrand_bl; }
  location /ic { proxy_pass http://$upstrand_ic; }
  location /tmo { proxy_pass http://$upstrand_tmo; }
  location /big.txt { proxy_pass http://$upstrand_large; }
  location /nobuf/ { proxy_buffering off; proxy_pass http://$upstrand_large; }
  location /gz { gzip on; gzip_min_length 1; gzip_types text/plain; proxy_pass http://$upstrand_walk; }
  location /ep { error_page 502 503 504 /plain; proxy_intercept_errors on; proxy_pass http://$upstrand_walk; }
  location /ssi { ssi on; ssi_types text/plain; proxy_pass http://$upstrand_first; }
  location /single { proxy_pass http://$upstrand_single; }
  location /post { proxy_pass http://$upstrand_post; }
  location /two { set $x $upstrand_rr; proxy_pass http://$upstrand_walk; }
  location /name { return 200 "$upstrand_rr\n"; }
  location /hdr { add_header X-Us $upstrand_walk always; add_header X-Path $upstrand_path always;
                  add_header X-St $upstrand_status always; proxy_pass http://$upstrand_walk; }
  location /hdric { add_header X-Us $upstrand_ic always; add_header X-Path $upstrand_path always;
                    add_header X-St $upstrand_status always; proxy_pass http://$upstrand_ic; }
  location /dyn { dynamic_upstrand $dus2 $arg_b; if ($arg_b) { proxy_pass http://$dus2; break; } proxy_pass http://$dus1; }
  location /plain { return 200 "plain\n"; }
  location /failover { internal; try_files /none @fo; }
  location @fo { error_page 404 = @fo2; return 404; }
  location @fo2 { return 503 "failover\n"; }
}
"#;

/// One client request: method, path, extra headers, body; the client gives up after `limit`
/// (as `curl -m`) and ignores what came back (the valgrind report is the verdict).
#[derive(Clone, Copy)]
struct Req<'a> {
    method: &'a str,
    path: &'a str,
    headers: &'a [(&'a str, &'a str)],
    body: &'a [u8],
    limit: Duration,
}

impl Req<'_> {
    fn get(path: &str) -> Req<'_> {
        Req {
            method: "GET",
            path,
            headers: &[],
            body: b"",
            limit: Duration::from_secs(20),
        }
    }

    fn send(&self, port: u16) {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return;
        };
        let _ = s.set_read_timeout(Some(self.limit));
        let mut req = format!(
            "{} {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n",
            self.method, self.path
        );
        for (n, v) in self.headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        if !self.body.is_empty() {
            req.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(self.body);
        if s.write_all(&bytes).is_err() {
            return;
        }
        let deadline = Instant::now() + self.limit;
        let mut buf = [0u8; 16384];
        while Instant::now() < deadline {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        // Past the limit: the connection is dropped mid-answer.
    }
}

/// `count` requests, 4 at a time (as `xargs -P4 curl`).
fn run_n(port: u16, count: usize, req: Req<'_>) {
    std::thread::scope(|s| {
        for k in 0..4 {
            s.spawn(move || {
                for _ in (k..count).step_by(4) {
                    req.send(port);
                }
            });
        }
    });
}

fn conf(log: bool) -> String {
    let line = if log {
        "access_log {PREFIX}/logs/access.log us;"
    } else {
        ""
    };
    CONF.replace("{LOG}", line)
}

fn write_html(prefix: &Path) -> Res<()> {
    let html = prefix.join("html");
    std::fs::create_dir_all(&html).map_err(|e| format!("mkdir {}: {e}", html.display()))?;
    let big = vec![b'x'; 1 << 20];
    for f in ["big.txt", "err.txt"] {
        std::fs::write(html.join(f), &big).map_err(|e| format!("write {f}: {e}"))?;
    }
    Ok(())
}

/// Phase 1: every scenario under valgrind; returns whether valgrind reported no error.
fn valgrind_phase(ports: &[u16], per: usize, logs: &Path) -> Res<bool> {
    let argv = memcheck::valgrind_argv(logs, &[]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let n = Options::new()
        .single_process() // one process under valgrind: every request's path in one report
        .main(&format!("load_module {ECHO_SO};"))
        .ports(ports)
        .wrapper(&argv)
        .timeouts(Duration::from_secs(180), Duration::from_secs(120))
        .start(&conf(true))?;
    write_html(n.prefix())?;
    let port = n.port();
    let start = Instant::now();
    for path in [
        "/walk",
        "/rr",
        "/rnd",
        "/bl",
        "/ic",
        "/tmo",
        "/big.txt",
        "/nobuf/big.txt",
        "/ep",
        "/ssi/x",
        "/single",
        "/two",
        "/name",
        "/hdr",
        "/hdric",
        "/dyn",
        "/dyn?a=rr",
        "/dyn?b=ic",
        "/dyn?b=nope",
        "/dyn?a=NOPE",
    ] {
        run_n(port, per, Req::get(path));
    }
    let gzip = [("Accept-Encoding", "gzip")];
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    run_n(
        port,
        per,
        Req {
            headers: &gzip,
            ..Req::get("/gz")
        },
    );
    run_n(
        port,
        per,
        Req {
            method: "HEAD",
            ..Req::get("/walk")
        },
    );
    run_n(
        port,
        per,
        Req {
            method: "POST",
            headers: &form,
            body: b"k=v",
            ..Req::get("/post")
        },
    );
    run_n(
        port,
        per,
        Req {
            method: "POST",
            headers: &form,
            body: b"k=v",
            ..Req::get("/walk")
        },
    );
    // Clients that give up mid-answer.
    run_n(
        port,
        per,
        Req {
            limit: Duration::from_millis(50),
            ..Req::get("/big.txt")
        },
    );
    // Keep-alive: four walks on one connection, 20 connections, 4 at a time.
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(move || {
                for _ in 0..5 {
                    if let Ok(mut c) = KeepAlive::open(port) {
                        for p in ["/walk", "/big.txt", "/ic", "/walk"] {
                            if c.get(p).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    let access = std::fs::read_to_string(n.prefix().join("logs/access.log")).unwrap_or_default();
    println!(
        "valgrind phase: {} requests (front and backend) in {} s",
        access.lines().count(),
        start.elapsed().as_secs()
    );
    let stopped = n.stop();
    let mut ok = true;
    for (file, summary) in memcheck::summaries(logs)? {
        let summary = summary.unwrap_or_else(|| "no summary".into());
        println!("valgrind: {file}: {summary}");
        ok &= summary.contains("ERROR SUMMARY: 0 errors");
        let text = std::fs::read_to_string(logs.join(&file)).unwrap_or_default();
        let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
        for l in text.lines() {
            let l = l.split_once("== ").map_or(l, |(_, r)| r);
            let kind = [
                "Invalid read",
                "Invalid write",
                "Invalid free",
                "uninitialised",
                "Mismatched free",
                "overlap",
            ]
            .iter()
            .any(|k| l.contains(k));
            if kind {
                *kinds.entry(l.to_string()).or_default() += 1;
            }
        }
        let ours = text
            .lines()
            .filter(|l| l.contains("combined_upstreams") || l.contains("upstrand"))
            .count();
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!(
            "valgrind: error kinds: {}; stack frames naming the module: {ours}",
            if kinds.is_empty() {
                "none".into()
            } else {
                kinds.join("; ")
            }
        );
    }
    if let Err(e) = stopped {
        println!("{}", e.message().unwrap_or("nginx stop failed"));
        ok = false;
    }
    Ok(ok)
}

/// Runs `wrk` on `/walk` in 1 s runs until about `n` more requests were served.
fn wrk_n(port: u16, n: u64) -> Res<u64> {
    let mut done = 0;
    while done < n {
        done += common::wrk(port, "/walk", 1, 16, 1, None)?.requests;
    }
    Ok(done)
}

fn run() -> Res<()> {
    common::module_so()?;
    common::require(
        "memcheck",
        &["valgrind", "wrk"],
        "apt-get install valgrind wrk",
    )?;
    if !Path::new(ECHO_SO).is_file() {
        return Err(format!("{ECHO_SO} not found (apt-get install libnginx-mod-http-echo)").into());
    }
    let per = env_num("PER_SCENARIO", 200usize)?;
    let requests = env_num("REQUESTS", 100_000u64)?;
    let keep = env_str("KEEP", "0") == "1";
    let mut logs = Scratch::new("upstrand-memcheck")?;
    if keep {
        logs.keep();
    }
    let ports = free_ports(PORTS);
    // A black hole: accepts connections, never answers -> nginx-made 504.
    memcheck::backend(ports[7], Behaviour::Silent(4096))?;

    let clean = valgrind_phase(&ports, per, logs.path())?;
    if keep {
        println!("valgrind logs: {}", logs.path().display());
    }
    if !clean {
        return Err("valgrind reported errors".into());
    }

    // ---- 2. RSS over REQUESTS requests through a failover walk ----
    let n = Nginx::options()
        .workers(1)
        .main(&format!("load_module {ECHO_SO};"))
        .ports(&ports)
        .start(&conf(false))?;
    write_html(n.prefix())?;
    let worker = *n.workers().first().ok_or("no nginx worker process")?;
    let first = wrk_n(n.port(), requests / 10)?;
    let r1 = procfs::rss_kib(worker).ok_or("no RSS of the worker")?;
    let rest = wrk_n(n.port(), requests.saturating_sub(first))?;
    let r2 = procfs::rss_kib(worker).ok_or("no RSS of the worker")?;
    println!(
        "RSS of the worker: {r1} kB after {first} walks, {r2} kB after {} walks \
         (u01 503 -> u02 502 -> u03 200)",
        first + rest
    );
    n.stop()
}

fn main() {
    common::main("memcheck", run);
}
