//! Upstrand request handling as ratios against plain `proxy_pass` to the same backend measured in
//! the same run (compare the ratios, not the absolute numbers).
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/upstrand.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench upstrand
//! ```
//! One nginx worker pinned to CPU 0 (`worker_cpu_affinity`), `wrk` pinned to CPU 1 (`taskset`).
//! Backends are `return` servers of the same nginx, reached over keep-alive connections. Endpoints:
//! - `plain`      `proxy_pass http://ok;` (baseline)
//! - `var`        `set $u ok; proxy_pass http://$u;` (reported: nginx's own cost of a variable
//!   proxy_pass, which every upstrand request pays)
//! - `first`      upstrand whose first upstream answers 200 (target ratio >= 0.95)
//! - `hop`        one failover hop 503 -> 200 (target ratio >= 0.45)
//! - `intercept`  both upstreams 503, then the `intercept_statuses` location (reported)
//!
//! Each round measures the endpoints one after the other (`DURATION` seconds each) and computes
//! ratios against that round's baseline; the table shows medians over `ROUNDS`. Two measures: wrk
//! req/s (noisy when other work shares the machine) and requests per worker CPU-second (requests
//! served / CPU time the worker spent on them, from `/proc`: steady on a busy machine). Any non-2xx
//! answer or socket error fails the run. Environment: `NGINX_BIN`, `ROUNDS` (default 5),
//! `DURATION` (default 5), `CONNS` (default 32).

mod common;

use std::collections::BTreeMap;

use common::{env_num, median, Res};
use ngx_harness::Nginx;

const CONF: &str = "\
server { listen 127.0.0.1:{P1}; return 200 \"ok\\n\"; }
server { listen 127.0.0.1:{P2}; return 503 \"busy\\n\"; }
server { listen 127.0.0.1:{P3}; return 503 \"busy too\\n\"; }
upstream ok    { server 127.0.0.1:{P1}; keepalive 32; }
upstream busy  { server 127.0.0.1:{P2}; keepalive 32; }
upstream busy2 { server 127.0.0.1:{P3}; keepalive 32; }
upstrand first     { upstream ok; upstream busy; order per_request; next_upstream_statuses 5xx; }
upstrand hop       { upstream busy; upstream ok; order per_request; next_upstream_statuses 5xx; }
upstrand intercept { upstream busy; upstream busy2; order per_request; next_upstream_statuses 5xx;
                     intercept_statuses 5xx /failover; }
server {
  listen 127.0.0.1:{P0};
  proxy_http_version 1.1; proxy_set_header Connection \"\";
  location /plain     { proxy_pass http://ok; }
  location /var       { set $u ok; proxy_pass http://$u; }
  location /first     { proxy_pass http://$upstrand_first; }
  location /hop       { proxy_pass http://$upstrand_hop; }
  location /intercept { proxy_pass http://$upstrand_intercept; }
  location /failover  { internal; return 200 \"failover\\n\"; }
}
";

const ENDPOINTS: [&str; 5] = ["plain", "var", "first", "hop", "intercept"];

/// One wrk run on CPU 1: (req/s, requests per worker CPU-second); fails on a bad answer.
fn measure(n: &Nginx, worker: u32, e: &str, conns: usize, secs: u64) -> Res<(f64, f64)> {
    let t0 = common::ticks(&[worker]);
    let r = common::wrk(n.port(), &format!("/{e}"), 1, conns, secs, Some(1))?;
    let t = common::ticks(&[worker]) - t0;
    if r.non_2xx_3xx > 0 || r.socket_errors() > 0 {
        return Err(format!("/{e}: {}", r.output).into());
    }
    let cpu = if t > 0 {
        r.requests as f64 / common::ticks_secs(t)
    } else {
        0.0
    };
    Ok((r.per_second, cpu))
}

fn run() -> Res<()> {
    let so = common::module_so()?;
    common::require(
        "bench",
        &["wrk", "taskset"],
        "apt-get install wrk util-linux",
    )?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 {
        return Err("needs 2 CPUs (nginx and wrk on separate cores)".into());
    }
    let rounds = env_num("ROUNDS", 5usize)?.max(1);
    let duration = env_num("DURATION", 5u64)?.max(1);
    let conns = env_num("CONNS", 32usize)?.max(1);

    let n = Nginx::options()
        .workers(1)
        .main("worker_cpu_affinity 01;")
        .start(CONF)?;
    let worker = *n.workers().first().ok_or("no nginx worker process")?;
    for e in ENDPOINTS {
        let r = n.get_on(0, &format!("/{e}"))?;
        if r.status != 200 {
            return Err(format!("/{e} answered {}", r.status).into());
        }
    }
    for e in ENDPOINTS {
        measure(&n, worker, e, conns, 2)?; // warm-up
    }
    let mut rps: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut rat: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut crat: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in 1..=rounds {
        let mut line = format!("round {r}:");
        let mut this = BTreeMap::new();
        for e in ENDPOINTS {
            let (v, c) = measure(&n, worker, e, conns, duration)?;
            rps.entry(e).or_default().push(v);
            cpu.entry(e).or_default().push(c);
            this.insert(e, (v, c));
            line.push_str(&format!(" {e} {v:.2} ({c:.0}/cpu-s)"));
        }
        let (base, cbase) = this["plain"];
        for e in &ENDPOINTS[1..] {
            rat.entry(e).or_default().push(this[e].0 / base);
            crat.entry(e).or_default().push(this[e].1 / cbase);
        }
        println!("{line} req/s");
    }
    n.stop()?;

    println!();
    println!("module: {}", so.display());
    println!(
        "{:<40} {:>9} {:>7} {:>12} {:>7} {:>7}",
        "endpoint (medians)", "req/s", "ratio", "req/cpu-s", "ratio", "target"
    );
    let ratio = |m: &BTreeMap<&str, Vec<f64>>, e: &str| {
        m.get(e)
            .map_or_else(|| "1.000".to_string(), |v| format!("{:.3}", median(v)))
    };
    for (label, e, target) in [
        ("plain proxy_pass (baseline)", "plain", "-"),
        ("proxy_pass http://$u (set $u ok)", "var", "report"),
        ("upstrand, first upstream answers 200", "first", ">=0.95"),
        ("upstrand, one failover hop 503 -> 200", "hop", ">=0.45"),
        (
            "upstrand, 503, 503, intercept location",
            "intercept",
            "report",
        ),
    ] {
        println!(
            "{label:<40} {:>9.0} {:>7} {:>12.0} {:>7} {target:>7}",
            median(&rps[e]),
            ratio(&rat, e),
            median(&cpu[e]),
            ratio(&crat, e),
        );
    }
    Ok(())
}

fn main() {
    common::main("bench", run);
}
