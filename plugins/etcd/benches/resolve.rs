//! Benchmark of the `etcd` plugin against a real etcd: sequential `discovery.resolve` calls through
//! the real plugin host for a service with 100 instance keys, without authentication and with it
//! (cached token).
//!
//! Run: `cargo bench -p tributary-plugin-etcd --bench resolve` (`BENCH_CALLS=N`, default 2000).

#[path = "../tests/etcd/mod.rs"]
mod etcd;
#[path = "../../file/benches/support.rs"]
mod support;

use serde_json::json;
use tributary_protocol::{ConfigMap, ResolveParams};

fn main() {
    let mut e = etcd::Etcd::start();
    for i in 0..100 {
        e.put(
            &format!("/services/api/node-{i:03}"),
            &format!(
                r#"{{"address":"10.0.{}.{}","port":8080,"weight":{},"tags":["zone-{}"]}}"#,
                i / 200,
                i % 200 + 1,
                i % 5 + 1,
                i % 3
            ),
        );
        e.put(&format!("/services/other/node-{i:03}"), "10.9.0.1:80");
    }
    let tmp = tempfile::tempdir().unwrap();
    let plugins = support::plugins_dir(
        tmp.path(),
        "etcd",
        concat!(env!("CARGO_MANIFEST_DIR"), "/plugin.json"),
        env!("CARGO_BIN_EXE_tributary-plugin-etcd"),
    );
    let n = support::calls(2000);
    let params = |config: serde_json::Value| ResolveParams {
        provider: "etcd".into(),
        config: serde_json::from_value::<ConfigMap>(config).unwrap(),
        service: "api".into(),
    };
    support::run(
        "etcd (v3 JSON range, no auth)",
        &plugins,
        "etcd",
        params(json!({ "endpoints": e.endpoint() })),
        100,
        n,
    );
    e.enable_auth("bench-root-pw");
    e.add_reader("bench", "bench-pw", "/services/");
    support::run(
        "etcd (v3 JSON range, auth, cached token)",
        &plugins,
        "etcd",
        params(json!({ "endpoints": e.endpoint(), "username": "bench", "password": "bench-pw" })),
        100,
        n,
    );
}
