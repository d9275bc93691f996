//! The resolve benchmark shared by the consul, kubernetes and ec2 plugins: the same service of 100
//! instances resolved sequentially, through the real plugin host (the built plugin process) and
//! in-process (the SDK's `call`, no process, no pipes), in the same run. Prints one table.

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

/// Runs the benchmark for one plugin: `plugin_src` is its source folder (for `plugin.json`), `bin`
/// the built binary, `plugin` an in-process instance, `params` the resolve of a service with
/// `expect` instances. Prints the table.
pub async fn run<P: Plugin>(
    title: &str,
    plugin_src: &Path,
    bin: &Path,
    plugin: P,
    params: ResolveParams,
    expect: usize,
    default_calls: usize,
) {
    let calls: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_calls);
    let warmup = (calls / 10).max(5);
    let tmp = tempfile::tempdir().unwrap();
    let plugins = crate::daemon::plugins_dir(tmp.path(), plugin_src, bin);
    let (host, errors) = PluginHost::load(&plugins, HostOptions::default());
    assert!(errors.is_empty(), "{errors:?}");
    let name = host.plugins()[0].name.clone();

    let via_host = time(warmup, calls, expect, || {
        let host = &host;
        let name = &name;
        let params = params.clone();
        async move {
            host.resolve(name, params)
                .await
                .map(|r| r.targets.len())
                .map_err(|e| e.to_string())
        }
    })
    .await;
    host.shutdown().await;
    let in_process = time(warmup, calls, expect, || {
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

    println!(
        "{title}: {expect} instances, {calls} sequential resolutions per row ({warmup} warm-up)"
    );
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "path", "resolutions/s", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for (label, s) in [
        ("plugin process via host", &via_host),
        ("in-process (SDK call)", &in_process),
    ] {
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
    println!(
        "host overhead: p50 ratio host/in-process = {:.2}",
        via_host.p50.as_secs_f64() / in_process.p50.as_secs_f64()
    );
}
