//! The live upstream API under valgrind memcheck: nginx with `master_process on` and 2 workers
//! (every process under memcheck) serves concurrent traffic through upstreams whose server sets are
//! replaced by `PUT`s all the while — growing past 64 servers (the round-robin `tried` bitmap leaves
//! its inline word), shrinking, adding and dropping backups, removing a slow server while requests
//! to it are in flight (retired, then freed), on round robin, least_conn and keepalive upstreams —
//! with one reload in the middle. Fails unless every process's valgrind report says `ERROR SUMMARY:
//! 0 errors`, no `[alert]`/`[crit]`/`[emerg]` or "exited on signal" line was logged, every PUT
//! answered 200 (one answered 503 "reloading, retry" by a worker of the configuration the reload
//! replaces is sent again, as that answer asks, and counted), every proxied request ended 2xx and no retired server is left.
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/live-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench live_memcheck
//! ```
//! Backends: three `return 200` servers of the same nginx, a slow one (answers after 300 ms) and a
//! slow failing one (reads the request, waits 300 ms, closes without an answer, so the request takes
//! its next try later — often after the set changed: "rebalanced"), both threads of the bench.
//! Traffic: 8 loader threads, a new connection per request. Environment: `NGINX_BIN`,
//! `SECONDS_OF_LOAD` (default 60), `KEEP=1` keeps the valgrind logs (directory printed).

mod common;

use std::time::{Duration, Instant};

use common::memcheck::{self, Behaviour, Loaders};
use common::{env_num, env_str, Res, Scratch};
use ngx_harness::{free_ports, Nginx, PORTS};

