//! Cost of the live upstream API on the request path, measured in one run:
//! - A  upstream `app` with a zone, no `upstreams_api` in the configuration (the module adds nothing);
//! - B  the same with an `upstreams_api` location (every request of `app` goes through the gate and
//!   the balancer wrappers);
//! - C  B while the server set of `app` is replaced every 100 ms by a `PUT` (alternating two sets of
//!   2 of the 4 backends).
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/live-overhead.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench live_overhead
//! ```
//! nginx: master + 2 workers (a fresh nginx per mode and round); load: `wrk -t2` keep-alive, `CONNS`
//! connections. Rounds run A, B, C in turn; the medians of the per-round ratios B/A and C/A are
//! reported for requests/s and p99 latency, next to the absolute medians, and the requests served
//! per CPU-second of the two workers (from `/proc`: the measure to read on a shared machine).
//! Non-2xx answers and socket errors are counted and fail the run (exit 1) when not 0.
//! Environment: `NGINX_BIN`, `ROUNDS` (default 5), `DURATION` (wrk seconds, default 5), `CONNS`
//! (default 32).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::{env_num, median, Res};
use ngx_harness::{free_ports, http_request, Nginx, PORTS};

fn conf(api: bool) -> String {
    let api = if api {
        "location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }"
    } else {
        ""
    };
    format!(
        "upstream app {{ zone app 256k; server 127.0.0.1:{{P1}}; server 127.0.0.1:{{P2}}; keepalive 32; }}\n\
         server {{ listen 127.0.0.1:{{P1}}; location / {{ return 200 \"b1\\n\"; }} }}\n\
         server {{ listen 127.0.0.1:{{P2}}; location / {{ return 200 \"b2\\n\"; }} }}\n\
         server {{ listen 127.0.0.1:{{P3}}; location / {{ return 200 \"b3\\n\"; }} }}\n\
         server {{ listen 127.0.0.1:{{P4}}; location / {{ return 200 \"b4\\n\"; }} }}\n\
         server {{\n  listen 127.0.0.1:{{P0}} reuseport;\n\
         \x20 location / {{ proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_pass http://app; }}\n\
         \x20 {api}\n}}\n"
    )
}

/// One mode's figures in one round.
#[derive(Clone, Copy)]
struct Sample {
    rps: f64,
    p99_ms: f64,
    non_2xx: u64,
    socket_errors: u64,
    per_cpu_s: f64,
}

fn measure(n: &Nginx, duration: u64, conns: usize) -> Res<Sample> {
    let workers = n.workers();
    let t0 = common::ticks(&workers);
    let r = common::wrk(n.port(), "/", 2, conns, duration, None)?;
    let t = common::ticks(&workers) - t0;
    Ok(Sample {
        rps: r.per_second,
        p99_ms: r.p99_ms.unwrap_or(0.0),
        non_2xx: r.non_2xx_3xx,
        socket_errors: r.socket_errors(),
        per_cpu_s: r.requests as f64 / common::ticks_secs(t).max(1e-9),
    })
}

/// Replaces `app`'s set every 100 ms until `stop`; counts the PUTs in `puts`.
fn putter(port: u16, p: Vec<u16>, stop: Arc<AtomicBool>, puts: Arc<AtomicUsize>) {
    let set = |a: u16, b: u16| {
        format!(r#"{{"servers":[{{"address":"127.0.0.1:{a}"}},{{"address":"127.0.0.1:{b}"}}]}}"#)
    };
    let (a, b) = (set(p[1], p[2]), set(p[3], p[4]));
    let mut n = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let body = if n % 2 == 0 { &b } else { &a };
        match http_request(port, "PUT", "/api/app", &[], body.as_bytes()) {
            Ok(r) if r.status == 200 => {}
            Ok(r) => eprintln!("live-overhead: PUT answered {}", r.status),
            Err(e) => eprintln!("live-overhead: PUT failed: {}", e.message().unwrap_or("")),
        }
        n += 1;
        puts.store(n, Ordering::SeqCst);
        common::sleep_ms(100);
    }
}

fn run() -> Res<()> {
    common::module_so()?;
    common::require("live-overhead", &["wrk"], "apt-get install wrk")?;
    let rounds = env_num("ROUNDS", 5usize)?.max(1);
    let duration = env_num("DURATION", 5u64)?.max(1);
    let conns = env_num("CONNS", 32usize)?.max(2);
    let ports = free_ports(PORTS);
    let (conf_a, conf_b) = (conf(false), conf(true));
    let mut by: [Vec<Sample>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let puts = Arc::new(AtomicUsize::new(0));
    for _ in 0..rounds {
        let n = Nginx::options().ports(&ports).start(&conf_a)?;
        by[0].push(measure(&n, duration, conns)?);
        n.stop()?;
        let n = Nginx::options().ports(&ports).start(&conf_b)?;
        by[1].push(measure(&n, duration, conns)?);
        let stop = Arc::new(AtomicBool::new(false));
        puts.store(0, Ordering::SeqCst);
        let t = {
            let (stop, puts, ports) = (stop.clone(), puts.clone(), ports.clone());
            std::thread::spawn(move || putter(ports[0], ports, stop, puts))
        };
        let c = measure(&n, duration, conns);
        stop.store(true, Ordering::SeqCst);
        t.join().map_err(|_| "putter panicked")?;
        by[2].push(c?);
        n.stop()?;
    }
    println!(
        "live-overhead: {rounds} rounds x {duration} s, {conns} keep-alive connections, 2 workers; \
         PUTs in the last C round: {}",
        puts.load(Ordering::SeqCst)
    );
    let names = [
        ("A", "no upstreams_api"),
        ("B", "upstreams_api configured"),
        ("C", "upstreams_api + PUT every 100 ms"),
    ];
    for ((k, name), v) in names.iter().zip(&by) {
        let m = |f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        println!(
            "  {k} {name:<34} req/s {:>9.0}  p99 {:>7.2} ms  req per worker CPU-s {:>8.0}  non-2xx {}  socket errors {}",
            m(|s| s.rps),
            m(|s| s.p99_ms),
            m(|s| s.per_cpu_s),
            v.iter().map(|s| s.non_2xx).sum::<u64>(),
            v.iter().map(|s| s.socket_errors).sum::<u64>(),
        );
    }
    for (k, v) in [("B", &by[1]), ("C", &by[2])] {
        let r = |f: fn(&Sample) -> f64| {
            median(
                &by[0]
                    .iter()
                    .zip(v)
                    .map(|(a, b)| f(b) / f(a))
                    .collect::<Vec<_>>(),
            )
        };
        println!(
            "  ratio {k}/A: req/s {:.3}, p99 {:.3}, requests per worker CPU-second {:.3} \
             (medians of per-round ratios; on a shared machine read the CPU ratio)",
            r(|s| s.rps),
            r(|s| s.p99_ms),
            r(|s| s.per_cpu_s),
        );
    }
    let bad: u64 = by
        .iter()
        .flatten()
        .map(|s| s.non_2xx + s.socket_errors)
        .sum();
    if bad > 0 {
        return Err(format!("{bad} non-2xx answers or socket errors").into());
    }
    Ok(())
}

fn main() {
    common::main("live-overhead", run);
}
