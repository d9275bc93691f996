//! Benchmark of the `dns` plugin against a real dnsmasq: sequential `discovery.resolve` calls
//! through the real plugin host for an SRV name with 100 instances (100 SRV records, 100 targets
//! with A records; the answer does not fit in UDP, so each resolution also goes over TCP), and for
//! an A name with 100 addresses.
//!
//! Run: `cargo bench -p tributary-plugin-dns --bench resolve` (`BENCH_CALLS=N`, default 1000).

use std::path::Path;

use serde_json::json;
use tributary_fakes::bench::run_host;
use tributary_fakes::dnsmasq::Dnsmasq;
use tributary_fakes::host::params;

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
    let dns = Dnsmasq::start(60, &records);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(env!("CARGO_BIN_EXE_tributary-plugin-dns"));
    run_host(
        "dns SRV (dnsmasq, UDP truncated -> TCP, additional-section addresses)",
        src,
        bin,
        params(
            "dns",
            json!({ "nameserver": dns.nameserver() }),
            "_http._tcp.api.test",
        ),
        100,
        1000,
    );
    run_host(
        "dns A (dnsmasq, 100 addresses)",
        src,
        bin,
        params(
            "dns",
            json!({ "nameserver": dns.nameserver(), "record_type": "A", "port": 8080 }),
            "web.test",
        ),
        100,
        1000,
    );
}
