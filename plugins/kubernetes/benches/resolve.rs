//! `cargo bench -p tributary-plugin-kubernetes --bench resolve`: resolutions/s and latency of a
//! Service with 100 ready endpoints (two EndpointSlices) on the fake API server over HTTPS
//! (`BENCH_CALLS=N` changes the count).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tributary_fakes::kube::{endpoint, slice, FakeKube};
use tributary_protocol::{ConfigMap, ResolveParams};

fn main() {
    let token = "bench-token-0123456789";
    let k = FakeKube::start(token);
    let slices: Vec<Value> = (0..2)
        .map(|s| {
            let eps = (0..50)
                .map(|i| endpoint(&format!("10.1.{s}.{}", i + 1), Some(true), "zone-a", "pod"))
                .collect();
            slice(
                "default",
                "web",
                &format!("web-{s}"),
                &[("app", "web")],
                "IPv4",
                &[("http", 8080)],
                eps,
            )
        })
        .collect();
    k.set_slices(slices);
    let params = ResolveParams {
        provider: "kubernetes".into(),
        config: serde_json::from_value::<ConfigMap>(
            json!({"api_server": k.api_server(), "token": token, "ca_cert": k.ca_pem()}),
        )
        .unwrap(),
        service: "web".into(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(tributary_fakes::bench::run(
        "kubernetes (fake API server, HTTPS)",
        Path::new(env!("CARGO_MANIFEST_DIR")),
        Path::new(env!("CARGO_BIN_EXE_tributary-plugin-kubernetes")),
        tributary_plugin_kubernetes::Kubernetes::new(Duration::from_secs(10)),
        params,
        100,
        2000,
    ));
}
