//! The fleet end to end: a real 3-member etcd cluster, three real daemons
//! (`serve --store etcd`), each with its own real nginx prefix (the harness:
//! `common/fleet.rs`).

use crate::common;

use std::time::{Duration, Instant};

use common::fleet::{applied_all, Fleet, Watcher, ALL, TTL_SECS, WAIT};
use common::{assert_ok, http};
use serde_json::{json, Value};
use tributary_fakes::wait::poll_for;

#[test]
fn a_binding_created_on_one_host_is_resolved_once_and_applied_by_all_three() {
    let f = Fleet::start(["", "", ""]);
    let t0 = Instant::now();
    f.add(0, "web");
    f.wait_served(&ALL, "web", "one");
    for viewer in ALL {
        let hosts = applied_all(&f, viewer, "web");
        for h in &hosts {
            assert_eq!(h["servers"], 1, "{h}");
            assert_eq!(h["alive"], true, "{h}");
        }
    }
    // One registry call in all, made by the resolver.
    let resolver = f.hosts[1].resolver("web").expect("a resolver");
    let calls = f.calls();
    assert_eq!(calls.iter().sum::<usize>(), 1, "{calls:?}");
    assert_eq!(f.host(&resolver).calls(), 1, "{resolver}: {calls:?}");

    // A registry change: resolved once (by the resolver, at its next interval), applied by all.
    let watcher = Watcher::start(f.hosts.iter().map(|h| h.nginx.port()).collect(), "web");
    f.registry("two");
    f.wait_served(&ALL, "web", "two");
    let calls = f.calls();
    let by_resolver = f.host(&resolver).calls();
    assert_eq!(
        calls.iter().sum::<usize>(),
        by_resolver,
        "only {resolver} calls the registry: {calls:?}"
    );
    // One call per interval (10 s) for the fleet, not one per host.
    let per_interval = t0.elapsed().as_secs() as usize / 10 + 2;
    assert!(
        by_resolver <= per_interval,
        "{calls:?} in {:?}",
        t0.elapsed()
    );
    // A refresh asked of a host that does not resolve calls no registry.
    let other = f.hosts.iter().find(|h| h.id != resolver).unwrap();
    let before = f.calls();
    let (st, body) = other
        .daemon
        .api("POST", "/api/v1/bindings/web/refresh", Some("{}"));
    assert!(st < 300, "{st} {body}");
    std::thread::sleep(Duration::from_secs(1));
    let after = f.calls();
    for (i, h) in f.hosts.iter().enumerate() {
        if h.id != resolver {
            assert_eq!(before[i], after[i], "{}: {before:?} -> {after:?}", h.id);
        }
    }
    let bad = watcher.finish();
    assert!(bad.is_empty(), "an nginx did not serve a backend: {bad:?}");
}

