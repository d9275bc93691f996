//! Active health checks (`probe`) under valgrind memcheck: nginx with `master_process on` and 2
//! workers (every process under memcheck) probes every 100 ms an upstream whose servers answer 200,
//! 503, never (a listener that accepts and stays silent: timeouts) or refuse the connection, while
//! `PUT`s replace the set every 300 ms (servers added, kept, removed) and requests go through it (the
//! least_conn upstream with `slow_start=1s`, so added servers ramp), with one reload in the middle.
//! Fails unless every process's valgrind report says `ERROR SUMMARY: 0 errors`, no
//! `[alert]`/`[crit]`/`[emerg]` or "exited on signal" line was logged, every PUT answered 200 (one
//! answered 503 "reloading, retry" by a worker of the replaced configuration is sent again), and
//! the zone's slab figures did not grow from after two passes over the sets (after the reload) to
//! the end.
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/probe-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench probe_memcheck
//! ```
//! Environment: `NGINX_BIN`, `SECONDS_OF_LOAD` (default 40), `KEEP=1` keeps the valgrind logs
//! (directory printed), `VALGRIND_EXTRA` (more valgrind options, split at spaces).

mod common;

use std::time::{Duration, Instant};

use common::memcheck::{self, Behaviour, Loaders};
use common::{env_num, env_str, Res, Scratch};
use ngx_harness::{free_ports, Nginx, PORTS};

const CONF: &str = "\
upstream app { zone live 1m; server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; server 127.0.0.1:{P4};
  probe uri=/healthz interval=100ms timeout=80ms fails=2 passes=2 mandatory; }
upstream tcp { zone live; least_conn; server 127.0.0.1:{P1}; server 127.0.0.1:{DEAD};
  probe type=tcp interval=100ms timeout=50ms slow_start=1s; }
