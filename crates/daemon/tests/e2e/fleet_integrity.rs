//! A target set put into etcd by someone who can write the prefix ("Integrity and
//! secrets"): a real 3-member etcd cluster, three real daemons with their own nginx (the
//! harness: `common/fleet.rs`). The forged set has the binding's right version and points at
//! another backend; no host may apply it (its nginx keeps serving, its upstream file stays as
//! it was) and every host reports it in the binding's fleet view and its log
//! (`docs/fleet.md`, "Integrity").

use crate::common;

use std::time::{Duration, Instant};

use common::fleet::{applied_all, Fleet, ALL, PREFIX};
use common::{assert_ok, http};
use serde_json::Value;

#[test]
fn a_forged_target_set_is_applied_by_no_host_and_every_host_reports_it() {
    let f = Fleet::start(["", "", ""]);
    // Interval 600 s: the forged set stays in etcd for the whole test (the resolver publishes a
    // genuine set over it at its next run; at 60 s, a loaded machine's run reached that run and
    // the hosts' `failed` turned back to `applied` before the fleet view was read).
    let out =
        f.hosts[0]
            .daemon
            .binding_add("web", "count", "c", "web", &[], &["--interval", "600"]);
    assert_ok(&out, "binding add web");
    f.wait_served(&ALL, "web", "one");
    applied_all(&f, 0, "web");
    let file = |i: usize| {
        std::fs::read_to_string(f.hosts[i].nginx.upstreams_dir().join("web.conf")).unwrap()
    };
    let files: Vec<String> = ALL.iter().map(|&i| file(i)).collect();

    // The published set, pointed at the other backend, without a MAC: what anyone who can write
    // the prefix can put (`etcdctl put`).
    let key = format!("{PREFIX}targets/web");
    let (_, genuine) = f
        .cluster
        .dump(&key)
        .into_iter()
        .find(|(k, _)| *k == key)
        .expect("a published set");
    let mut forged: Value = serde_json::from_str(&genuine).unwrap();
    forged["targets"][0]["port"] = f.backends.backend_port("two").into();
    forged.as_object_mut().unwrap().remove("mac");
    f.cluster.put(&key, forged.to_string().as_bytes());

    // Every host serves the backend it had, for 12 s.
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        for h in &f.hosts {
            let body = h.body("web");
            assert_eq!(
                body.as_deref(),
                Some("one"),
                "{} serves what a forged set says; log: {}",
                h.id,
                h.daemon.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for &i in &ALL {
        assert_eq!(
            file(i),
            files[i],
            "{}'s upstream file changed",
            f.hosts[i].id
        );
    }
    // Every host said so in its log, naming the key.
    for h in &f.hosts {
        let log = h.daemon.log_text();
        assert!(
            log.lines()
                .any(|l| l.contains("value from etcd refused") && l.contains(&key)),
            "{}'s log does not report the forged set: {log}",
            h.id
        );
    }
    // And in its metrics.
    for h in &f.hosts {
        let (st, text) = http(
            h.daemon.port,
            "GET",
            "/metrics",
            Some(&h.daemon.token()),
            None,
        );
        assert_eq!(st, 200);
        let n: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("tributary_store_refused_values "))
            .unwrap_or_else(|| panic!("{}: no tributary_store_refused_values in {text}", h.id))
            .trim()
            .parse()
            .unwrap();
        assert!(n >= 1.0, "{}: {n} refused values", h.id);
    }
    // The report reached the fleet view: each host's outcome of the binding is `failed`, saying
    // the set was refused.
    let hosts = f.wait_fleet(
        0,
        "web",
        &[
            ("host-a", "failed"),
            ("host-b", "failed"),
            ("host-c", "failed"),
        ],
    );
    for h in hosts {
        let msg = h["message"].as_str().unwrap_or("");
        assert!(msg.contains("refused") && msg.contains(&key), "{h}");
    }
}
