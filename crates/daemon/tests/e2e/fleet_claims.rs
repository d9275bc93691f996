//! Hosts that cannot resolve a binding: a real 3-member etcd cluster, three real
//! daemons with their own nginx (the harness: `common/fleet.rs`). A host without the binding's
//! plugin, or without the secrets key its newest version is sealed with, must not hold its
//! resolver claim: every change of the registry reaches the hosts that can apply it within three
//! intervals (`docs/fleet.md`, "A host that cannot resolve a binding").

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::fleet::{Fleet, HostSetup, WAIT};
use serde_json::json;

/// The bindings' interval (the shortest the daemon takes).
const INTERVAL: Duration = Duration::from_secs(10);
const BINDINGS: usize = 30;

fn names() -> Vec<String> {
    (0..BINDINGS).map(|i| format!("b{i:02}")).collect()
}

/// Saves every binding of `names` (the counting plugin, interval 10 s, service `service`) in one
/// bulk request through host `i`'s API.
fn save_all(f: &Fleet, i: usize, names: &[String], service: &str) {
    let list: Vec<_> = names
        .iter()
        .map(|n| {
            json!({"name": n, "plugin": "count", "provider": "c", "service": service,
                "interval_secs": INTERVAL.as_secs()})
        })
        .collect();
    let body = json!({ "bindings": list }).to_string();
    let (st, v) = f.hosts[i]
        .daemon
        .api("POST", "/api/v1/bindings/bulk", Some(&body));
    assert!(st < 300, "bulk save on {}: {st} {v}", f.hosts[i].id);
}

