//! Refresh-spread benchmark: 10,000 bindings on the static plugin. Measures the daemon's peak RSS
//! and when each plugin call happens, with the default refresh jitter and, as the baseline in the
//! same run, with `--refresh-jitter-pct 0`.
//!
//! Command (from the workspace root; release builds of the daemon and of the static plugin):
//! ```sh
//! cargo build --release -p tributary-plugin-static && cargo bench -p tributary --bench spread
//! ```
//! Environment: `BENCH_BINDINGS` (default 10000), `BENCH_INTERVAL_SECS` (default 20, the
//! bindings' refresh interval; at least 10), `BENCH_BASELINE=0` skips the run without jitter.
//!
//! For each setting it starts a real nginx (testkit) and the release `tributary serve` (its
//! defaults: 16 calls in flight per plugin), creates the bindings in one bulk request, waits until
//! every one has been applied and has been refreshed once more on its schedule, then restarts the
//! daemon (every stored binding resolves again at start). The times of the plugin calls come from
//! the plugin host's `request sent` / `answer received` trace events in the daemon's log
//! (`RUST_LOG=warn,tributary_plugin_host=trace`). Reported per round (creation, first scheduled
//! refresh, restart): first and last call relative to the round's start, the busiest second and
//! the most calls in flight at once; a per-second histogram of the first scheduled refreshes; the
//! daemon's peak RSS (VmHWM) for each process.

#[path = "../tests/e2e/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tributary_store::now_ms;
use tributary_testkit::Nginx;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Milliseconds since the epoch of a log line's RFC 3339 timestamp (`2026-12-01T07:50:01.123456Z`).
fn line_ms(line: &str) -> Option<i64> {
    let ts = line.split_whitespace().next()?;
    let t = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    line[start..].split_whitespace().next()
}

/// A plugin call seen in the log.
#[derive(Debug, Clone, Copy)]
enum Event {
    Sent { at: i64 },
    Answered { at: i64 },
}

/// The calls of the daemon's log: per service the send times, and every send/answer in order.
fn calls(log: &str) -> (HashMap<String, Vec<i64>>, Vec<Event>) {
    let mut by_service: HashMap<String, Vec<i64>> = HashMap::new();
    let mut events = Vec::new();
    for line in log.lines() {
        if line.contains("request sent") {
            let (Some(at), Some(svc)) = (line_ms(line), field(line, "service")) else {
                continue;
            };
            by_service.entry(svc.to_string()).or_default().push(at);
            events.push(Event::Sent { at });
        } else if line.contains("answer received") {
            if let Some(at) = line_ms(line) {
                events.push(Event::Answered { at });
            }
        }
    }
    (by_service, events)
}

/// Most calls in flight at once between `from` and `to` (ms).
fn max_in_flight(events: &[Event], from: i64, to: i64) -> i64 {
    let mut ev: Vec<(i64, i64)> = events
        .iter()
        .filter_map(|e| match *e {
            Event::Sent { at } if at >= from && at <= to => Some((at, 1)),
            Event::Answered { at } if at >= from && at <= to => Some((at, -1)),
            _ => None,
        })
        .collect();
    // At equal times, answers first (an answer logged in the same microsecond frees a place).
    ev.sort();
    let (mut cur, mut max) = (0i64, 0i64);
    for (_, d) in ev {
        cur = (cur + d).max(0);
        max = max.max(cur);
    }
    max
}

struct Round {
    name: String,
    /// Call times relative to the round's start, in ms.
    times: Vec<i64>,
    in_flight: i64,
}

impl Round {
    fn per_second(&self) -> Vec<usize> {
        let last = self.times.iter().copied().max().unwrap_or(0).max(0) as usize / 1000;
        let mut h = vec![0usize; last + 1];
        for t in &self.times {
            h[(*t).max(0) as usize / 1000] += 1;
        }
        h
    }

    fn row(&self) -> String {
        let min = self.times.iter().copied().min().unwrap_or(0) as f64 / 1000.0;
        let max = self.times.iter().copied().max().unwrap_or(0) as f64 / 1000.0;
        let h = self.per_second();
        let busiest = h.iter().copied().max().unwrap_or(0);
        let used = h.iter().filter(|n| **n > 0).count();
        format!(
            "| {:<44} | {:>6} | {:>8.2} s | {:>8.2} s | {:>8.2} s | {:>9} | {:>6} | {:>9} |",
            self.name,
            self.times.len(),
            min,
            max,
            max - min,
            busiest,
            used,
            self.in_flight
        )
    }
}

fn bulk(daemon: &common::Daemon, n: u64, port: u16, interval: u64) {
    let bindings: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "name": format!("svc-{i:05}"),
                "plugin": "static",
                "provider": "static",
                "service": format!("svc-{i}"),
                "config": {"targets": format!("127.0.0.1:{port}:{}", (i % 5) + 1)},
                "interval_secs": interval,
            })
        })
        .collect();
    let body = json!({ "bindings": bindings }).to_string();
    let (status, v) = daemon.api("POST", "/api/v1/bindings/bulk", Some(&body));
    assert_eq!(status, 200, "bulk: {v}");
}

