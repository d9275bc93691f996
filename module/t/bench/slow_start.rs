//! Slow start in the issue's form: over at least 100,000 requests, a server added by a
//! `PUT` to an upstream with `probe … slow_start=10s` gets at most 15 % of its steady share in its
//! first second and its steady share (± 3 points) after 10 s. The short form is the live_api
//! test `health_slow_start_ramps_an_added_server` (4 s ramp, a few thousand requests).
//!
//! Command (from the workspace root; the module's release build):
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! cargo bench -p combined-upstreams-tests --bench slow_start
//! ```
//! Environment: `SLOW_START_SECS` (default 10, the ramp), `SLOW_START_REQUESTS` (default
//! 100000, at least this many requests; the run also lasts at least the ramp + 3 s),
//! `SLOW_START_CLIENTS` (default 8 keep-alive connections). `SLOW_START_SECS=0` runs the same
//! without `slow_start` (the control: `b2` takes its full share at once and the first bound is
//! missed).
//!
//! nginx (master + 2 workers, the module) proxies `/` round robin to `app`: `b1` (weight 1) at
//! start, then `b1` and `b2` (weight 1 each: steady share of `b2` 0.5) from one `PUT`. The
//! backends are `return 200` servers of the same nginx. Each answer is recorded with its time
//! since the `PUT`'s answer; the bench prints `b2`'s share per second and exits non-zero when a
//! bound is missed.

#[allow(dead_code)]
#[path = "../tests/e2e/live_api/helpers.rs"]
mod helpers;
#[allow(dead_code)]
#[path = "../tests/e2e/live_api/master.rs"]
mod master;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use master::Master;
use ngx_harness::{Failed, KeepAlive};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn conf(ramp_secs: u64) -> String {
    let slow_start = if ramp_secs == 0 {
        String::new()
    } else {
        format!(" slow_start={ramp_secs}s")
    };
    format!(
        "upstream app {{ zone app 256k; server 127.0.0.1:{{P1}} max_fails=0;\n\
         probe uri=/ interval=200ms timeout=100ms{slow_start}; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream off; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n}}\n\
         server {{ listen 127.0.0.1:{{P1}}; location / {{ return 200 \"b1\"; }} }}\n\
         server {{ listen 127.0.0.1:{{P2}}; location / {{ return 200 \"b2\"; }} }}\n"
    )
}

/// Share of `b2` among the answers in `[from, to)`: (share, answers).
fn share(answers: &[(Duration, bool)], from: Duration, to: Duration) -> (f64, usize) {
    let (mut n, mut hits) = (0usize, 0usize);
    for (t, b2) in answers {
        if *t >= from && *t < to {
            n += 1;
            hits += usize::from(*b2);
        }
    }
    (hits as f64 / n.max(1) as f64, n)
}

fn run() -> Result<bool, Failed> {
    let ramp = env_num("SLOW_START_SECS", 10);
    let want = env_num("SLOW_START_REQUESTS", 100_000) as usize;
    let clients = env_num("SLOW_START_CLIENTS", 8) as usize;
    let m = Master::start(&conf(ramp))?;
    let (b1, b2) = (m.port(1), m.port(2));
    let t = Instant::now();
    loop {
        let v = m.get_json("/app")?;
        if v["servers"][0]["health"] == "healthy" {
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("b1 not healthy: {v}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{b1}","weight":1,"max_fails":0}},{{"address":"127.0.0.1:{b2}","weight":1,"max_fails":0}}]}}"#
    );
    let r = m.put("app", &body)?;
    if r.status != 200 {
        return Err(format!("PUT: {} {}", r.status, r.text()).into());
    }
    let t0 = Instant::now();
    let min_run = Duration::from_secs(ramp + 3);
    let (count, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let port = m.port(0);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (count, stop) = (count.clone(), stop.clone());
            std::thread::spawn(move || -> Result<Vec<(Duration, bool)>, String> {
                let mut conn = KeepAlive::open(port).map_err(|e| format!("{e:?}"))?;
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let r = match conn.get("/") {
                        Ok(r) => r,
                        // nginx closes a keep-alive connection after keepalive_requests.
                        Err(_) => {
                            conn = KeepAlive::open(port).map_err(|e| format!("{e:?}"))?;
                            continue;
                        }
                    };
                    if r.status != 200 {
                        return Err(format!("answer {} {}", r.status, r.text()));
                    }
                    seen.push((t0.elapsed(), r.text().trim() == "b2"));
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok(seen)
            })
        })
        .collect();
    while t0.elapsed() < min_run || count.load(Ordering::Relaxed) < want {
        std::thread::sleep(Duration::from_millis(50));
        if t0.elapsed() > Duration::from_secs(ramp * 10 + 60) {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for h in threads {
        answers.extend(h.join().map_err(|_| "a client panicked")??);
    }
    let took = t0.elapsed();
    let steady = 0.5;
    let s = Duration::from_secs;
    println!(
        "slow_start={ramp}s: {} requests in {:.1} s ({:.0} req/s, {clients} keep-alive clients, \
         2 workers); b2's steady share {steady}",
        answers.len(),
        took.as_secs_f64(),
        answers.len() as f64 / took.as_secs_f64()
    );
    println!("second  requests  b2 share");
    for i in 0..took.as_secs() {
        let (sh, n) = share(&answers, s(i), s(i + 1));
        println!("{i:>6}  {n:>8}  {sh:.3}");
    }
    let (first, n1) = share(&answers, Duration::ZERO, s(1));
    let (after, n2) = share(&answers, s(ramp), took + s(1));
    let first_ok = first <= 0.15 * steady;
    let after_ok = (after - steady).abs() <= 0.03;
    let total_ok = answers.len() >= want;
    println!(
        "first second: {first:.4} of {n1} ({:.1} % of the steady share; bound 15 %) {}",
        100.0 * first / steady,
        if first_ok { "ok" } else { "MISSED" }
    );
    println!(
        "after {ramp} s: {after:.4} of {n2} (bound {steady} ± 0.03) {}",
        if after_ok { "ok" } else { "MISSED" }
    );
    println!(
        "requests: {} (at least {want}) {}",
        answers.len(),
        if total_ok { "ok" } else { "MISSED" }
    );
    let v = m.get_json("/app")?;
    println!("the servers after the run: {}", v["servers"]);
    m.check_workers_unchanged()?;
    Ok(first_ok && after_ok && total_ok)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("slow_start bench: {e:?}");
            std::process::exit(2);
        }
    }
}