const CONF: &str = "\
upstream rr { zone live 1m; server 127.0.0.1:{P1}; }
upstream lc { zone live; least_conn; server 127.0.0.1:{P1}; }
upstream ka { zone live; server 127.0.0.1:{P1}; keepalive 8; }
server { listen 127.0.0.1:{P1}; location / { return 200 \"b1\\n\"; } }
server { listen 127.0.0.1:{P2}; location / { return 200 \"b2\\n\"; } }
server { listen 127.0.0.1:{P3}; location / { return 200 \"b3\\n\"; } }
server {
  listen 127.0.0.1:{P0} reuseport;
  access_log {PREFIX}/logs/access.log;
  proxy_next_upstream_tries 0;
  location /rr { proxy_pass http://rr; }
  location /lc { proxy_pass http://lc; }
  location /ka { proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_pass http://ka; }
  location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }
}
";

const UPSTREAMS: [&str; 3] = ["rr", "lc", "ka"];

fn srv(port: u16, extra: &str) -> String {
    format!(r#"{{"address":"127.0.0.1:{port}"{extra}}}"#)
}

/// The server sets the `PUT`s rotate through.
fn sets(p: &[u16], slow: u16, dead: u16, failing: u16) -> Vec<String> {
    let many: Vec<String> = (1..=70)
        .map(|i| format!(r#"{{"address":"127.0.0.{}:{dead}"}}"#, i + 1))
        .chain([srv(p[1], "")])
        .collect();
    vec![
        format!("{},{}", srv(p[1], ""), srv(p[2], "")),
        format!(
            "{},{},{}",
            srv(p[1], ""),
            srv(p[2], ""),
            srv(p[3], r#","backup":true"#)
        ),
        format!("{},{}", srv(slow, ""), srv(p[2], "")),
        many.join(","),
        format!(
            "{},{},{}",
            srv(p[3], ""),
            srv(dead, r#","backup":true"#),
            srv(p[1], r#","backup":true"#)
        ),
        format!("{},{}", srv(p[2], ""), srv(slow, r#","weight":3"#)),
        // The failing backend is in the last set only: a request it fails is rebalanced into the
        // first set, where every server answers; so every request must end in 2xx.
        format!(
            "{},{},{}",
            srv(failing, r#","max_fails":0"#),
            srv(p[3], ""),
            srv(p[2], r#","backup":true"#)
        ),
    ]
}

/// Sum of a numeric field of the three upstreams' API views.
fn field(n: &Nginx, name: &str) -> Res<u64> {
    let mut sum = 0;
    for u in UPSTREAMS {
        let r = n.get_on(0, &format!("/api/{u}"))?;
        let v: serde_json::Value = serde_json::from_slice(&r.body)
            .map_err(|e| format!("GET /api/{u}: {e}: {}", r.text()))?;
        sum += v[name]
            .as_u64()
            .ok_or_else(|| format!("no {name} in /api/{u}: {v}"))?;
    }
    Ok(sum)
}

fn run() -> Res<()> {
    common::module_so()?;
    common::require("live-memcheck", &["valgrind"], "apt-get install valgrind")?;
    let load = env_num("SECONDS_OF_LOAD", 60u64)?;
    let keep = env_str("KEEP", "0") == "1";
    let mut logs = Scratch::new("live-memcheck")?;
    if keep {
        logs.keep();
    }
    let ports = free_ports(PORTS);
    let (slow, failing) = (ports[4], ports[6]);
    memcheck::backend(slow, Behaviour::SlowOk(Duration::from_millis(300)))?;
    memcheck::backend(failing, Behaviour::SlowClose(Duration::from_millis(300)))?;
    let argv = memcheck::valgrind_argv(logs.path(), &[]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut n = Nginx::options()
        .ports(&ports)
        .wrapper(&argv)
        .timeouts(Duration::from_secs(180), Duration::from_secs(120))
        .start(CONF)?;
    let sets = sets(&ports, slow, n.dead_port(), failing);
    let loaders = Loaders::start(8, n.port(), &["/rr", "/lc", "/ka"]);
    let (mut puts, mut failed, mut retried, mut reloaded) = (0u64, 0u64, 0u32, false);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(load) {
        for set in &sets {
            for u in UPSTREAMS {
                let (code, retries) = memcheck::put_set(n.port(), u, set);
                puts += 1;
                retried += retries;
                if code != 200 {
                    failed += 1;
                    eprintln!("PUT {u}: {code}");
                }
            }
            common::sleep_ms(200);
        }
        if !reloaded && start.elapsed() >= Duration::from_secs(load / 2) {
            n.reload(CONF)?;
            reloaded = true;
        }
    }
    loaders.stop();
    // Let in-flight requests end, then no retired server may be left.
    for u in UPSTREAMS {
        memcheck::put_set(n.port(), u, &srv(ports[1], ""));
    }
    common::sleep_ms(1000);
    let (retiring, rebalanced) = (field(&n, "retiring")?, field(&n, "rebalanced")?);
    let access = std::fs::read_to_string(n.prefix().join("logs/access.log")).unwrap_or_default();
    let proxied: Vec<&str> = access
        .lines()
        .filter(|l| {
            UPSTREAMS
                .iter()
                .any(|u| l.contains(&format!(" \"GET /{u}")))
        })
        .collect();
    let not2xx = proxied
        .iter()
        .filter(|l| {
            !l.split_whitespace()
                .nth(8)
                .is_some_and(|s| s.starts_with('2'))
        })
        .count();
    println!(
        "live-memcheck: {} proxied requests ({not2xx} not 2xx), {puts} PUTs ({failed} not 200; {retried} sent again after a reload's 503 \"reloading, retry\"), \
         {} reload, {load}s; requests rebalanced (counted since the reload): {rebalanced}; \
         retired servers left: {retiring}",
        proxied.len(),
        u8::from(reloaded)
    );
    let stopped = n.stop();
    common::sleep_ms(1000);
    let mut ok = memcheck::report_summaries("live-memcheck", logs.path())?;
    if keep {
        println!("live-memcheck: logs in {}", logs.path().display());
    }
    if let Err(e) = stopped {
        println!("{}", e.message().unwrap_or("nginx stop failed"));
        ok = false;
    }
    if !(ok && failed == 0 && retiring == 0 && not2xx == 0) {
        return Err("FAILED".into());
    }
    println!("live-memcheck: OK");
    Ok(())
}

fn main() {
    common::main("live-memcheck", run);
}
