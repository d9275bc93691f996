//! A bulk save that fails part-way (issue 22): a real 3-member etcd cluster whose members take
//! requests of at most 64 KiB (`--max-request-bytes`), three real daemons with their own nginx
//! (the harness: `common/fleet.rs`). A save of 120 bindings goes to etcd in transactions of 60
//! (`BINDINGS_PER_TXN`): the first (small values) is committed, the second (1 KiB services) is too
//! large for etcd. The first 60 are then on every host; the saving host must have them too (its engine, not only its
//! mirror), else it shows and resolves the old versions and refuses every later change of them
//! as prepared from a lagging copy (`docs/fleet.md`, "Saving a binding").

use crate::common;

use common::fleet::{Fleet, HostSetup, WAIT};
use serde_json::{json, Value};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_fakes::wait::poll_for;

const BINDINGS: usize = 2 * PER_TXN;
const PER_TXN: usize = tributary_store::etcd::BINDINGS_PER_TXN;
/// Above one transaction of 60 new small bindings (about 30 KiB), below one of 60 bindings with a
/// 1 KiB service (about 85 KiB).
const MAX_REQUEST_BYTES: &str = "65536";

fn name(i: usize) -> String {
    format!("b{i:03}")
}

fn input(i: usize, service: &str) -> Value {
    json!({"name": name(i), "plugin": "count", "provider": "c", "service": service,
        "interval_secs": 60})
}

fn bulk(f: &Fleet, host: usize, list: Vec<Value>) -> (u16, Value) {
    let body = json!({ "bindings": list }).to_string();
    f.hosts[host]
        .daemon
        .api("POST", "/api/v1/bindings/bulk", Some(&body))
}

fn service_on(f: &Fleet, host: usize, i: usize) -> String {
    let (_, v) = f.hosts[host].detail(&name(i));
    v["binding"]["service"].as_str().unwrap_or("").to_string()
}

/// Waits until host `host`'s API shows `service` for every binding in `which`.
fn wait_services(f: &Fleet, host: usize, which: std::ops::Range<usize>, service: &str) {
    poll_for(
        &format!(
            "{} shows service {service:.20} for {which:?}",
            f.hosts[host].id
        ),
        WAIT,
        || {
            let wrong: Vec<(String, String)> = which
                .clone()
                .map(|i| (name(i), service_on(f, host, i)))
                .filter(|(_, s)| s != service)
                .collect();
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} differ, first: {:?}",
                    wrong.len(),
                    wrong.first().map(|(n, s)| (n, &s[..s.len().min(20)]))
                ))
            }
        },
    );
}

#[test]
fn a_bulk_save_that_fails_part_way_leaves_the_saving_host_with_what_every_host_has() {
    let cluster = EtcdCluster::start_with_flags(3, &["--max-request-bytes", MAX_REQUEST_BYTES]);
    let f = Fleet::start_on(cluster, <[HostSetup; 3]>::default(), &[]);
    let (st, v) = bulk(&f, 0, (0..BINDINGS).map(|i| input(i, "web")).collect());
    assert_eq!(st, 200, "{v}");
    wait_services(&f, 1, 0..BINDINGS, "web");

    // The first 60 get a short new service, the last 60 one of 1 KiB: the second transaction is
    // too large for etcd.
    let long = "x".repeat(1000);
    let list = (0..BINDINGS)
        .map(|i| input(i, if i < PER_TXN { "web-v2" } else { &long }))
        .collect();
    let (st, v) = bulk(&f, 0, list);
    assert_ne!(st, 200, "the save must fail: {v}");
    let said = v.to_string();
    assert!(said.contains("too large"), "{said}");

    // Committed on every host, the saving one included; the rest nowhere.
    for h in 0..3 {
        wait_services(&f, h, 0..PER_TXN, "web-v2");
        assert_eq!(service_on(&f, h, PER_TXN), "web", "{}", f.hosts[h].id);
        assert_eq!(service_on(&f, h, BINDINGS - 1), "web", "{}", f.hosts[h].id);
    }
    assert!(
        said.contains("b000"),
        "the error names what was saved: {said}"
    );
    // The saving host changes a binding of the committed part again: its copy is the stored one,
    // so the change is not refused as prepared from a lagging copy.
    let body = input(0, "web-v3").to_string();
    let (st, v) =
        f.hosts[0]
            .daemon
            .api("PUT", &format!("/api/v1/bindings/{}", name(0)), Some(&body));
    assert_eq!(st, 200, "{v}");
    wait_services(&f, 2, 0..1, "web-v3");
}
