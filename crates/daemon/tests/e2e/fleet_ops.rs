//! Operating a fleet ("What users running 20–200 hosts need to see", `fleet
//! forget-host`): a real 3-member etcd cluster, three real daemons with their own nginx (the
//! harness: `common/fleet.rs`).
//!
//! - `tributary fleet forget-host`: a live host is refused (nothing changes), an unknown host is
//!   refused, a stopped host's outcomes are removed from etcd and from every host's fleet view;
//!   `--force` ends a live host's session (its daemon comes back with a new one).
//! - `/metrics`: per binding the set age and its resolver, per host whether it is alive, and how
//!   many bindings this host is behind; correct after changes, and the set age grows while no host can
//!   resolve (the registry answers garbage), below the alert threshold again once it answers.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::fleet::{applied_all, Fleet, Host, PREFIX, WAIT};
use common::http;
use serde_json::json;
use tributary_fakes::wait::poll_for;

const INTERVAL_SECS: f64 = 10.0;

/// `tributary fleet ARGS --json` on host `h`: (success, parsed stdout or the error's JSON).
fn fleet_cli(h: &Host, args: &[&str]) -> (bool, serde_json::Value) {
    let mut all = vec!["fleet"];
    all.extend_from_slice(args);
    h.daemon.cli_json(&all)
}

/// The hosts of `viewer`'s fleet view of `name`.
fn view_hosts(h: &Host, name: &str) -> Vec<String> {
    h.fleet_states(name)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect()
}

