//! Scale benchmark: 1,000 bindings whose targets all change at once.
//!
//! Command (from the workspace root; release build of the daemon and of the static plugin):
//! ```sh
//! cargo build --release -p tributary-plugin-static && cargo bench -p tributary --bench scale
//! ```
//! Environment: `BENCH_BINDINGS` (default 1000), `BENCH_IDLE_SECS` (default 65: one full refresh
//! round of the 60 s interval falls inside the idle window), `BENCH_APPLY` (`reload`, the
//! default, or `live`).
//!
//! Live mode (`BENCH_APPLY=live`; also `cargo build --release -p
//! ngx-combined-upstreams`): nginx (master + 2 workers) loads the combined-upstreams module and
//! serves its `upstreams_api` on a unix socket, and the daemon runs with `--apply live
//! --live-api`. The bindings are created by reload (a new upstream needs one); the change of all
//! targets then goes live. Measured there, from the daemon's `applied live` log lines: the time
//! from the bulk request sent to the last set visible (its `PUT` answered: `decided_unix_ms +
//! decided_to_visible_ms`), to the first one, and the spread of `decided_to_visible_ms`; the
//! outcomes that went live and by reload; nginx reloads (0 wanted).
//!
//! It starts a real nginx (testkit) and the release `tributary serve` with its defaults (2 s
//! minimum reload gap, 100 ms batch quiet time), creates the bindings in one bulk request, waits
//! until all are applied, measures idle CPU, then changes every binding's targets in one bulk
//! request and measures the time until every binding has an `ok` outcome for the new targets
//! (files written, `nginx -t` passed, nginx reloaded), the number of nginx reloads that took,
//! and the daemon's RSS. A naive loop would reload once per binding.

#[path = "../tests/e2e/common/mod.rs"]
mod common;

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

fn proc_field(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is index 0, utime 11, stime 12.
    let u: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let s: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    u + s
}

fn clk_tck() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn bulk(daemon: &common::Daemon, n: u64, port: u16, tag: u64) {
    let bindings: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "name": format!("svc-{i:04}"),
                "plugin": "static",
                "provider": "static",
                "service": format!("svc-{i}"),
                "config": {"targets": format!("127.0.0.1:{port}:{} 127.0.0.{}:{port}", (i % 5) + 1, tag + 2)},
                "interval_secs": 60,
            })
        })
        .collect();
    let body = json!({ "bindings": bindings }).to_string();
    let (status, v) = daemon.api("POST", "/api/v1/bindings/bulk", Some(&body));
    assert_eq!(status, 200, "bulk: {v}");
}

