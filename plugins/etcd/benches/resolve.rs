//! Benchmark of the `etcd` plugin against a real etcd: sequential `discovery.resolve` calls through
//! the real plugin host for a service with 100 instance keys, without authentication and with it
//! (cached token).
//!
//! Run: `cargo bench -p tributary-plugin-etcd --bench resolve` (`BENCH_CALLS=N`, default 2000).

use std::path::Path;

use serde_json::json;
use tributary_fakes::bench::run_host;
use tributary_fakes::etcd::Etcd;
use tributary_fakes::host::params;

fn main() {
    let mut e = Etcd::start();
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(env!("CARGO_BIN_EXE_tributary-plugin-etcd"));
    run_host(
        "etcd (v3 JSON range, no auth)",
        src,
        bin,
        params("etcd", json!({ "endpoints": e.endpoint() }), "api"),
        100,
        2000,
    );
    e.enable_auth("bench-root-pw");
    e.add_reader("bench", "bench-pw", "/services/");
    run_host(
        "etcd (v3 JSON range, auth, cached token)",
        src,
        bin,
        params(
            "etcd",
            json!({ "endpoints": e.endpoint(), "username": "bench", "password": "bench-pw" }),
            "api",
        ),
        100,
        2000,
    );
}
