//! `cargo bench -p tributary-plugin-ec2 --bench resolve`: resolutions/s and latency of a tag with 100
//! running instances on moto_server (IAM auth on, every request SigV4-verified by moto)
//! (`BENCH_CALLS=N` changes the count; moto is Python, so the default is small).

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tributary_fakes::moto::{Moto, REGION};
use tributary_protocol::{ConfigMap, ResolveParams};

fn main() {
    let moto = Moto::start();
    moto.run_instances(100, &[("app", "web")], None);
    moto.run_instances(5, &[("app", "db")], None);
    let params = ResolveParams {
        provider: "ec2".into(),
        config: serde_json::from_value::<ConfigMap>(json!({
            "region": REGION, "access_key_id": moto.access_key_id,
            "secret_access_key": moto.secret_access_key, "endpoint": moto.endpoint(), "port": 8080
        }))
        .unwrap(),
        service: "app=web".into(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(tributary_fakes::bench::run(
        "ec2 (moto_server)",
        Path::new(env!("CARGO_MANIFEST_DIR")),
        Path::new(env!("CARGO_BIN_EXE_tributary-plugin-ec2")),
        tributary_plugin_ec2::Ec2::new(Duration::from_secs(10)),
        params,
        100,
        200,
    ));
}
