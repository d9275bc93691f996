//! Benchmark loop shared by the `dns`, `etcd` and `file` plugins' benches (included with `#[path]`):
//! sequential `discovery.resolve` calls through the real plugin host to the real plugin binary.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_protocol::ResolveParams;

/// Number of timed calls: `BENCH_CALLS`, else `default`.
pub fn calls(default: usize) -> usize {
    std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A plugins directory in `root` with the plugin `name` (manifest `manifest_path`, executable `bin`).
pub fn plugins_dir(root: &Path, name: &str, manifest_path: &str, bin: &str) -> std::path::PathBuf {
    let plugins = root.join("plugins");
    std::fs::create_dir_all(plugins.join(name)).unwrap();
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(manifest_path).unwrap()).unwrap();
    m["executable"] = json!(bin);
    std::fs::write(plugins.join(name).join("plugin.json"), m.to_string()).unwrap();
    plugins
}

/// Runs `warmup` then `n` sequential resolves of `params` through the host and prints
/// resolutions/s, p50, p90, p99 and max; every answer must hold `expect_targets` targets.
pub fn run(
    label: &str,
    plugins: &Path,
    name: &str,
    params: ResolveParams,
    expect_targets: usize,
    n: usize,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (host, errors) = PluginHost::load(plugins, HostOptions::default());
        assert!(errors.is_empty(), "{errors:?}");
        let warmup = (n / 10).clamp(10, 200);
        for _ in 0..warmup {
            let r = host
                .resolve(name, params.clone())
                .await
                .unwrap_or_else(|e| panic!("{e}; stderr: {:?}", host.stderr_tail(name)));
            assert_eq!(r.targets.len(), expect_targets);
        }
        let mut samples = Vec::with_capacity(n);
        let start = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let r = host.resolve(name, params.clone()).await.unwrap();
            samples.push(t.elapsed());
            assert_eq!(r.targets.len(), expect_targets);
        }
        let total = start.elapsed();
        host.shutdown().await;
        samples.sort();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
        println!(
            "{label}: {n} sequential resolutions of a service with {expect_targets} instances"
        );
        println!(
            "  resolutions/s {:.0}   p50 {} ms   p90 {} ms   p99 {} ms   max {} ms",
            n as f64 / total.as_secs_f64(),
            ms(at(0.50)),
            ms(at(0.90)),
            ms(at(0.99)),
            ms(*samples.last().unwrap())
        );
    });
}
