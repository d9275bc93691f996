//! The opt-in degraded mode of a fleet ("hosts resolve and apply locally while the store
//! is down, reconciled when it returns"; `docs/fleet.md`, "Degraded mode"): a real 3-member etcd
//! cluster, three real daemons with `--resolve-during-store-outage` and their own nginx (the
//! harness: `common/fleet.rs`). Every member SIGKILLed: a registry change is resolved by every
//! host and served by its nginx (without the flag nothing changes: `e2e/fleet_cluster.rs`); the
//! members back: every host applies the fleet's published set again and shows `applied` at its
//! generation, no host behind.

use crate::common;

use std::time::Duration;

use common::fleet::{applied_all, Fleet, ALL, WAIT};
use tributary_fakes::wait::poll_for;

fn store_connected(f: &Fleet, i: usize) -> bool {
    let (st, v) = f.hosts[i].daemon.api("GET", "/api/v1/store", None);
    st == 200 && v["connected"] == true
}

#[test]
fn with_the_flag_every_host_resolves_and_applies_while_etcd_is_down_and_agrees_again_after() {
    let mut f = Fleet::start_with(["", "", ""], &["--resolve-during-store-outage"]);
    f.add(0, "api");
    f.wait_served(&ALL, "api", "one");
    applied_all(&f, 0, "api");
    let calls_before = f.calls();

    // Every member down: each host notices, then resolves and applies by itself.
    f.cluster.kill_all();
    for i in ALL {
        poll_for(&format!("{} disconnected", f.hosts[i].id), WAIT, || {
            if store_connected(&f, i) {
                Err("connected".to_string())
            } else {
                Ok(())
            }
        });
    }
    f.registry("two");
    f.wait_served(&ALL, "api", "two");
    let calls = f.calls();
    for (i, (now, before)) in calls.iter().zip(&calls_before).enumerate() {
        assert!(
            now > before,
            "host {i} called its registry during the outage: {calls:?}"
        );
    }
    // The hosts that do not hold the claim resolved by themselves and say so (the claim's holder
    // may also resolve while its session looks for a member: it held the claim).
    let alone = ALL
        .iter()
        .filter(|&&i| {
            let (_, v) = f.hosts[i].detail("api");
            v["history"].as_array().is_some_and(|h| {
                h.iter().any(|o| {
                    o["why"].as_str().is_some_and(|w| {
                        w.contains("resolved by this host alone") && w.contains("unreachable")
                    })
                })
            })
        })
        .count();
    assert!(alone >= 2, "{alone} hosts resolved alone");

    // The members come back: every host reconnects and applies the fleet's set again.
    f.cluster.restart_all();
    for i in ALL {
        poll_for(&format!("{} connected", f.hosts[i].id), WAIT, || {
            if store_connected(&f, i) {
                Ok(())
            } else {
                Err("not connected".to_string())
            }
        });
    }
    let hosts = applied_all(&f, 0, "api");
    let (_, v) = f.hosts[0].detail("api");
    let generation = v["binding"]["fleet"]["generation"].as_i64().unwrap_or(0);
    poll_for("every host applied the newest generation", WAIT, || {
        let (_, v) = f.hosts[2].daemon.api("GET", "/api/v1/fleet/hosts", None);
        let behind: Vec<_> = v["hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|h| h["behind_bindings"] != 0)
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(format!("{behind:?} (generation {generation}, {hosts:?})"))
        }
    });
    // One fleet again: a later change is resolved by the resolver only and served everywhere.
    let calls_back = f.calls();
    f.registry("one");
    f.wait_served(&ALL, "api", "one");
    std::thread::sleep(Duration::from_millis(200));
    let calls = f.calls();
    let new: usize = calls.iter().sum::<usize>() - calls_back.iter().sum::<usize>();
    assert!(
        new <= 3,
        "after the outage one host resolves per interval again: {calls_back:?} -> {calls:?}"
    );
}
