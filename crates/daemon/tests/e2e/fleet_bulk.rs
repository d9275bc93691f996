//! A bulk save that fails part-way: a real 3-member etcd cluster whose members take
//! requests of at most 64 KiB (`--max-request-bytes`), three real daemons with their own nginx
//! (the harness: `common/fleet.rs`). A save goes to etcd in transactions sized by bytes (1 MiB);
//! one that these members refuse as too large is sent again in halves, so a save of 120 new
//! bindings of a 1 KiB service each (about 160 KiB; transactions of 60, 90 KiB, refused) succeeds. A save of 60 small changes followed by one binding larger
//! than 64 KiB on its own (70 directives of 1 KiB) commits the 60 and fails on that one. The
//! 60 are then on every host; the saving host must have them too (its engine, not only its
//! mirror), else it shows and resolves the old versions and refuses every later change of them
//! as prepared from a lagging copy (`docs/fleet.md`, "Saving a binding").

use crate::common;

use common::fleet::{Fleet, HostSetup, PREFIX, WAIT};
use serde_json::{json, Value};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_fakes::wait::poll_for;

const BINDINGS: usize = 120;
/// The bindings the failing save changes before the one too large.
const SAVED: usize = 60;
/// Below one transaction of 60 new bindings of a 1 KiB service (about 90 KiB) and one binding with
/// 70 KiB of directives; above 60 small changes.
const MAX_REQUEST_BYTES: &str = "65536";

fn name(i: usize) -> String {
    format!("b{i:03}")
}

fn input(i: usize, service: &str) -> Value {
    json!({"name": name(i), "plugin": "count", "provider": "c", "service": service,
        "interval_secs": 60})
}

/// The service of the first save: 1 KiB, so that 60 new bindings (the most one transaction takes
/// by its operations) are more than these members take in one request.
fn first_service() -> String {
    format!("web{}", "x".repeat(1000))
}

/// Binding `i` with 70 directives of 1 KiB: larger than the members take in one request.
fn too_large(i: usize) -> Value {
    let mut v = input(i, &first_service());
    let directives: Vec<String> = (0..70)
        .map(|k| format!("note_{k} \"{}\";", "x".repeat(1000)))
        .collect();
    v["directives"] = json!(directives);
    v
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
    // 120 new bindings in one save: more than these members take in one request, so sent in
    // smaller transactions (before, with transactions of 60 bindings this held only because 60
    // small bindings happened to fit).
    let cluster = EtcdCluster::start_with_flags(3, &["--max-request-bytes", MAX_REQUEST_BYTES]);
    let f = Fleet::start_on(cluster, <[HostSetup; 3]>::default(), &[]);
    let first = first_service();
    let (st, v) = bulk(&f, 0, (0..BINDINGS).map(|i| input(i, &first)).collect());
    assert_eq!(st, 200, "{v}");
    wait_services(&f, 1, 0..BINDINGS, &first);
    // Each half of what was saved (60 new bindings: the most one transaction takes by its
    // operations) is more than one request of these members takes: the save was split by bytes.
    let stored: usize = f
        .cluster
        .dump(&format!("{PREFIX}bindings/"))
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let limit: usize = MAX_REQUEST_BYTES.parse().unwrap();
    assert!(stored / 2 > limit, "stored {stored} bytes");

    // The first 60 get a short new service, the next one 70 KiB of directives (too large for
    // etcd even alone), the last ones a new service too (never reached).
    let list = (0..BINDINGS)
        .map(|i| match i {
            _ if i < SAVED => input(i, "web-v2"),
            _ if i == SAVED => too_large(i),
            _ => input(i, "web-v2"),
        })
        .collect();
    let (st, v) = bulk(&f, 0, list);
    assert_eq!(st, 413, "the save must fail as too large: {v}");
    let said = v.to_string();
    assert!(said.contains("too large"), "{said}");
    assert!(!said.contains("unreachable"), "{said}");

    // Committed on every host, the saving one included; the rest nowhere.
    for h in 0..3 {
        wait_services(&f, h, 0..SAVED, "web-v2");
        assert_eq!(service_on(&f, h, SAVED), first, "{}", f.hosts[h].id);
        assert_eq!(service_on(&f, h, BINDINGS - 1), first, "{}", f.hosts[h].id);
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