#[test]
fn the_resolver_killed_another_host_takes_over_and_no_nginx_is_emptied() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(1, "web");
    f.wait_served(&ALL, "web", "one");
    applied_all(&f, 0, "web");
    let resolver = f.hosts[0].resolver("web").expect("a resolver");
    let dead = f.hosts.iter().position(|h| h.id == resolver).unwrap();
    let live: Vec<usize> = ALL.iter().copied().filter(|i| *i != dead).collect();
    let watcher = Watcher::start(f.hosts.iter().map(|h| h.nginx.port()).collect(), "web");

    f.hosts[dead].sigkill();
    let killed = Instant::now();
    // Another host holds the claim once the dead host's lease expired (TTL 2 s).
    let viewer = &f.hosts[live[0]];
    let taker = poll_for("another host takes the claim", WAIT, || {
        match viewer.resolver("web") {
            Some(r) if r != resolver => Ok(r),
            other => Err(format!("{other:?}")),
        }
    });
    let took = killed.elapsed();
    eprintln!("{taker} took the claim {took:?} after {resolver} was killed (TTL {TTL_SECS} s)");
    // TTL, the watch's delay and a loaded machine: bounded, generously.
    assert!(took < Duration::from_secs(TTL_SECS + 13), "{took:?}");
    // The dead host shows as not live in the fleet view.
    poll_for("the dead host is not live", WAIT, || {
        let hosts = viewer.fleet_states("web");
        match hosts.iter().find(|(id, _, _)| *id == resolver) {
            Some((_, _, v)) if v["alive"] == false => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // A later registry change reaches the two live hosts, resolved by the new resolver only.
    let before = f.calls();
    f.registry("two");
    f.wait_served(&live, "web", "two");
    let after = f.calls();
    for (i, h) in f.hosts.iter().enumerate() {
        if h.id != taker {
            assert_eq!(before[i], after[i], "{}: {before:?} -> {after:?}", h.id);
        }
    }
    assert!(
        f.host(&taker).calls()
            > before[live
                .iter()
                .copied()
                .find(|i| f.hosts[*i].id == taker)
                .unwrap()]
    );
    // The killed host's nginx still serves its last servers.
    assert_eq!(f.hosts[dead].body("web").as_deref(), Some("one"));
    let bad = watcher.finish();
    assert!(bad.is_empty(), "an nginx did not serve a backend: {bad:?}");
    f.hosts[dead].daemon.stop();
}

#[test]
fn one_etcd_member_killed_bindings_are_still_created_and_applied() {
    let mut f = Fleet::start(["", "", ""]);
    // The member host B's session talks to ("connected to URL" in its store state) is killed,
    // and a save through B's API follows at once: B's store sends it to another member, so it
    // is accepted the first time (before, it was refused with 503 until B had moved, ~0.1 s).
    let member = poll_for("host B connected to a member", WAIT, || {
        let (_, v) = f.hosts[1].daemon.api("GET", "/api/v1/store", None);
        let loc = v["location"].as_str().unwrap_or("").to_string();
        f.cluster
            .endpoints()
            .iter()
            .position(|e| loc.contains(&format!("connected to {e}")))
            .ok_or(format!("{v}"))
    });
    f.cluster.kill(member);
    let killed = Instant::now();
    let body = json!({"name": "api", "plugin": "count", "provider": "c", "service": "web",
        "interval_secs": 10});
    let (st, v) = f.hosts[1]
        .daemon
        .api("POST", "/api/v1/bindings", Some(&body.to_string()));
    assert!(
        st < 300,
        "save right after B's member {member} was killed: {st} {v}"
    );
    eprintln!(
        "member {member} (host B's) killed; B's save answered {st} after {:?}",
        killed.elapsed()
    );
    f.wait_served(&ALL, "api", "one");
    applied_all(&f, 2, "api");
    assert_eq!(f.calls().iter().sum::<usize>(), 1, "{:?}", f.calls());
    // And a change saved through host C's CLI (a replace) reaches every host.
    f.registry("two");
    let out = f.hosts[2].daemon.binding_add(
        "api",
        "count",
        "c",
        "web2",
        &[],
        &["--interval", "10", "--replace"],
    );
    assert_ok(&out, "binding add --replace on C");
    f.wait_served(&ALL, "api", "two");
    for h in &f.hosts {
        let (_, v) = h.detail("api");
        assert_eq!(v["binding"]["service"], "web2", "{}: {v}", h.id);
    }
    let (_, store) = f.hosts[0].daemon.api("GET", "/api/v1/store", None);
    assert_eq!(store["connected"], true, "{store}");
}

#[test]
fn every_etcd_member_killed_hosts_keep_serving_say_so_and_catch_up_after() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(0, "web");
    f.wait_served(&ALL, "web", "one");
    applied_all(&f, 0, "web");
    let watcher = Watcher::start(f.hosts.iter().map(|h| h.nginx.port()).collect(), "web");

    f.cluster.kill_all();
    for h in &f.hosts {
        poll_for(
            &format!("{} says the store is unreachable", h.id),
            WAIT,
            || {
                let (st, v) = h.daemon.api("GET", "/api/v1/store", None);
                if st == 200 && v["connected"] == false && v["unreachable_since_ms"].is_i64() {
                    Ok(())
                } else {
                    Err(format!("{st} {v}"))
                }
            },
        );
        let (st, health) = http(h.daemon.port, "GET", "/api/v1/health", None, None);
        assert_eq!(st, 200, "{health}");
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!(health["status"], "degraded", "{}: {health}", h.id);
        let (st, metrics) = http(
            h.daemon.port,
            "GET",
            "/metrics",
            Some(&h.daemon.token()),
            None,
        );
        assert_eq!(st, 200);
        assert!(
            metrics.lines().any(|l| l == "tributary_store_connected 0"),
            "{}: {metrics}",
            h.id
        );
    }
    // A registry change while etcd is down: nothing is resolved or applied, every host keeps
    // its servers through more than one interval (10 s).
    f.registry("two");
    let calls = f.calls();
    std::thread::sleep(Duration::from_secs(12));
    for h in &f.hosts {
        assert_eq!(h.body("web").as_deref(), Some("one"), "{}", h.id);
    }
    assert_eq!(f.calls(), calls, "no registry call while the store is down");

    // etcd back: every host reconnects and the change is applied on all three.
    f.cluster.restart_all();
    for h in &f.hosts {
        poll_for(&format!("{} reconnects", h.id), WAIT, || {
            let (st, v) = h.daemon.api("GET", "/api/v1/store", None);
            if st == 200 && v["connected"] == true {
                Ok(())
            } else {
                Err(format!("{st} {v}"))
            }
        });
        let (_, metrics) = http(
            h.daemon.port,
            "GET",
            "/metrics",
            Some(&h.daemon.token()),
            None,
        );
        assert!(
            metrics.lines().any(|l| l == "tributary_store_connected 1"),
            "{}: {metrics}",
            h.id
        );
    }
    f.wait_served(&ALL, "web", "two");
    applied_all(&f, 2, "web");
    // And a binding created after the outage reaches every host.
    f.add(2, "late");
    f.wait_served(&ALL, "late", "two");
    let bad = watcher.finish();
    assert!(bad.is_empty(), "an nginx did not serve a backend: {bad:?}");
}

#[test]
fn a_host_whose_nginx_refuses_the_change_shows_failed_with_nginx_message_everywhere() {
    // Host C's nginx already has an upstream `bad`: the file `bad.conf` makes its `nginx -t`
    // fail (a duplicate upstream); hosts A and B take it.
    let f = Fleet::start(["", "", "upstream bad { server 127.0.0.1:9; }"]);
    f.add(0, "bad");
    f.wait_served(&[0, 1], "bad", "one");
    for viewer in ALL {
        let hosts = f.wait_fleet(
            viewer,
            "bad",
            &[
                ("host-a", "applied"),
                ("host-b", "applied"),
                ("host-c", "failed"),
            ],
        );
        let c = hosts.iter().find(|h| h["host"] == "host-c").unwrap();
        let msg = c["message"].as_str().unwrap_or("");
        assert!(msg.contains("duplicate upstream"), "{viewer}: {c}");
        for h in hosts.iter().filter(|h| h["host"] != "host-c") {
            assert!(h["message"].is_null(), "{h}");
        }
    }
    // Host C's nginx is unchanged: its own upstream (nothing listens on port 9, so the request
    // below is refused and logged), no file.
    f.hosts[2]
        .nginx
        .expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    assert!(!f.hosts[2].nginx.upstreams_dir().join("bad.conf").exists());
    assert_ne!(f.hosts[2].body("bad").as_deref(), Some("one"));
}

#[test]
fn a_binding_removed_while_a_host_is_down_is_gone_from_it_when_it_starts() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(0, "web");
    f.add(0, "keep");
    f.wait_served(&ALL, "web", "one");
    f.wait_served(&ALL, "keep", "one");
    let b_dir = f.hosts[1].nginx.upstreams_dir();
    // A person's own file in B's folder (not written by Tributary): never touched.
    let own = "upstream mine { server 127.0.0.1:9; }\n";
    std::fs::write(b_dir.join("mine.conf"), own).unwrap();

    // B stops (SIGTERM); the binding is removed through A's CLI meanwhile.
    f.hosts[1].daemon.stop();
    let out = f.hosts[0].daemon.cli(&["binding", "rm", "web"]);
    assert_ok(&out, "binding rm web on A");
    for i in [0, 2] {
        let h = &f.hosts[i];
        poll_for(
            &format!("{}'s nginx stops serving web", h.id),
            WAIT,
            || match h.body("web") {
                None => Ok(()),
                Some(b) => Err(b),
            },
        );
    }
    // B's nginx still has the file while B is down.
    assert!(b_dir.join("web.conf").exists());
    assert_eq!(f.hosts[1].body("web").as_deref(), Some("one"));

    // B starts again: the file of the removed binding goes (tested, reloaded), nginx stops
    // serving it; the binding still stored and the person's own file stay.
    f.hosts[1].daemon.spawn();
    let b = &f.hosts[1];
    poll_for("B removes web.conf", WAIT, || {
        if b_dir.join("web.conf").exists() {
            Err(b.daemon.log_text())
        } else {
            Ok(())
        }
    });
    poll_for("B's nginx stops serving web", WAIT, || {
        match b.body("web") {
            None => Ok(()),
            Some(body) => Err(body),
        }
    });
    poll_for("B logs the removal", WAIT, || {
        let log = b.daemon.log_text();
        match log
            .lines()
            .find(|l| l.contains("binding no longer in the store"))
        {
            Some(l) if l.contains("file removed") => Ok(()),
            _ => Err(log),
        }
    });
    assert_eq!(
        std::fs::read_to_string(b_dir.join("mine.conf")).unwrap(),
        own
    );
    assert!(b_dir.join("keep.conf").exists());
    assert_eq!(b.body("keep").as_deref(), Some("one"));
    let (st, v) = b.daemon.api("GET", "/api/v1/bindings/web", None);
    assert_eq!(st, 404, "{v}");
}

