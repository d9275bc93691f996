//! The resolve benchmark shared by every discovery plugin: the same service of 100 instances
//! resolved sequentially through the real plugin host (the built plugin process) and, for plugins
//! with a library ([`run`]: consul, kubernetes, ec2), in-process too (the SDK's `call`, no process,
//! no pipes), in the same run. Prints one table. `BENCH_CALLS=N` changes the number of calls.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_plugin_sdk::{Plugin, ResolveParams};

/// Latency summary of one row.
#[derive(Debug, Clone)]
pub struct Stats {
    pub calls: usize,
    pub per_sec: f64,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Stats {
    pub fn from(mut lat: Vec<Duration>, total: Duration) -> Stats {
        lat.sort();
        let q = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
        Stats {
            calls: lat.len(),
            per_sec: lat.len() as f64 / total.as_secs_f64(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            max: *lat.last().unwrap(),
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// Times `calls` sequential runs of `f` after `warmup` untimed ones. Every run must succeed with
/// `expect` targets.
pub async fn time<F, Fut>(warmup: usize, calls: usize, expect: usize, mut f: F) -> Stats
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<usize, String>>,
{
    for _ in 0..warmup {
        let n = f()
            .await
            .unwrap_or_else(|e| panic!("warm-up call failed: {e}"));
        assert_eq!(n, expect, "warm-up call: wrong number of targets");
    }
    let mut lat = Vec::with_capacity(calls);
    let start = Instant::now();
    for _ in 0..calls {
        let t = Instant::now();
        let n = f().await.unwrap_or_else(|e| panic!("call failed: {e}"));
        lat.push(t.elapsed());
        assert_eq!(n, expect, "wrong number of targets");
    }
    Stats::from(lat, start.elapsed())
}

/// Number of timed calls: `BENCH_CALLS`, else `default`.
pub fn calls(default: usize) -> usize {
    std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Untimed calls before the timed ones.
fn warmup(calls: usize) -> usize {
    (calls / 10).max(5)
}

/// Times `calls` resolutions of `params` through a [`PluginHost`] holding only the built plugin
/// `bin` (manifest from `plugin_src`).
async fn via_host(
    plugin_src: &Path,
    bin: &Path,
    params: &ResolveParams,
    expect: usize,
    calls: usize,
) -> Stats {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = crate::daemon::plugins_dir(tmp.path(), plugin_src, bin);
    let (host, errors) = PluginHost::load(&plugins, HostOptions::default());
    assert!(errors.is_empty(), "{errors:?}");
    let name = host.plugins()[0].name.clone();
    let stats = time(warmup(calls), calls, expect, || {
        let host = &host;
        let name = &name;
        let params = params.clone();
        async move {
            host.resolve(name, params)
                .await
                .map(|r| r.targets.len())
                .map_err(|e| format!("{e}; stderr: {:?}", host.stderr_tail(name)))
        }
    })
    .await;
    host.shutdown().await;
    stats
}

/// Prints the table: a heading and one row per path.
fn print_table(title: &str, expect: usize, calls: usize, rows: &[(&str, &Stats)]) {
    println!(
        "{title}: {expect} instances, {calls} sequential resolutions per row ({} warm-up)",
        warmup(calls)
    );
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "path", "resolutions/s", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for (label, s) in rows {
        println!(
            "{:<28} {:>12.0} {:>10} {:>10} {:>10} {:>10}",
            label,
            s.per_sec,
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(s.max)
        );
    }
}

/// Runs the benchmark through the host only (plugins without a library): `plugin_src` is the
/// plugin's source folder (for `plugin.json`), `bin` the built binary, `params` the resolve of a
/// service with `expect` instances. Prints the table.
pub fn run_host(
    title: &str,
    plugin_src: &Path,
    bin: &Path,
    params: ResolveParams,
    expect: usize,
    default_calls: usize,
) {
    let calls = calls(default_calls);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let stats = rt.block_on(via_host(plugin_src, bin, &params, expect, calls));
    print_table(title, expect, calls, &[("plugin process via host", &stats)]);
}

/// Runs the benchmark for one plugin with a library: `plugin_src` is its source folder (for
/// `plugin.json`), `bin` the built binary, `plugin` an in-process instance, `params` the resolve of
/// a service with `expect` instances. Prints the table and the host/in-process ratio.
pub async fn run<P: Plugin>(
    title: &str,
    plugin_src: &Path,
    bin: &Path,
    plugin: P,
    params: ResolveParams,
    expect: usize,
    default_calls: usize,
) {
    let calls = calls(default_calls);
    let via_host = via_host(plugin_src, bin, &params, expect, calls).await;
    let in_process = time(warmup(calls), calls, expect, || {
        let plugin = &plugin;
        let params = params.clone();
        async move {
            tributary_plugin_sdk::call(plugin, params)
                .await
                .map(|r| r.targets.len())
                .map_err(|e| e.message)
        }
    })
    .await;
    print_table(
        title,
        expect,
        calls,
        &[
            ("plugin process via host", &via_host),
            ("in-process (SDK call)", &in_process),
        ],
    );
    println!(
        "host overhead: p50 ratio host/in-process = {:.2}",
        via_host.p50.as_secs_f64() / in_process.p50.as_secs_f64()
    );
}