/// Waits until every one of the `n` services has at least `k` calls after `since` (ms).
fn wait_calls(daemon: &common::Daemon, n: u64, since: i64, k: usize, limit: Duration) {
    let t = Instant::now();
    loop {
        let (by_service, _) = calls(&daemon.log_text());
        let done = by_service
            .values()
            .filter(|v| v.iter().filter(|at| **at >= since).count() >= k)
            .count() as u64;
        if done >= n {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "only {done}/{n} services had {k} calls after {:?}",
            limit
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One setting: create, first scheduled refresh, restart. Returns the rounds and the peak RSS of
/// the two daemon processes (KiB).
fn run(n: u64, interval: u64, jitter_pct: u8) -> (Vec<Round>, u64, u64) {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().backend("a").start();
    let port = nginx.backend_port("a");
    let pct = jitter_pct.to_string();
    let mut daemon =
        common::Daemon::start_with(root.path(), &nginx, &["--refresh-jitter-pct", &pct]);
    let pid = daemon.pid().expect("daemon pid");
    let label = format!("jitter {jitter_pct} %");

    let t_create = now_ms();
    bulk(&daemon, n, port, interval);
    // Round 0 (creation) and round 1 (first scheduled refresh): two calls per service.
    wait_calls(&daemon, n, t_create, 1, Duration::from_secs(600));
    wait_calls(
        &daemon,
        n,
        t_create,
        2,
        Duration::from_secs(600 + 2 * interval),
    );
    let hwm_first = vm_hwm_kib(pid);
    let (by_service, events) = calls(&daemon.log_text());
    let first: Vec<i64> = by_service.values().map(|v| v[0]).collect();
    let second: Vec<i64> = by_service.values().map(|v| v[1]).collect();
    let first_end = first.iter().copied().max().unwrap_or(t_create);
    let r0 = Round {
        name: format!("{label}: creation (bulk of {n})"),
        times: first.iter().map(|t| t - t_create).collect(),
        in_flight: max_in_flight(&events, t_create, first_end),
    };
    // Round 1 relative to the end of round 0: lockstep shows as the same narrow band.
    let r0_start = first.iter().copied().min().unwrap_or(t_create);
    let r1 = Round {
        name: format!("{label}: first scheduled refresh (+{interval} s)"),
        times: second.iter().map(|t| t - r0_start).collect(),
        in_flight: max_in_flight(
            &events,
            first_end + 1,
            second.iter().copied().max().unwrap_or(0),
        ),
    };

    // Restart: every stored binding resolves at once at start.
    daemon.stop();
    let t_start = now_ms();
    daemon.spawn();
    let pid2 = daemon.pid().expect("daemon pid");
    wait_calls(&daemon, n, t_start, 1, Duration::from_secs(600));
    let (by_service, events) = calls(&daemon.log_text());
    let restart: Vec<i64> = by_service
        .values()
        .filter_map(|v| v.iter().copied().find(|at| *at >= t_start))
        .collect();
    let hwm_second = vm_hwm_kib(pid2);
    let r2 = Round {
        name: format!("{label}: restart with {n} stored"),
        times: restart.iter().map(|t| t - t_start).collect(),
        in_flight: max_in_flight(
            &events,
            t_start,
            restart.iter().copied().max().unwrap_or(t_start),
        ),
    };
    daemon.stop();
    (vec![r0, r1, r2], hwm_first, hwm_second)
}

fn histogram(r: &Round) {
    let h = r.per_second();
    let max = h.iter().copied().max().unwrap_or(1).max(1);
    println!("calls per second, {}:", r.name);
    for (s, n) in h.iter().enumerate() {
        if *n == 0 {
            continue;
        }
        let bar = "#".repeat((n * 50).div_ceil(max));
        println!("  {s:>4} s {n:>6} {bar}");
    }
}

fn main() {
    std::env::set_var("RUST_LOG", "warn,tributary_plugin_host=trace");
    let n = env_num("BENCH_BINDINGS", 10_000);
    let interval = env_num("BENCH_INTERVAL_SECS", 20).max(10);
    let baseline = env_num("BENCH_BASELINE", 1) != 0;
    println!(
        "refresh-spread benchmark: {n} bindings on the static plugin, interval {interval} s, \
         release daemon, real nginx"
    );
    let mut settings = vec![tributary::engine::refresh::DEFAULT_JITTER_PCT];
    if baseline {
        settings.push(0);
    }
    let mut results = Vec::new();
    for pct in settings {
        let r = run(n, interval, pct);
        // Each setting as soon as it is measured (the summary follows at the end).
        for round in &r.0 {
            println!("{}", round.row());
        }
        println!(
            "peak RSS, jitter {pct} %: {:.1} MiB / {:.1} MiB",
            r.1 as f64 / 1024.0,
            r.2 as f64 / 1024.0
        );
        results.push((pct, r));
    }
    println!();
    println!("| round                                        |  calls |    first |     last |   spread | busiest s | secs   | in flight |");
    println!("|----------------------------------------------|--------|----------|----------|----------|-----------|--------|-----------|");
    for (_, (rounds, _, _)) in &results {
        for r in rounds {
            println!("{}", r.row());
        }
    }
    println!();
    for (pct, (_, first, second)) in &results {
        println!(
            "daemon peak RSS (VmHWM), jitter {pct} %: {:.1} MiB creating {n} bindings, {:.1} MiB restarting with them (target < 128 MiB)",
            *first as f64 / 1024.0,
            *second as f64 / 1024.0
        );
    }
    println!();
    for (_, (rounds, _, _)) in &results {
        histogram(&rounds[1]);
    }
}
