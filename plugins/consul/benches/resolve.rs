//! `cargo bench -p tributary-plugin-consul --bench resolve`: resolutions/s and latency of a service
//! with 100 passing instances on the fake Consul agent (`BENCH_CALLS=N` changes the count).

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tributary_fakes::consul::{FakeConsul, Instance};
use tributary_protocol::{ConfigMap, ResolveParams};

fn main() {
    let fake = FakeConsul::start();
    for i in 0..100u16 {
        fake.register(
            Instance::new(
                &format!("web-{i}"),
                "web",
                &format!("10.0.{}.{}", i / 250, i % 250 + 1),
                8000 + i,
            )
            .tags(&["v1"])
            .weights(2, 1),
        );
    }
    fake.register(Instance::new("db-1", "db", "10.9.0.1", 5432));
    let params = ResolveParams {
        provider: "registry".into(),
        config: serde_json::from_value::<ConfigMap>(
            json!({"address": fake.address(), "token": "bench-token-123", "healthy_only": true}),
        )
        .unwrap(),
        service: "web".into(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(tributary_fakes::bench::run(
        "consul (fake agent)",
        Path::new(env!("CARGO_MANIFEST_DIR")),
        Path::new(env!("CARGO_BIN_EXE_tributary-plugin-consul")),
        tributary_plugin_consul::Consul::new(Duration::from_secs(10)),
        params,
        100,
        2000,
    ));
}