/// Waits until every binding has an ok/unchanged outcome started at or after `since_ms`
/// with `want` servers listing `port`.
fn wait_all(daemon: &common::Daemon, n: u64, since_ms: i64, marker: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let (status, v) = daemon.api("GET", "/api/v1/bindings", None);
        assert_eq!(status, 200);
        let list = v["bindings"].as_array().cloned().unwrap_or_default();
        let done = list
            .iter()
            .filter(|b| {
                let o = &b["last_outcome"];
                o["at_ms"].as_i64().unwrap_or(0) >= since_ms
                    && o["status"] == "ok"
                    && b["servers"].to_string().contains(marker)
            })
            .count() as u64;
        if done == n {
            return t0.elapsed();
        }
        let failed: Vec<&Value> = list
            .iter()
            .filter(|b| b["last_outcome"]["status"] == "failed")
            .take(1)
            .collect();
        assert!(failed.is_empty(), "a binding failed: {}", failed[0]);
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "only {done}/{n} applied after 300 s: {}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reload signals nginx received (one `signal 1 (SIGHUP) received` line each in its error log).
fn reloads(nginx: &Nginx) -> usize {
    nginx
        .error_log()
        .lines()
        .filter(|l| l.contains("signal 1 (SIGHUP) received"))
        .count()
}

fn settle_reloads(nginx: &Nginx) -> usize {
    let mut last = reloads(nginx);
    let mut stable_since = Instant::now();
    while stable_since.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        let now = reloads(nginx);
        if now != last {
            last = now;
            stable_since = Instant::now();
        }
    }
    last
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    // Measure the daemon at its production log level (the test runner defaults to debug).
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "info");
    }
    let n = env_num("BENCH_BINDINGS", 1000);
    let idle_secs = env_num("BENCH_IDLE_SECS", 65);
    let live = std::env::var("BENCH_APPLY").is_ok_and(|m| m == "live");
    let root = tempfile::tempdir().unwrap();
    let mut builder = Nginx::builder().backend("a").backend("b");
    if live {
        builder = builder.workers(2).live_api("");
    }
    let nginx = builder.start();
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    let api = nginx.live_api_address();
    let args: &[&str] = if live {
        &["--apply", "live", "--live-api", &api]
    } else {
        &[]
    };
    let mut daemon = common::Daemon::start_with(root.path(), &nginx, args);
    let pid = daemon.pid().expect("daemon pid");

    println!(
        "scale benchmark: {n} bindings (static plugin, real nginx, release daemon, apply {})",
        if live { "live" } else { "reload" }
    );
    let since = now_ms();
    let reloads0 = reloads(&nginx);
    let t = Instant::now();
    bulk(&daemon, n, pa, 0);
    wait_all(&daemon, n, since, &pa.to_string());
    let create_time = t.elapsed();
    let reloads_create = settle_reloads(&nginx) - reloads0;
    let rss_after_create = proc_field(pid, "VmRSS:");

    // Idle: the bindings refresh on their 60 s interval (unchanged answers: no write, no reload).
    let tck = clk_tck();
    let c0 = cpu_ticks(pid);
    let ti = Instant::now();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let idle_cpu = (cpu_ticks(pid) - c0) as f64 / tck as f64 / ti.elapsed().as_secs_f64() * 100.0;
    let reloads_idle = settle_reloads(&nginx) - reloads0 - reloads_create;

    // All targets change at once.
    let (_, stats0) = daemon.api("GET", "/api/v1/stats", None);
    let reloads1 = reloads(&nginx);
    let since = now_ms();
    let sent_unix_ms = unix_ms();
    let log_before = daemon.log_text().len();
    let t = Instant::now();
    bulk(&daemon, n, pb, 1);
    let bulk_time = t.elapsed();
    wait_all(&daemon, n, since, &pb.to_string());
    let change_time = t.elapsed();
    let reloads_change = settle_reloads(&nginx) - reloads1;
    let (_, stats1) = daemon.api("GET", "/api/v1/stats", None);
    let batches = stats1["batches"].as_u64().unwrap_or(0) - stats0["batches"].as_u64().unwrap_or(0);
    let rss = proc_field(pid, "VmRSS:");
    let hwm = proc_field(pid, "VmHWM:");
    // Every file really holds the new targets.
    let mut wrong = 0;
    for i in 0..n {
        let text = std::fs::read_to_string(nginx.upstreams_dir().join(format!("svc-{i:04}.conf")))
            .unwrap_or_default();
        if !text.contains(&format!("127.0.0.1:{pb} ")) {
            wrong += 1;
        }
    }
    let (_, list) = daemon.api("GET", "/api/v1/bindings", None);
    let applied_live = list["bindings"].as_array().map_or(0, |a| {
        a.iter()
            .filter(|b| b["last_outcome"]["applied"] == "live")
            .count()
    });
    let log = daemon.log_text();
    let batch_lines: Vec<String> = log
        .lines()
        .filter(|l| l.contains("batch applied"))
        .map(str::to_string)
        .collect();
    let visible = live_visible(log.get(log_before..).unwrap_or(""));
    daemon.stop();

    println!();
    for l in &batch_lines {
        println!("daemon: {l}");
    }
    println!("| measure                                   | value        | target  |");
    println!("|-------------------------------------------|--------------|---------|");
    println!(
        "| create {n} bindings: time to all applied  | {:>9.2} s  |         |",
        create_time.as_secs_f64()
    );
    println!("| create: nginx reloads                     | {reloads_create:>12} |         |");
    println!(
        "| change all targets: time to all applied   | {:>9.2} s  |         |",
        change_time.as_secs_f64()
    );
    println!(
        "| change: bulk request answered after       | {:>9.2} s  |         |",
        bulk_time.as_secs_f64()
    );
    println!("| change: nginx reloads (naive loop: {n})  | {reloads_change:>12} | <= 2    |");
    println!("| change: apply batches                     | {batches:>12} |         |");
    println!(
        "| files with the new targets                | {:>12} |         |",
        format!("{}/{n}", n - wrong)
    );
    println!(
        "| daemon RSS after create                   | {:>8.1} MiB |         |",
        rss_after_create as f64 / 1024.0
    );
    println!(
        "| daemon RSS after change (peak)            | {:>8.1} MiB | < 64    |",
        rss as f64 / 1024.0
    );
    println!(
        "| daemon peak RSS (VmHWM)                   | {:>8.1} MiB | < 64    |",
        hwm as f64 / 1024.0
    );
    println!(
        "| idle CPU over {idle_secs} s (60 s interval)        | {idle_cpu:>10.2} % |         |"
    );
    println!("| reloads while idle                        | {reloads_idle:>12} | 0       |");
    if live {
        let sorted = |i: usize| {
            let mut v: Vec<f64> = visible.iter().map(|x| x[i]).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let quant = |v: &[f64], p: f64| {
            v.get(((v.len() as f64 * p).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or(f64::NAN)
        };
        let d2v = sorted(1);
        let q = |p: f64| quant(&d2v, p);
        let at: Vec<f64> = visible.iter().map(|v| v[0] + v[1] - sent_unix_ms).collect();
        let last = at.iter().copied().fold(f64::NAN, f64::max);
        let first = at.iter().copied().fold(f64::NAN, f64::min);
        println!(
            "| live: outcomes applied live / reload      | {:>12} |         |",
            format!("{applied_live}/{}", n as usize - applied_live)
        );
        println!(
            "| live: changes logged `applied live`       | {:>12} |         |",
            visible.len()
        );
        println!("| live: bulk sent → first set visible       | {first:>9.1} ms |         |");
        println!("| live: bulk sent → last set visible        | {last:>9.1} ms | < 300   |");
        println!(
            "| live: decided→visible p50 / p99 / max     | {:>5.1} / {:>5.1} / {:>5.1} ms |  |",
            q(0.5),
            q(0.99),
            q(1.0)
        );
        // Where the time went: per batch (write, list_wait and test are the batch's; waited is
        // each change's own, decision → batch start), and the PUTs, which go one after the other.
        let mut batches: Vec<[f64; 3]> = Vec::new();
        for v in &visible {
            let b = [v[3], v[4], v[6]];
            if !batches.contains(&b) {
                batches.push(b);
            }
        }
        for b in &batches {
            let mut waited: Vec<f64> = visible
                .iter()
                .filter(|v| [v[3], v[4], v[6]] == *b)
                .map(|v| v[2])
                .collect();
            waited.sort_by(f64::total_cmp);
            println!(
                "| live batch: {} changes; waited {:.1}–{:.1} ms, write {:.1} ms, list_wait {:.1} ms, test {:.1} ms |",
                waited.len(),
                quant(&waited, 0.0),
                quant(&waited, 1.0),
                b[0],
                b[1],
                b[2]
            );
        }
        let put = sorted(5);
        println!(
            "| live: put_ms p50 / p99 / max, sum        | {:.2} / {:.2} / {:.2} ms, {:.0} ms |",
            quant(&put, 0.5),
            quant(&put, 0.99),
            quant(&put, 1.0),
            put.iter().sum::<f64>()
        );
    }
    assert_eq!(wrong, 0, "some files do not hold the new targets");
}

/// Wall-clock time now, in ms since the epoch.
fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The fields of each `applied live` line of the daemon's log: `decided_unix_ms`,
/// `decided_to_visible_ms`, then the parts `waited_ms`, `write_ms`, `list_wait_ms`, `put_ms`,
/// `test_ms`.
fn live_visible(log: &str) -> Vec<[f64; 7]> {
    let field = |l: &str, key: &str| -> Option<f64> {
        let rest = &l[l.find(key)? + key.len()..];
        rest.trim_start_matches('"')
            .split(|c: char| c != '.' && !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    log.lines()
        .filter(|l| l.contains("applied live"))
        .filter_map(|l| {
            Some([
                field(l, "decided_unix_ms=")?,
                field(l, "decided_to_visible_ms=")?,
                field(l, "waited_ms=")?,
                field(l, "write_ms=")?,
                field(l, "list_wait_ms=")?,
                field(l, "put_ms=")?,
                field(l, "test_ms=")?,
            ])
        })
        .collect()
}