/// Waits until every host in `which` serves `body` for every binding of `names`, at most
/// `limit`; the (host, binding) pairs still not served when it passed otherwise.
fn served_within(
    f: &Fleet,
    which: &[usize],
    names: &[String],
    body: &str,
    limit: Duration,
) -> Result<Duration, Vec<String>> {
    let t0 = Instant::now();
    let mut pending: BTreeSet<(usize, &str)> = which
        .iter()
        .flat_map(|&i| names.iter().map(move |n| (i, n.as_str())))
        .collect();
    loop {
        pending.retain(|&(i, n)| f.hosts[i].body(n).as_deref() != Some(body));
        if pending.is_empty() {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return Err(pending
                .iter()
                .map(|&(i, n)| {
                    format!(
                        "{} {n} (served {:?}, resolver {:?})",
                        f.hosts[i].id,
                        f.hosts[i].body(n),
                        f.hosts[0].resolver(n)
                    )
                })
                .collect());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The bindings of `names` whose resolver claim host `viewer` sees held by `holder`.
fn held_by(f: &Fleet, viewer: usize, names: &[String], holder: &str) -> Vec<String> {
    names
        .iter()
        .filter(|n| f.hosts[viewer].resolver(n).as_deref() == Some(holder))
        .cloned()
        .collect()
}

#[test]
fn a_host_with_an_empty_plugins_dir_holds_no_claim_and_every_host_serves_every_change_within_3_intervals(
) {
    // Host C has no plugin at all: it cannot resolve any binding, it applies what A and B publish.
    let f = Fleet::start_hosts(
        [
            HostSetup::default(),
            HostSetup::default(),
            HostSetup {
                empty_plugins_dir: true,
                ..HostSetup::default()
            },
        ],
        &[],
    );
    let names = names();
    save_all(&f, 0, &names, "web");
    if let Err(left) = served_within(&f, &[0, 1, 2], &names, "one", WAIT) {
        panic!(
            "bindings created on A not served everywhere: {left:?}\nC's log: {}",
            f.hosts[2].daemon.log_text()
        );
    }
    assert_eq!(held_by(&f, 0, &names, "host-c"), Vec::<String>::new());

    // The registry changes: every host serves it for every binding within 3 intervals.
    f.registry("two");
    match served_within(&f, &[0, 1, 2], &names, "two", 3 * INTERVAL) {
        Ok(took) => eprintln!("every host serves the change of {BINDINGS} bindings after {took:?}"),
        Err(left) => panic!(
            "not served within 3 intervals ({:?}): {} pairs: {left:?}\nC's log: {}",
            3 * INTERVAL,
            left.len(),
            f.hosts[2].daemon.log_text()
        ),
    }
    assert_eq!(held_by(&f, 1, &names, "host-c"), Vec::<String>::new());
    assert_eq!(f.hosts[2].calls(), 0);
    // C's own fleet view shows C applying the sets A and B resolved.
    let c = &f.hosts[2];
    let states = c.fleet_states(&names[0]);
    assert!(
        states
            .iter()
            .any(|(h, st, _)| h == "host-c" && st == "applied"),
        "{states:?}"
    );
}

#[test]
fn a_host_without_the_new_secrets_key_gives_its_claims_up_and_the_others_serve_every_change_within_3_intervals(
) {
    // A and B seal with the new key (KEYS[1]) and open both; C has the old key only (a rotation
    // half done: docs/fleet.md, "Rotation").
    let f = Fleet::start_hosts(
        [
            HostSetup {
                keys: &[1, 0],
                ..HostSetup::default()
            },
            HostSetup {
                keys: &[1, 0],
                ..HostSetup::default()
            },
            HostSetup {
                keys: &[0],
                ..HostSetup::default()
            },
        ],
        &[],
    );
    let names = names();
    // Created through C (sealed with the old key): every host reads them. (Nothing re-seals them
    // without an explicit retirement of the old key; the sets A and B publish carry a MAC under
    // each of their keys, so C, which has the old one only, verifies them.)
    save_all(&f, 2, &names, "web");
    if let Err(left) = served_within(&f, &[0, 1, 2], &names, "one", WAIT) {
        panic!("bindings created on C not served everywhere: {left:?}");
    }
    // Every binding changed through A (a new version, sealed with the new key), and the
    // registry changes: C keeps the version it can read and must not resolve it for the fleet;
    // A and B serve the change of every binding within 3 intervals.
    save_all(&f, 0, &names, "web2");
    f.registry("two");
    match served_within(&f, &[0, 1], &names, "two", 3 * INTERVAL) {
        Ok(took) => eprintln!("A and B serve the change of {BINDINGS} bindings after {took:?}"),
        Err(left) => panic!(
            "not served within 3 intervals ({:?}): {} pairs: {left:?}\nC's log: {}",
            3 * INTERVAL,
            left.len(),
            f.hosts[2].daemon.log_text()
        ),
    }
    assert_eq!(held_by(&f, 0, &names, "host-c"), Vec::<String>::new());
    // C cannot read the new version: it keeps serving its servers (never an empty upstream)
    // and says which key it lacks.
    for n in &names {
        let body = f.hosts[2].body(n);
        assert!(
            matches!(body.as_deref(), Some("one" | "two")),
            "C serves {n}: {body:?}"
        );
    }
    assert!(
        f.hosts[2]
            .daemon
            .log_text()
            .contains("this host stops resolving it"),
        "C's log says why it stopped resolving"
    );
}

#[test]
fn a_host_whose_resolutions_keep_failing_steps_out_and_every_host_serves_every_change_within_3_intervals(
) {
    // Host C's plugin cannot reach the registry: each of its calls fails. It has the plugin, so
    // only its failures tell: after 3 in a row it steps out of each binding it resolved.
    let f = Fleet::start_hosts(
        [
            HostSetup::default(),
            HostSetup::default(),
            HostSetup {
                registry_unreachable: true,
                ..HostSetup::default()
            },
        ],
        &[],
    );
    let names = names();
    save_all(&f, 0, &names, "web");
    // C's first resolutions fail; its failure back-off at interval 10 s is 10 s: it steps out
    // after about 2 intervals, and another host resolves at once.
    if let Err(left) = served_within(&f, &[0, 1, 2], &names, "one", WAIT) {
        panic!(
            "bindings created on A not served everywhere: {left:?}\nC's log: {}",
            f.hosts[2].daemon.log_text()
        );
    }
    let c_calls = f.hosts[2].calls();
    assert!(c_calls > 0, "C tried to resolve (it is preferred for some)");
    assert_eq!(held_by(&f, 0, &names, "host-c"), Vec::<String>::new());
    assert!(
        f.hosts[2]
            .daemon
            .log_text()
            .contains("this host steps out of resolving the binding"),
        "C's log says it stepped out"
    );

    f.registry("two");
    match served_within(&f, &[0, 1, 2], &names, "two", 3 * INTERVAL) {
        Ok(took) => eprintln!("every host serves the change of {BINDINGS} bindings after {took:?}"),
        Err(left) => panic!(
            "not served within 3 intervals ({:?}): {} pairs: {left:?}",
            3 * INTERVAL,
            left.len()
        ),
    }
    // C calls its registry no more while it stays out (10 intervals at least 5 minutes).
    assert_eq!(f.hosts[2].calls(), c_calls);
    assert_eq!(held_by(&f, 1, &names, "host-c"), Vec::<String>::new());
}