fn outcome_keys_of(f: &Fleet, host: &str) -> Vec<String> {
    f.cluster
        .dump(&format!("{PREFIX}outcomes-by-host/{host}/"))
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[test]
fn forget_host_removes_a_stopped_hosts_outcomes_everywhere_and_refuses_a_live_or_unknown_host() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(0, "api");
    f.add(1, "db");
    for name in ["api", "db"] {
        applied_all(&f, 0, name);
        applied_all(&f, 1, name);
    }
    assert_eq!(outcome_keys_of(&f, "host-b").len(), 2);

    // A live host: refused, named, with how to stop it; nothing deleted.
    let (ok, v) = fleet_cli(&f.hosts[0], &["forget-host", "host-b"]);
    assert!(!ok, "{v}");
    assert_eq!(v["error"]["status"], 409, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("host \"host-b\" is alive")
            && msg.contains("stop that daemon first")
            && msg.contains("--force")
            && msg.contains("nothing was deleted"),
        "{msg}"
    );
    assert_eq!(outcome_keys_of(&f, "host-b").len(), 2);
    // This host itself: alive too.
    let (ok, v) = fleet_cli(&f.hosts[0], &["forget-host", "host-a"]);
    assert!(!ok && v["error"]["status"] == 409, "{v}");

    // An unknown host: refused, nothing changed.
    let before = f.cluster.dump(PREFIX).len();
    let (ok, v) = fleet_cli(&f.hosts[0], &["forget-host", "host-zz"]);
    assert!(!ok, "{v}");
    assert_eq!(v["error"]["status"], 404, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("no host \"host-zz\"") && msg.contains("nothing was deleted"),
        "{msg}"
    );
    assert_eq!(f.cluster.dump(PREFIX).len(), before);
    // A bad host id through the API: 400.
    let (st, v) = f.hosts[0]
        .daemon
        .api("DELETE", "/api/v1/fleet/hosts/host-c?force=maybe", None);
    assert_eq!(st, 400, "{v}");

    // C stops: its outcomes stay, shown not alive, on every host.
    f.hosts[2].daemon.stop();
    for viewer in [0, 1] {
        poll_for("C shown not alive", WAIT, || {
            let (_, v) = f.hosts[viewer]
                .daemon
                .api("GET", "/api/v1/fleet/hosts", None);
            let c = v["hosts"]
                .as_array()
                .and_then(|a| a.iter().find(|h| h["host"] == "host-c").cloned());
            match c {
                Some(c) if c["alive"] == false => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
    }
    assert_eq!(outcome_keys_of(&f, "host-c").len(), 2);

    // Forgotten through A's CLI: gone from etcd and from A's and B's views.
    let (ok, v) = fleet_cli(&f.hosts[0], &["forget-host", "host-c"]);
    assert!(ok, "{v}");
    assert_eq!(
        v,
        json!({"host": "host-c", "keys_deleted": 2, "session_ended": false})
    );
    assert_eq!(outcome_keys_of(&f, "host-c"), Vec::<String>::new());
    for viewer in [0, 1] {
        poll_for("C gone from the views", WAIT, || {
            let left: Vec<_> = ["api", "db"]
                .iter()
                .filter(|n| view_hosts(&f.hosts[viewer], n).contains(&"host-c".to_string()))
                .collect();
            let (_, v) = f.hosts[viewer]
                .daemon
                .api("GET", "/api/v1/fleet/hosts", None);
            let listed = v["hosts"]
                .as_array()
                .is_some_and(|a| a.iter().any(|h| h["host"] == "host-c"));
            if left.is_empty() && !listed {
                Ok(())
            } else {
                Err(format!("{left:?} {v}"))
            }
        });
    }
    // The others' outcomes stay; forgetting C again (through B's API): unknown now.
    assert_eq!(outcome_keys_of(&f, "host-a").len(), 2);
    let (st, v) = f.hosts[1]
        .daemon
        .api("DELETE", "/api/v1/fleet/hosts/host-c", None);
    assert_eq!(st, 404, "{v}");

    // --force on a live host: its session is ended (its claims go), its outcomes deleted; its
    // daemon, still running, takes a new session and is alive again.
    let (ok, v) = fleet_cli(&f.hosts[0], &["forget-host", "host-b", "--force"]);
    assert!(ok, "{v}");
    assert_eq!(v["session_ended"], true, "{v}");
    poll_for("B alive again with a new session", WAIT, || {
        let (_, v) = f.hosts[0].daemon.api("GET", "/api/v1/fleet/hosts", None);
        let b = v["hosts"]
            .as_array()
            .and_then(|a| a.iter().find(|h| h["host"] == "host-b").cloned());
        match b {
            Some(b) if b["alive"] == true => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

/// The sample of `series` with exactly these `labels` (in the order the encoder writes them)
/// in host `h`'s `/metrics`.
fn sample(h: &Host, series: &str, labels: &str) -> Option<f64> {
    let token = h.daemon.token();
    let (st, text) = http(h.daemon.port, "GET", "/metrics", Some(&token), None);
    assert_eq!(st, 200, "{text}");
    let want = format!("{series}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
}

/// Every sample of `series` in host `h`'s `/metrics`, by label text.
fn samples(h: &Host, series: &str) -> BTreeMap<String, f64> {
    let token = h.daemon.token();
    let (_, text) = http(h.daemon.port, "GET", "/metrics", Some(&token), None);
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix('{'))
        .filter_map(|l| {
            let (labels, v) = l.rsplit_once("} ")?;
            Some((labels.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The fleet's set age of `name`: the minimum over the live hosts of `which`.
fn fleet_age(f: &Fleet, which: &[usize], name: &str) -> Option<f64> {
    which
        .iter()
        .filter_map(|&i| {
            sample(
                &f.hosts[i],
                "tributary_fleet_binding_set_age_seconds",
                &format!("binding=\"{name}\""),
            )
        })
        .reduce(f64::min)
}

#[test]
fn metrics_show_set_age_resolver_and_hosts_behind_and_the_age_grows_while_nobody_can_resolve() {
    let mut f = Fleet::start(["", "", ""]);
    let names = ["m0", "m1", "m2"];
    for n in names {
        f.add(0, n);
    }
    for n in names {
        applied_all(&f, 0, n);
    }
    // Every host alive; each host behind on nothing (a host says only how far behind it is
    // itself: it does not read the others' outcomes); each binding's resolver as the API says.
    for h in &f.hosts {
        poll_for(&format!("{}: not behind", h.id), WAIT, || {
            let behind = samples(h, "tributary_fleet_host_behind_bindings");
            let alive = samples(h, "tributary_fleet_host_alive");
            let want: BTreeMap<String, f64> = [(format!("host=\"{}\"", h.id), 0.0)].into();
            let all_alive = alive.len() == 3 && alive.values().all(|v| *v == 1.0);
            if behind == want && all_alive {
                Ok(())
            } else {
                Err(format!("behind {behind:?} alive {alive:?}"))
            }
        });
    }
    for n in names {
        let resolver = poll_for("a resolver", WAIT, || {
            f.hosts[0].resolver(n).ok_or_else(|| "none".to_string())
        });
        let got = samples(&f.hosts[1], "tributary_fleet_binding_resolver");
        assert_eq!(
            got.get(&format!("binding=\"{n}\",host=\"{resolver}\"")),
            Some(&1.0),
            "{got:?}"
        );
        assert_eq!(
            got.keys()
                .filter(|k| k.contains(&format!("\"{n}\"")))
                .count(),
            1,
            "one resolver of {n}: {got:?}"
        );
        assert_eq!(
            sample(
                &f.hosts[2],
                "tributary_fleet_binding_interval_seconds",
                &format!("binding=\"{n}\"")
            ),
            Some(INTERVAL_SECS)
        );
    }

    // C stops; the registry changes: A and B serve it and are behind on nothing; C is gone
    // (alive 0 on both), and neither says how far behind C is (C's own scrape would).
    f.hosts[2].daemon.stop();
    f.registry("two");
    for n in names {
        f.wait_served(&[0, 1], n, "two");
    }
    for h in &f.hosts[..2] {
        poll_for(
            &format!("{}: C gone, itself not behind", h.id),
            WAIT,
            || {
                let behind = samples(h, "tributary_fleet_host_behind_bindings");
                let alive = samples(h, "tributary_fleet_host_alive");
                let want: BTreeMap<String, f64> = [(format!("host=\"{}\"", h.id), 0.0)].into();
                let ok = behind == want && alive.get("host=\"host-c\"") == Some(&0.0);
                if ok {
                    Ok(())
                } else {
                    Err(format!("behind {behind:?} alive {alive:?}"))
                }
            },
        );
    }
    // At rest the fleet's set age stays below the alert threshold (3 intervals).
    for n in names {
        let age = fleet_age(&f, &[0, 1], n).expect("a set age");
        assert!(age < 3.0 * INTERVAL_SECS, "{n}: {age}");
    }

    // The registry answers garbage: no host can resolve; the fleet's set age of every binding
    // passes 3 intervals (the alert), and its files stay.
    std::fs::write(&f.targets, "not json").unwrap();
    poll_for(
        "every set age past 3 intervals",
        Duration::from_secs(90),
        || {
            let ages: Vec<Option<f64>> = names.iter().map(|n| fleet_age(&f, &[0, 1], n)).collect();
            if ages
                .iter()
                .all(|a| a.is_some_and(|a| a > 3.0 * INTERVAL_SECS))
            {
                Ok(())
            } else {
                Err(format!("{ages:?}"))
            }
        },
    );
    for n in names {
        assert_eq!(f.hosts[0].body(n).as_deref(), Some("two"));
    }
    // It answers again: the age is below the threshold again (the resolver resolved).
    f.registry("one");
    poll_for(
        "set ages below 3 intervals again",
        Duration::from_secs(90),
        || {
            let ages: Vec<Option<f64>> = names.iter().map(|n| fleet_age(&f, &[0, 1], n)).collect();
            if ages
                .iter()
                .all(|a| a.is_some_and(|a| a < 2.0 * INTERVAL_SECS))
            {
                Ok(())
            } else {
                Err(format!("{ages:?}"))
            }
        },
    );
}
