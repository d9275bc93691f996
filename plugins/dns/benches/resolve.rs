//! Benchmark of the `dns` plugin against a real dnsmasq: sequential `discovery.resolve` calls
//! through the real plugin host for an SRV name with 100 instances (100 SRV records, 100 targets
//! with A records; the answer does not fit in UDP, so each resolution also goes over TCP), and for
//! an A name with 100 addresses.
//!
//! Run: `cargo bench -p tributary-plugin-dns --bench resolve` (`BENCH_CALLS=N`, default 1000).

#[path = "../tests/dnsmasq/mod.rs"]
mod dnsmasq;
#[path = "../../file/benches/support.rs"]
mod support;

use serde_json::json;
use tributary_protocol::{ConfigMap, ResolveParams};

fn main() {
    let mut records = Vec::new();
    for i in 0..100 {
        records.push(format!(
            "--srv-host=_http._tcp.api.test,node{i}.test,{},10,{}",
            10000 + i,
            i % 5 + 1
        ));
        records.push(format!(
            "--host-record=node{i}.test,10.0.{}.{}",
            i / 200,
            i % 200 + 1
        ));
        records.push(format!("--host-record=web.test,10.1.0.{}", i + 1));
    }
    let dns = dnsmasq::Dnsmasq::start(60, &records);
    let tmp = tempfile::tempdir().unwrap();
    let plugins = support::plugins_dir(
        tmp.path(),
        "dns",
        concat!(env!("CARGO_MANIFEST_DIR"), "/plugin.json"),
        env!("CARGO_BIN_EXE_tributary-plugin-dns"),
    );
    let n = support::calls(1000);
    let params = |config: serde_json::Value, service: &str| ResolveParams {
        provider: "dns".into(),
        config: serde_json::from_value::<ConfigMap>(config).unwrap(),
        service: service.into(),
    };
    support::run(
        "dns SRV (dnsmasq, UDP truncated -> TCP, additional-section addresses)",
        &plugins,
        "dns",
        params(
            json!({ "nameserver": dns.nameserver() }),
            "_http._tcp.api.test",
        ),
        100,
        n,
    );
    support::run(
        "dns A (dnsmasq, 100 addresses)",
        &plugins,
        "dns",
        params(
            json!({ "nameserver": dns.nameserver(), "record_type": "A", "port": 8080 }),
            "web.test",
        ),
        100,
        n,
    );
}
