//! Fleet benchmark: `BENCH_BINDINGS` bindings (default 1000) on `BENCH_HOSTS`
//! simulated hosts (default 20): release `tributary serve --store etcd` daemons on a real 3-member
//! etcd cluster, each with its own conf dir and `true` as test and reload commands (no nginx). The
//! plugin is a shell script answering the targets of a shared file and appending one line per call
//! to its host's `calls` file.
//!
//! Command (from the workspace root):
//! ```sh
//! cargo bench -p tributary --bench fleet
//! ```
//! Environment: `BENCH_BINDINGS`, `BENCH_HOSTS`, `BENCH_INTERVAL_SECS` (default 30, at least 10),
//! `BENCH_CHURN_ROUNDS` (default 0: see below).
//!
//! Measures: the time from the bulk creation on host 0 until every host's conf dir holds every
//! binding's file; the time from a registry change until every host's file of every binding holds
//! the new address; plugin calls over one interval at rest (in all and per host: the fleet resolves
//! each binding once per interval, so about `BENCH_BINDINGS`, not `BENCH_BINDINGS * BENCH_HOSTS`);
//! etcd requests per second at rest (the members' `grpc_server_msg_received_total`); each daemon's RSS.
//!
//! Under churn (`BENCH_CHURN_ROUNDS=N`): the registry changes once per interval, N times. Per round
//! it measures the time from the change to each host's file of each binding holding it (the file's
//! mtime; p50, p99, max over hosts × bindings); over the whole churn: watch events the hosts
//! received per binding change and host (the members' `etcd_debugging_mvcc_events_total`, the
//! events etcd sent to watchers, divided by hosts × bindings × rounds), etcd requests per second,
//! plugin calls per interval, and the daemons' RSS.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tributary_fakes::daemon::http;
use tributary_fakes::etcd_cluster::EtcdCluster;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Host {
    root: PathBuf,
    port: u16,
    child: Child,
}

impl Host {
    fn token(&self) -> String {
        std::fs::read_to_string(self.root.join("data/token"))
            .unwrap()
            .trim()
            .to_string()
    }

