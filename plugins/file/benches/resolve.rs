//! Benchmark of the `file` plugin: sequential `discovery.resolve` calls through the real plugin host
//! for a service with 100 instances in a YAML file (other services around it, as in a real file).
//!
//! Run: `cargo bench -p tributary-plugin-file --bench resolve` (`BENCH_CALLS=N`, default 2000).

use std::path::Path;

use serde_json::json;
use tributary_fakes::host::params;

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
    tributary_fakes::bench::run_host(
        "file (YAML, 20 services x 100)",
        Path::new(env!("CARGO_MANIFEST_DIR")),
        Path::new(env!("CARGO_BIN_EXE_tributary-plugin-file")),
        params("file", json!({ "path": file }), "svc7"),
        100,
        2000,
    );
}
