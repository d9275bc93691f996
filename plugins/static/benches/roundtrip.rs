//! Plugin round-trip benchmark: 10,000 sequential `discovery.resolve` calls from the real plugin host
//! to the `static` plugin, on the daemon's (multi-thread) runtime and on a current-thread runtime.
//! Baseline in the same run: the same number of line round trips through `cat` (a bare pipe echo,
//! no JSON, no host), so the host + SDK overhead shows as a ratio on a noisy machine.
//!
//! Run: `cargo bench -p tributary-plugin-static --bench roundtrip`
//! (`BENCH_CALLS=N` changes the number of calls). Target: p50 under 50 µs.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_protocol::{ConfigMap, ResolveParams};

struct Stats {
    calls: usize,
    total: Duration,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

fn stats(mut samples: Vec<Duration>, total: Duration) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Stats {
        calls: samples.len(),
        total,
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: *samples.last().unwrap(),
    }
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn row(name: &str, s: &Stats, base: Option<&Stats>) {
    let ratio = base.map_or("1.00".to_string(), |b| {
        format!("{:.2}", s.p50.as_secs_f64() / b.p50.as_secs_f64())
    });
    println!(
        "{name:<34} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>12}",
        s.calls,
        s.calls as f64 / s.total.as_secs_f64(),
        us(s.p50),
        us(s.p90),
        us(s.p99),
        us(s.max),
        ratio
    );
}

async fn bench_host(n: usize, dir: &std::path::Path) -> Stats {
    let (host, errors) = PluginHost::load(dir, HostOptions::default());
    assert!(errors.is_empty(), "{errors:?}");
    let mut config = ConfigMap::new();
    config.insert(
        "targets",
        "10.0.1.12:8080, 10.0.2.7:8080:2 [2001:db8::17]:8443",
    );
    let params = ResolveParams {
        provider: "static".into(),
        config,
        service: "api".into(),
    };
    for _ in 0..500 {
        host.resolve("static", params.clone()).await.unwrap();
    }
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = host.resolve("static", params.clone()).await.unwrap();
        samples.push(t.elapsed());
        assert_eq!(r.targets.len(), 3);
    }
    let total = start.elapsed();
    host.shutdown().await;
    stats(samples, total)
}

async fn bench_cat(n: usize) -> Stats {
    let mut child = tokio::process::Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cat must be installed (coreutils)");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let line =
        json!({"jsonrpc":"2.0","id":1,"method":"discovery.resolve","params":{}}).to_string() + "\n";
    let mut buf = String::new();
    let mut one = async |stdin: &mut tokio::process::ChildStdin, buf: &mut String| {
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
        buf.clear();
        out.read_line(buf).await.unwrap();
    };
    for _ in 0..500 {
        one(&mut stdin, &mut buf).await;
    }
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        one(&mut stdin, &mut buf).await;
        samples.push(t.elapsed());
    }
    let total = start.elapsed();
    drop(stdin);
    let _ = child.wait().await;
    stats(samples, total)
}

fn main() {
    let n: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tributary_fakes::daemon::plugins_dir(
        tmp.path(),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        std::path::Path::new(env!("CARGO_BIN_EXE_tributary-plugin-static")),
    );

    let multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let base_multi = multi.block_on(bench_cat(n));
    let host_multi = multi.block_on(bench_host(n, &plugins));
    let base_single = single.block_on(bench_cat(n));
    let host_single = single.block_on(bench_host(n, &plugins));

    println!("plugin round trips: {n} sequential calls each (latencies in µs; ratio = p50 / baseline p50)");
    println!(
        "{:<34} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "case", "calls", "calls/s", "p50", "p90", "p99", "max", "p50 ratio"
    );
    row("baseline: cat echo (multi-thread)", &base_multi, None);
    row(
        "host -> static (multi-thread)",
        &host_multi,
        Some(&base_multi),
    );
    row("baseline: cat echo (current-thread)", &base_single, None);
    row(
        "host -> static (current-thread)",
        &host_single,
        Some(&base_single),
    );
    let target = Duration::from_micros(50);
    println!(
        "target p50 < 50 µs on the daemon's multi-thread runtime: {}",
        if host_multi.p50 < target {
            "met"
        } else {
            "NOT met"
        }
    );
}
