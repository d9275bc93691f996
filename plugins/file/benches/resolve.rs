//! Benchmark of the `file` plugin: sequential `discovery.resolve` calls through the real plugin host
//! for a service with 100 instances in a YAML file (other services around it, as in a real file).
//!
//! Run: `cargo bench -p tributary-plugin-file --bench resolve` (`BENCH_CALLS=N`, default 2000).

#[path = "support.rs"]
mod support;

use serde_json::json;
use tributary_protocol::{ConfigMap, ResolveParams};

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for s in 0..20 {
        text.push_str(&format!("svc{s}:\n"));
        for i in 0..100 {
            text.push_str(&format!(
                "  - {{address: 10.{s}.{}.{}, port: 8080, weight: {}, tags: [zone-{}]}}\n",
                i / 250,
                i % 250 + 1,
                i % 5 + 1,
                i % 3
            ));
        }
    }
    let file = tmp.path().join("services.yaml");
    std::fs::write(&file, text).unwrap();
    let plugins = support::plugins_dir(
        tmp.path(),
        "file",
        concat!(env!("CARGO_MANIFEST_DIR"), "/plugin.json"),
        env!("CARGO_BIN_EXE_tributary-plugin-file"),
    );
    let params = ResolveParams {
        provider: "file".into(),
        config: serde_json::from_value::<ConfigMap>(json!({ "path": file })).unwrap(),
        service: "svc7".into(),
    };
    support::run(
        "file (YAML, 20 services x 100)",
        &plugins,
        "file",
        params,
        100,
        support::calls(2000),
    );
}
