//! Decision → visible through the daemon for one binding of N targets, live mode.
//!
//! Command (from the workspace root; release builds of the daemon, the static plugin and the
//! module):
//! ```sh
//! cargo build --release -p tributary -p tributary-plugin-static -p ngx-combined-upstreams
//! cargo bench -p tributary --bench live_targets
//! ```
//! Environment: `BENCH_TARGETS` (default `1,10,100,1000`: the sizes, one after the other),
//! `BENCH_SECS` (default 30) seconds of changes at `BENCH_RATE` (default 10) saves a second.
//!
//! Per size: a real nginx (master + 2 workers, the combined-upstreams module, its
//! `upstreams_api` on a unix socket) and the release `tributary serve --apply live --live-api`
//! with its defaults; the binding `t{N}` (static plugin, N targets on made-up addresses: nothing
//! is proxied) is created (by reload: a new upstream needs one) and then saved at the rate with
//! 1 % of its targets (at least 1) replaced by addresses not used before, the count unchanged
//! (the daemon's `zone` line depends on it: the same line keeps every change live). The saves go
//! through the daemon's API without waiting. Figures are the daemon's own, with the definitions
//! of docs/live-api.md ("Benchmark"): its `applied live` log line per change made live gives
//! `decided_to_visible_ms` (decision — the plugin's answer validated and rendered, handed to the
//! apply task — to the `PUT` answered by nginx) and its parts. Also: saves, changes made live,
//! nginx reloads during the changes (0 wanted).

#[path = "../tests/e2e/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tributary_testkit::Nginx;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `k`-th address of size `n`'s binding (distinct for every `k`).
fn addr(n: usize, k: usize) -> String {
    format!(
        "10.{}.{}.{}:80",
        n % 200 + (k / 62_500) % 50,
        (k / 250) % 250,
        k % 250 + 1
    )
}

/// The binding with targets `first..first + n` except the replaced ones: save `round` replaces
/// the block of `part` targets at `round × part` by fresh addresses.
fn binding(n: usize, round: usize) -> Value {
    let part = (n / 100).max(1);
    let at = (round * part) % n;
    let targets: Vec<String> = (0..n)
        .map(|i| {
            if round > 0 && (i + n - at) % n < part {
                addr(n, n + round * part + (i + n - at) % n)
            } else {
                addr(n, i)
            }
        })
        .collect();
    json!({"plugin": "static", "provider": "static", "service": format!("t{n}"),
           "config": {"targets": targets.join(" ")}, "interval_secs": 3600})
}

fn reloads(nginx: &Nginx) -> usize {
    nginx
        .error_log()
        .lines()
        .filter(|l| l.contains("signal 1 (SIGHUP) received"))
        .count()
}

/// A numeric field `key=` of a log line.
fn field(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.trim_start_matches('"')
        .split(|c: char| c != '.' && !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(f64::NAN)
}

struct Row {
    n: usize,
    saves: usize,
    live: Vec<(f64, f64, f64, f64)>,
    reloads: usize,
    applied: String,
}

fn run(n: usize, secs: u64, rate: u64) -> Row {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().workers(2).live_api("").start();
    let api = nginx.live_api_address();
    let mut daemon = common::Daemon::start_with(
        root.path(),
        &nginx,
        &["--apply", "live", "--live-api", &api],
    );
    let name = format!("t{n}");
    let (status, v) = daemon.api(
        "PUT",
        &format!("/api/v1/bindings/{name}?wait=true"),
        Some(&binding(n, 0).to_string()),
    );
    assert!(status == 200 || status == 201, "{status}: {v}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    let log_from = daemon.log_text().len();
    let reloads0 = reloads(&nginx);
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let saves = (secs * rate) as usize;
    let start = Instant::now();
    for round in 1..=saves {
        let at = start + period * (round - 1) as u32;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let (status, v) = daemon.api(
            "PUT",
            &format!("/api/v1/bindings/{name}"),
            Some(&binding(n, round).to_string()),
        );
        assert!(status == 200 || status == 201, "{status}: {v}");
    }
    // The last save applied.
    let last = addr(n, n + saves * (n / 100).max(1));
    let last_ip = last.trim_end_matches(":80");
    let t = Instant::now();
    let detail = loop {
        let (_, d) = daemon.api("GET", &format!("/api/v1/bindings/{name}"), None);
        let o = &d["binding"]["last_outcome"];
        if o["kept"].to_string().contains(&format!("\"{last_ip}\"")) && o["status"] == "ok" {
            break d;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "last save not applied: {d}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = daemon.log_text();
    let live: Vec<(f64, f64, f64, f64)> = log
        .get(log_from..)
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains("applied live") && l.contains(&format!("upstream={name}")))
        .filter_map(|l| {
            Some((
                field(l, "decided_to_visible_ms=")?,
                field(l, "waited_ms=")?,
                field(l, "put_ms=")?,
                field(l, "write_ms=")?,
            ))
        })
        .collect();
    let row = Row {
        n,
        saves,
        live,
        reloads: reloads(&nginx) - reloads0,
        applied: detail["binding"]["last_outcome"]["applied"]
            .as_str()
            .unwrap_or("?")
            .to_string(),
    };
    daemon.stop();
    row
}

fn main() {
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "info");
    }
    let sizes: Vec<usize> = std::env::var("BENCH_TARGETS")
        .unwrap_or_else(|_| "1,10,100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let secs = env_num("BENCH_SECS", 30);
    let rate = env_num("BENCH_RATE", 10).max(1);
    println!("decision → visible, one binding of N targets, live mode: {secs} s at {rate} saves/s");
    let rows: Vec<Row> = sizes.iter().map(|&n| run(n, secs, rate)).collect();
    println!();
    println!("| targets | saves | changes made live | decided→visible p50 / p99 / max ms | under 50 ms | waited p50 / p99 ms | put p50 / p99 ms | write p50 / p99 ms | reloads | last outcome applied |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let col = |f: fn(&(f64, f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = r.live.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let d2v = col(|x| x.0);
        let waited = col(|x| x.1);
        let put = col(|x| x.2);
        let write = col(|x| x.3);
        println!(
            "| {} | {} | {} | {:.1} / {:.1} / {:.1} | {} of {} | {:.1} / {:.1} | {:.2} / {:.2} | {:.1} / {:.1} | {} | {} |",
            r.n,
            r.saves,
            r.live.len(),
            quantile(&d2v, 0.5),
            quantile(&d2v, 0.99),
            quantile(&d2v, 1.0),
            d2v.iter().filter(|x| **x < 50.0).count(),
            d2v.len(),
            quantile(&waited, 0.5),
            quantile(&waited, 0.99),
            quantile(&put, 0.5),
            quantile(&put, 0.99),
            quantile(&write, 0.5),
            quantile(&write, 0.99),
            r.reloads,
            r.applied
        );
    }
}