    fn calls(&self) -> usize {
        std::fs::read_to_string(self.root.join("calls"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// Bindings whose file holds `addr`.
    fn files_with(&self, addr: &str) -> usize {
        let Ok(rd) = std::fs::read_dir(self.root.join("conf/upstreams")) else {
            return 0;
        };
        rd.filter_map(Result::ok)
            .filter(|e| {
                std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&format!("{addr}:80")))
            })
            .count()
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn set_targets(path: &Path, addr: &str) {
    std::fs::write(path, json!([{"address": addr, "port": 80}]).to_string()).unwrap();
}

fn start_host(
    bin: &Path,
    base: &Path,
    i: usize,
    cluster: &EtcdCluster,
    key: &Path,
    targets: &Path,
) -> Host {
    let root = base.join(format!("host-{i:02}"));
    std::fs::create_dir_all(root.join("conf/upstreams")).unwrap();
    let plugins = tributary_fakes::counting_plugin::counting_plugin(&root, targets);
    let port = tributary_testkit::free_port();
    let log = std::fs::File::create(root.join("daemon.log")).unwrap();
    let child = Command::new(bin)
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(root.join("data"))
        .arg("--plugins-dir")
        .arg(&plugins)
        .arg("--conf-dir")
        .arg(root.join("conf"))
        .args([
            "--test-cmd",
            "true",
            "--reload-cmd",
            "true",
            "--no-reload-confirm",
        ])
        .args([
            "--store",
            "etcd",
            "--etcd-endpoints",
            &cluster.endpoints().join(","),
        ])
        .args([
            "--etcd-prefix",
            "/bench/",
            "--host-id",
            &format!("host-{i:02}"),
        ])
        .arg("--secrets-key")
        .arg(key)
        .env("RUST_LOG", "warn")
        .env_remove("TRIBUTARY_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn tributary serve");
    let h = Host { root, port, child };
    let deadline = Instant::now() + Duration::from_secs(120);
    while http_ok(port) != Some(200) {
        assert!(Instant::now() < deadline, "host {i} did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    h
}

fn http_ok(port: u16) -> Option<u16> {
    std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    Some(http(port, "GET", "/api/v1/health", None, None).0)
}

/// Seconds until `f` holds, polled every 250 ms, at most `limit`.
fn time_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> f64 {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
    t0.elapsed().as_secs_f64()
}

/// Sum of `grpc_server_msg_received_total` (requests, also the messages of streams: watch, lease keep-alive) over every member.
fn etcd_requests(cluster: &EtcdCluster) -> f64 {
    etcd_metric(cluster, "grpc_server_msg_received_total{")
}

/// Sum over every member of the samples of the metric whose lines start with `prefix`.
fn etcd_metric(cluster: &EtcdCluster, prefix: &str) -> f64 {
    cluster
        .endpoints()
        .iter()
        .map(|e| {
            let port: u16 = e.rsplit(':').next().unwrap().parse().unwrap();
            let (_, text) = http(port, "GET", "/metrics", None, None);
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum()
}

/// Seconds from `since` to the mtime of each host's file of each binding that holds `addr`
/// (files not holding it yet are left out).
fn apply_delays(hosts: &[Host], addr: &str, since: std::time::SystemTime) -> Vec<f64> {
    let mut out = Vec::new();
    for h in hosts {
        let Ok(rd) = std::fs::read_dir(h.root.join("conf/upstreams")) else {
            continue;
        };
        for e in rd.filter_map(Result::ok) {
            let holds =
                std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(&format!("{addr}:80")));
            let mtime = e.metadata().and_then(|m| m.modified());
            if let (true, Ok(m)) = (holds, mtime) {
                out.push(m.duration_since(since).map_or(0.0, |d| d.as_secs_f64()));
            }
        }
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// The registry changes once per interval, `rounds` times (see the module doc).
fn churn(
    hosts: &[Host],
    cluster: &EtcdCluster,
    targets: &Path,
    n: usize,
    interval: u64,
    rounds: u64,
) {
    let events0 = etcd_metric(cluster, "etcd_debugging_mvcc_events_total");
    let req0 = etcd_requests(cluster);
    let calls0: usize = hosts.iter().map(Host::calls).sum();
    let t0 = Instant::now();
    let mut all = Vec::new();
    for r in 0..rounds {
        let addr = format!("10.1.{}.{}", r / 250, r % 250 + 1);
        let since = std::time::SystemTime::now();
        let started = Instant::now();
        set_targets(targets, &addr);
        let limit = Duration::from_secs(interval * 4 + 60);
        time_until("every host applied the round's change", limit, || {
            hosts.iter().all(|h| h.files_with(&addr) == n)
        });
        let mut d = apply_delays(hosts, &addr, since);
        d.sort_by(f64::total_cmp);
        println!(
            "churn round {}: change -> file on every host: p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} files)",
            r + 1,
            percentile(&d, 0.5),
            percentile(&d, 0.99),
            d.last().copied().unwrap_or(f64::NAN),
            d.len()
        );
        all.extend(d);
        // The next change one interval after this one.
        if let Some(rest) = Duration::from_secs(interval).checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let events = etcd_metric(cluster, "etcd_debugging_mvcc_events_total") - events0;
    let req = etcd_requests(cluster) - req0;
    let calls = hosts.iter().map(Host::calls).sum::<usize>() - calls0;
    all.sort_by(f64::total_cmp);
    let hosts_n = hosts.len();
    let changes = (n as u64 * rounds) as f64;
    println!(
        "churn: {hosts_n} hosts x {n} bindings, {rounds} changes, {secs:.0} s: change -> every host p50 {:.1} s, p99 {:.1} s",
        percentile(&all, 0.5),
        percentile(&all, 0.99)
    );
    println!(
        "churn: watch events sent {events:.0} = {:.2} per host per binding change; etcd requests {:.1}/s; plugin calls {:.0} per interval (bindings {n})",
        events / hosts_n as f64 / changes,
        req / secs,
        calls as f64 / (secs / interval as f64)
    );
}

fn main() {
    let n = env_num("BENCH_BINDINGS", 1000) as usize;
    let hosts_n = env_num("BENCH_HOSTS", 20) as usize;
    let interval = env_num("BENCH_INTERVAL_SECS", 30).max(10);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tributary"));
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("secrets.key");
    std::fs::write(&key, [3u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let targets = tmp.path().join("targets.json");
    set_targets(&targets, "10.0.0.1");
    let cluster = EtcdCluster::start(3);
    let t = Instant::now();
    let hosts: Vec<Host> = (0..hosts_n)
        .map(|i| start_host(&bin, tmp.path(), i, &cluster, &key, &targets))
        .collect();
    println!(
        "fleet bench: {n} bindings, {hosts_n} hosts, interval {interval} s; hosts started in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let bindings: Vec<Value> = (0..n)
        .map(|i| {
            json!({"name": format!("svc-{i:05}"), "plugin": "count", "provider": "c",
                "service": format!("svc-{i}"), "interval_secs": interval})
        })
        .collect();
    let body = json!({ "bindings": bindings }).to_string();
    let t0 = Instant::now();
    let (st, text) = http(
        hosts[0].port,
        "POST",
        "/api/v1/bindings/bulk",
        Some(&hosts[0].token()),
        Some(&body),
    );
    assert_eq!(st, 200, "bulk: {text}");
    let limit = Duration::from_secs(600);
    time_until("every host wrote every binding", limit, || {
        hosts.iter().all(|h| h.files_with("10.0.0.1") == n)
    });
    let created = t0.elapsed().as_secs_f64();
    println!("created on host 0 -> every file on every host: {created:.1} s");

    // A registry change: the resolvers pick it up at their next run (spread over an interval).
    set_targets(&targets, "10.0.0.2");
    let changed = time_until("every host applied the change", limit, || {
        hosts.iter().all(|h| h.files_with("10.0.0.2") == n)
    });
    println!(
        "registry change -> every binding on every host: {changed:.1} s (interval {interval} s)"
    );

    // At rest: one interval of plugin calls and etcd requests.
    let calls0: Vec<usize> = hosts.iter().map(Host::calls).collect();
    let req0 = etcd_requests(&cluster);
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_secs(interval));
    let secs = t1.elapsed().as_secs_f64();
    let req1 = etcd_requests(&cluster);
    let calls1: Vec<usize> = hosts.iter().map(Host::calls).collect();
    let per_host: Vec<usize> = calls0.iter().zip(&calls1).map(|(a, b)| b - a).collect();
    println!(
        "plugin calls in one interval at rest: {} in all (bindings {n}, hosts x bindings {}); per host min {} max {}",
        per_host.iter().sum::<usize>(),
        n * hosts_n,
        per_host.iter().min().unwrap(),
        per_host.iter().max().unwrap()
    );
    println!(
        "etcd requests at rest: {:.1}/s (grpc_server_msg_received_total over 3 members, {secs:.1} s)",
        (req1 - req0) / secs
    );
    let rounds = env_num("BENCH_CHURN_ROUNDS", 0);
    if rounds > 0 {
        churn(&hosts, &cluster, &targets, n, interval, rounds);
    }
    let rss: Vec<u64> = hosts.iter().map(Host::rss_kib).collect();
    println!(
        "daemon RSS: min {} KiB, mean {} KiB, max {} KiB",
        rss.iter().min().unwrap(),
        rss.iter().sum::<u64>() / rss.len() as u64,
        rss.iter().max().unwrap()
    );
    drop(hosts);
    drop(cluster);
}
