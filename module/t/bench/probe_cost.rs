//! Cost of active health checks (`probe`): 1,000 servers probed every second.
//! - A  upstream `big` (1,000 servers: 127.0.0.1-250 x 4 ports of a backend nginx) without `probe`;
//! - B  the same with `probe uri=/healthz interval=1s timeout=500ms` (1,000 probes per second).
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/probe-cost.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench probe_cost
//! ```
//! The front nginx: master + 2 workers with the module (a fresh one per mode and round); the
//! backend nginx (master + 1 worker) listens on 4 ports of every loopback address. Per round, A
//! then B: `IDLE` seconds without traffic (the workers' CPU-seconds: in B that is the probing
//! itself), then `wrk` (`DURATION` seconds, `CONNS` keep-alive client connections, a new upstream
//! connection per request) for proxied p99 and requests per worker CPU-second. Reports per-round
//! values and the medians of B/A ratios. Environment: `NGINX_BIN`, `ROUNDS` (default 3), `IDLE`
//! (default 10), `DURATION` (default 10), `CONNS` (default 16).

mod common;

use std::fmt::Write as _;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{env_num, median, Res};
use ngx_harness::{free_ports, Nginx, PORTS};

const BACKEND: &str = "\
server { listen {P1}; listen {P2}; listen {P3}; listen {P4}; keepalive_requests 100000;
  location / { return 200 \"ok\\n\"; } }
";

fn front(probe: &str) -> String {
    let mut servers = String::new();
    for i in 1..=250 {
        for p in 1..=4 {
            let _ = write!(servers, " server 127.0.0.{i}:{{P{p}}};");
        }
    }
    format!(
        "upstream big {{ zone big 4m;{servers} {probe} }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         \x20 location / {{ proxy_pass http://big; }}\n\
         \x20 location /api/ {{ allow 127.0.0.1; deny all; upstreams_api; }} }}\n"
    )
}

/// One mode's figures in one round.
#[derive(Clone, Copy)]
struct Sample {
    idle_cpu_s: f64,
    rps: f64,
    p99_ms: f64,
    non_2xx: u64,
    per_cpu_s: f64,
}

fn measure(n: &Nginx, idle: u64, duration: u64, conns: usize) -> Res<Sample> {
    std::thread::sleep(Duration::from_secs(3));
    let workers = n.workers();
    let t0 = common::ticks(&workers);
    std::thread::sleep(Duration::from_secs(idle));
    let t1 = common::ticks(&workers);
    let r = common::wrk(n.port(), "/", 2, conns, duration, None)?;
    let t2 = common::ticks(&workers);
    Ok(Sample {
        idle_cpu_s: common::ticks_secs(t1 - t0),
        rps: r.per_second,
        p99_ms: r.p99_ms.unwrap_or(0.0),
        non_2xx: r.non_2xx_3xx,
        per_cpu_s: r.requests as f64 / common::ticks_secs(t2 - t1).max(1e-9),
    })
}

/// `rounds probes owner_pid` of the probe and the number of healthy servers, from the API.
fn probe_state(n: &Nginx) -> Res<(String, usize)> {
    let r = n.get_on(0, "/api/big")?;
    let v: serde_json::Value =
        serde_json::from_slice(&r.body).map_err(|e| format!("GET /api/big: {e}: {}", r.text()))?;
    let p = &v["probe"];
    let healthy = v["servers"]
        .as_array()
        .map_or(0, |s| s.iter().filter(|s| s["health"] == "healthy").count());
    Ok((
        format!("{} {} {}", p["rounds"], p["probes"], p["owner_pid"]),
        healthy,
    ))
}

fn run() -> Res<()> {
    common::module_so()?;
    common::require("probe-cost", &["wrk"], "apt-get install wrk")?;
    let rounds = env_num("ROUNDS", 3usize)?.max(1);
    let idle = env_num("IDLE", 10u64)?;
    let duration = env_num("DURATION", 10u64)?.max(1);
    let conns = env_num("CONNS", 16usize)?.max(1);
    let ports = free_ports(PORTS);
    let back = Nginx::options().workers(1).ports(&ports).start(BACKEND)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ports[1..=4]
        .iter()
        .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    {
        if Instant::now() > deadline {
            return Err("the backend nginx does not listen".into());
        }
        common::sleep_ms(20);
    }
    let (conf_a, conf_b) = (
        front(""),
        front("probe uri=/healthz interval=1s timeout=500ms;"),
    );
    let mut by: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
    for r in 1..=rounds {
        let n = Nginx::options().ports(&ports).start(&conf_a)?;
        by[0].push(measure(&n, idle, duration, conns)?);
        n.stop()?;
        let n = Nginx::options().ports(&ports).start(&conf_b)?;
        by[1].push(measure(&n, idle, duration, conns)?);
        let (probes, healthy) = probe_state(&n)?;
        eprintln!(
            "probe-cost: round {r}: B rounds/probes/owner {probes}, healthy servers {healthy}"
        );
        n.stop()?;
    }
    back.stop()?;
    println!(
        "probe-cost: {rounds} rounds; idle {idle} s, then wrk {duration} s with {conns} connections; \
         1,000 servers, 2 workers"
    );
    for ((k, name), v) in [("A", "no probe"), ("B", "probe every 1 s (1,000 probes/s)")]
        .iter()
        .zip(&by)
    {
        for (i, s) in v.iter().enumerate() {
            println!(
                "  {k} round {} {name:<34} idle worker CPU-s {:>6.2}  req/s {:>8.0}  p99 {:>7.2} ms  \
                 req per worker CPU-s {:>8.0}  non-2xx {}",
                i + 1,
                s.idle_cpu_s,
                s.rps,
                s.p99_ms,
                s.per_cpu_s,
                s.non_2xx
            );
        }
    }
    let (a, b) = (&by[0], &by[1]);
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let rat = |f: fn(&Sample) -> f64| {
        median(
            &a.iter()
                .zip(b)
                .map(|(a, b)| f(b) / f(a))
                .collect::<Vec<_>>(),
        )
    };
    let (ia, ib) = (med(a, |s| s.idle_cpu_s), med(b, |s| s.idle_cpu_s));
    println!(
        "  median idle worker CPU-s: A {ia:.2}, B {ib:.2} (probing = {:.1}% of one core)",
        ib / (idle.max(1) as f64) * 100.0
    );
    println!(
        "  median ratios B/A: p99 {:.3}, req/s {:.3}, req per worker CPU-s {:.3}",
        rat(|s| s.p99_ms),
        rat(|s| s.rps),
        rat(|s| s.per_cpu_s)
    );
    Ok(())
}

fn main() {
    common::main("probe-cost", run);
}