/// The etcd member a host's session is connected to (its store state says "connected to URL").
fn member_of(f: &Fleet, i: usize) -> usize {
    poll_for(
        &format!("{} connected to a member", f.hosts[i].id),
        WAIT,
        || {
            let (_, v) = f.hosts[i].daemon.api("GET", "/api/v1/store", None);
            let loc = v["location"].as_str().unwrap_or("").to_string();
            f.cluster
                .endpoints()
                .iter()
                .position(|e| loc.contains(&format!("connected to {e}")))
                .ok_or(format!("{v}"))
        },
    )
}

#[test]
fn a_move_to_another_etcd_member_resolves_no_binding_again() {
    // No jitter: a binding is due again exactly one interval after it was resolved.
    let mut f = Fleet::start_with(["", "", ""], &["--refresh-jitter-pct", "0"]);
    // Six bindings of a long interval (60 s): after their first resolution none is due again
    // during this test.
    let names: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
    for n in &names {
        let body = json!({"name": n, "plugin": "count", "provider": "c", "service": "web",
            "interval_secs": 60});
        let (st, v) = f.hosts[0]
            .daemon
            .api("POST", "/api/v1/bindings", Some(&body.to_string()));
        assert!(st < 300, "{n}: {st} {v}");
    }
    for n in &names {
        f.wait_served(&ALL, n, "one");
        applied_all(&f, 0, n);
    }
    // Each binding resolved once, by its resolver; nothing more while idle (a few TTLs).
    poll_for("one registry call per binding", WAIT, || {
        let c = f.calls();
        (c.iter().sum::<usize>() == names.len())
            .then_some(())
            .ok_or(format!("{c:?}"))
    });
    std::thread::sleep(Duration::from_secs(3 * TTL_SECS));
    let before = f.calls();
    assert_eq!(before.iter().sum::<usize>(), names.len(), "{before:?}");

    // The member of the host resolving the most bindings dies: that host's session (and any
    // other host's on the same member) moves to another member and syncs its mirror again.
    let busiest = (0..3).max_by_key(|i| before[*i]).unwrap();
    let member = member_of(&f, busiest);
    let moved: Vec<usize> = ALL
        .iter()
        .copied()
        .filter(|i| member_of(&f, *i) == member)
        .collect();
    f.cluster.kill(member);
    let killed = Instant::now();
    for &i in &moved {
        poll_for(
            &format!("{} moves to another member", f.hosts[i].id),
            WAIT,
            || {
                let (_, v) = f.hosts[i].daemon.api("GET", "/api/v1/store", None);
                let loc = v["location"].as_str().unwrap_or("");
                let eps = f.cluster.endpoints();
                let on = eps
                    .iter()
                    .position(|e| loc.contains(&format!("connected to {e}")));
                match on {
                    Some(m) if m != member && v["connected"] == true => Ok(()),
                    _ => Err(format!("{v}")),
                }
            },
        );
    }
    eprintln!(
        "member {member} killed; {:?} moved within {:?}; calls before {before:?}",
        moved.iter().map(|i| &f.hosts[*i].id).collect::<Vec<_>>(),
        killed.elapsed()
    );
    // Every binding keeps its deadline: no registry call in the seconds after the move.
    std::thread::sleep(Duration::from_secs(5));
    let after = f.calls();
    assert_eq!(
        before,
        after,
        "a move to another member resolved bindings again; {}'s log: {}",
        f.hosts[busiest].id,
        f.hosts[busiest].daemon.log_text()
    );
    // The fleet still works: a change, refreshed on each binding's resolver, reaches every
    // host.
    f.registry("two");
    for n in &names {
        let r = f.hosts[1].resolver(n).expect("a resolver");
        let (st, v) =
            f.host(&r)
                .daemon
                .api("POST", &format!("/api/v1/bindings/{n}/refresh"), Some("{}"));
        assert!(st < 300, "{n}: {st} {v}");
    }
    for n in &names {
        f.wait_served(&ALL, n, "two");
    }
}