server { listen 127.0.0.1:{P1}; location / { return 200 \"b1\\n\"; } }
server { listen 127.0.0.1:{P2}; location /healthz { return 503; } location / { return 200 \"b2\\n\"; } }
server { listen 127.0.0.1:{P3}; location /healthz { return 200 \"ok ready\\n\"; } location / { return 200 \"b3\\n\"; } }
server {
  listen 127.0.0.1:{P0} reuseport;
  location /app { proxy_pass http://app; }
  location /tcp { proxy_pass http://tcp; }
  location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }
}
";

const UPSTREAMS: [&str; 2] = ["app", "tcp"];

fn srv(port: u16, extra: &str) -> String {
    format!(r#"{{"address":"127.0.0.1:{port}"{extra}}}"#)
}

struct Run {
    port: u16,
    sets: Vec<String>,
    puts: u64,
    failed: u64,
    retried: u32,
}

impl Run {
    /// One pass over the sets: each `PUT` to both upstreams, 300 ms apart.
    fn pass(&mut self) {
        for set in &self.sets {
            for u in UPSTREAMS {
                let (code, retries) = memcheck::put_set(self.port, u, set);
                self.puts += 1;
                self.retried += retries;
                if code != 200 {
                    self.failed += 1;
                    eprintln!("PUT {u}: {code}");
                }
            }
            common::sleep_ms(300);
        }
    }

    fn json(&self, path: &str) -> Res<serde_json::Value> {
        let r = ngx_harness::http_get(self.port, path, &[])?;
        Ok(
            serde_json::from_slice(&r.body)
                .map_err(|e| format!("GET {path}: {e}: {}", r.text()))?,
        )
    }

    /// The zone's `(chunks_used, pages_free)` once no removed server is still held by a request
    /// (waits up to 15 s: a request to the silent backend lasts until the client gives up).
    fn slab(&self) -> Res<(i64, i64)> {
        for _ in 0..150 {
            let mut retiring = 0;
            for u in UPSTREAMS {
                retiring += self.json(&format!("/api/{u}"))?["retiring"]
                    .as_i64()
                    .unwrap_or(0);
            }
            if retiring == 0 {
                break;
            }
            common::sleep_ms(100);
        }
        let v = self.json("/api/app?slab")?;
        match (v["chunks_used"].as_i64(), v["pages_free"].as_i64()) {
            (Some(c), Some(p)) => Ok((c, p)),
            _ => Err(format!("no slab figures in {v}").into()),
        }
    }
}

fn run() -> Res<()> {
    common::module_so()?;
    common::require("probe-memcheck", &["valgrind"], "apt-get install valgrind")?;
    let load = env_num("SECONDS_OF_LOAD", 40u64)?;
    let keep = env_str("KEEP", "0") == "1";
    let extra: Vec<String> = env_str("VALGRIND_EXTRA", "")
        .split_whitespace()
        .map(String::from)
        .collect();
    let mut logs = Scratch::new("probe-memcheck")?;
    if keep {
        logs.keep();
    }
    let ports = free_ports(PORTS);
    let silent = ports[4];
    memcheck::backend(silent, Behaviour::Silent(400))?;
    let argv = memcheck::valgrind_argv(logs.path(), &extra);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut n = Nginx::options()
        .ports(&ports)
        .wrapper(&argv)
        .timeouts(Duration::from_secs(180), Duration::from_secs(120))
        .start(CONF)?;
    let (p, dead) = (&ports, n.dead_port());
    let sets = vec![
        format!("{},{}", srv(p[1], ""), srv(p[2], "")),
        format!(
            "{},{},{},{}",
            srv(p[1], ""),
            srv(p[2], ""),
            srv(p[3], ""),
            srv(silent, "")
        ),
        format!(
            "{},{},{}",
            srv(p[3], ""),
            srv(dead, ""),
            srv(p[1], r#","backup":true"#)
        ),
        format!(
            "{},{},{}",
            srv(p[1], ""),
            srv(p[2], r#","weight":3"#),
            srv(silent, r#","backup":true"#)
        ),
    ];
    let loaders = Loaders::start(1, n.port(), &["/app", "/tcp"]);
    let mut run = Run {
        port: n.port(),
        sets,
        puts: 0,
        failed: 0,
        retried: 0,
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(load / 2) {
        run.pass();
    }
    n.reload(CONF)?;
    std::thread::sleep(Duration::from_secs(5));
    run.pass();
    run.pass();
    common::sleep_ms(1000);
    let first = run.slab()?;
    while start.elapsed() < Duration::from_secs(load) {
        run.pass();
    }
    common::sleep_ms(1000);
    let last = run.slab()?;
    let probe = run.json("/api/app")?["probe"].clone();
    loaders.stop();
    println!(
        "probe-memcheck: {} PUTs ({} not 200; {} sent again after a reload's 503 \"reloading, retry\"), 1 reload, {load}s; after the reload: rounds/probes \
         of app {} {}; slab chunks_used/pages_free after 2 passes: {} {}, at the end: {} {}",
        run.puts, run.failed, run.retried, probe["rounds"], probe["probes"], first.0, first.1, last.0, last.1
    );
    let stopped = n.stop();
    common::sleep_ms(1000);
    let mut ok = memcheck::report_summaries("probe-memcheck", logs.path())?;
    if keep {
        println!("probe-memcheck: logs in {}", logs.path().display());
    }
    if let Err(e) = stopped {
        println!("{}", e.message().unwrap_or("nginx stop failed"));
        ok = false;
    }
    // No growth: as many chunks in use or fewer; free pages at most one fewer (the record tables
    // are made new before the old one is freed, so which page a size class holds can move by one).
    if !(last.0 <= first.0 && last.1 >= first.1 - 1) {
        eprintln!(
            "probe-memcheck: slab figures grew: {} {} -> {} {}",
            first.0, first.1, last.0, last.1
        );
        ok = false;
    }
    if !(ok && run.failed == 0) {
        return Err("FAILED".into());
    }
    println!("probe-memcheck: OK");
    Ok(())
}

fn main() {
    common::main("probe-memcheck", run);
}
