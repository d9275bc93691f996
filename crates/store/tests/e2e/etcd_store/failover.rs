//! Resolvers, writes and the mirror when something goes away: a dead holder replaced within the
//! lease TTL, writes right after the session's member is killed, losing etcd altogether.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolvers_spread_over_hosts_and_a_dead_holder_is_replaced_within_the_lease_ttl() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let hosts = [
        host(&cluster, "h1").await,
        host(&cluster, "h2").await,
        host(&cluster, "h3").await,
    ];
    let names: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
    let list: Vec<BindingRecord> = names.iter().map(|n| binding(n, "s")).collect();
    hosts[0].store.upsert_bindings(&list).await.unwrap();
    for h in &hosts {
        until(Duration::from_secs(5), "bindings everywhere", || {
            h.store.list_bindings().unwrap().len() == 30
        })
        .await;
    }
    // Heartbeats seen by every host (they were all up before the claims).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut per_host = [0usize; 3];
    for n in &names {
        let mut holders = 0;
        for (i, h) in hosts.iter().enumerate() {
            if h.store.claim_resolver(n).await.unwrap() {
                holders += 1;
                per_host[i] += 1;
            }
        }
        assert_eq!(holders, 1, "{n}: exactly one resolver");
    }
    assert!(
        per_host.iter().all(|&c| c >= 3),
        "spread over the hosts: {per_host:?}"
    );

    // Kill h1's store (its keep-alives stop): its bindings move to the others within the TTL.
    let [h1, h2, h3] = hosts;
    let mut owned = Vec::new();
    for n in &names {
        if h1.store.fleet_view(n).resolver.as_deref() == Some("h1") {
            owned.push(n.clone());
        }
    }
    assert!(!owned.is_empty());
    let mut ev2 = h2.store.subscribe();
    let t0 = Instant::now();
    drop(h1);
    let first = owned[0].clone();
    wait_event(&mut ev2, TTL * 3, |e| {
        *e == StoreEvent::Resolver(first.clone())
    })
    .await;
    for n in &owned {
        let mut taken = false;
        let deadline = Instant::now() + TTL * 3;
        while !taken {
            taken = h2.store.claim_resolver(n).await.unwrap()
                || h3.store.claim_resolver(n).await.unwrap();
            if !taken {
                assert!(Instant::now() < deadline, "{n} not taken over");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let took = t0.elapsed();
    assert!(took < TTL * 3, "take-over took {took:?}");
    eprintln!(
        "take-over of {} bindings after the holder died: {took:?} (lease TTL {TTL:?})",
        owned.len()
    );
}

/// The gap of docs/fleet.md closed: the member under this host's session is SIGKILLed and every
/// kind of write made right after it (no pause, so the first one still goes to the dead member or
/// finds the session moving) succeeds on another member, and etcd holds each write once: a key
/// created once has version 1, a key updated n times has version n+1. Three rounds (the killed
/// member is restarted in between), so the session moves three times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_right_after_the_sessions_member_is_killed_succeed_on_another_member_once() {
    let mut cluster = blocking(|| EtcdCluster::start(3));
    // The daemon's default operation timeout: a write to a member that waits for a new leader
    // (the killed member led) gets half of it before the next member is tried.
    let a = open_with(
        &cluster,
        "host-a",
        Arc::new(tempfile::tempdir().unwrap()),
        tributary_store::etcd::DEFAULT_OP_TIMEOUT,
    );
    assert!(a.store.wait_connected(Duration::from_secs(15)).await);
    let mut fixtures = vec![binding("api", "web")];
    fixtures.extend((0..3).map(|r| binding(&format!("old{r}"), "x")));
    a.store.upsert_bindings(&fixtures).await.unwrap();
    // Alone in the fleet: the preferred resolver of everything.
    assert!(a.store.claim_resolver("api").await.unwrap());

    for round in 0..3 {
        let member = session_member(&a, &cluster);
        blocking(|| cluster.kill(member));
        let killed = Instant::now();
        let mut took = Vec::new();
        let mut step = |what: &str| took.push(format!("{what} {:?}", killed.elapsed()));

        let new = format!("new{round}");
        let r = a.store.insert_binding(&binding(&new, "n")).await;
        assert!(r.is_ok(), "round {round}: insert: {r:?}");
        step("insert");
        let r = a.store.claim_resolver(&new).await;
        assert!(matches!(r, Ok(true)), "round {round}: claim: {r:?}");
        step("claim");
        let r = a
            .store
            .upsert_bindings(&[
                binding("api", &format!("web{round}")),
                binding(&format!("created{round}"), "c"),
            ])
            .await;
        assert!(
            matches!(&r, Ok(v) if *v == [Upsert::Updated, Upsert::Created]),
            "round {round}: upsert: {r:?}"
        );
        step("upsert");
        let r = a
            .store
            .publish_targets("api", &target_set(&a, "api", &format!("10.0.0.{round}")))
            .await;
        assert!(r.is_ok(), "round {round}: publish targets: {r:?}");
        step("publish");
        let r = a.store.remove_binding(&format!("old{round}")).await;
        assert!(matches!(r, Ok(true)), "round {round}: remove: {r:?}");
        step("remove");
        eprintln!("round {round}: member {member} killed; then {took:?}");

        blocking(|| {
            cluster.restart(member);
            cluster.wait_ready(member, Duration::from_secs(30));
        });
        until(Duration::from_secs(15), "the session back", || {
            a.store.status().connected
        })
        .await;
    }

    // etcd holds every write once.
    let dump = blocking(|| cluster.dump_versions(PREFIX));
    let version = |k: &str| {
        dump.iter()
            .find(|kv| kv.key == format!("{PREFIX}{k}"))
            .map(|kv| (kv.version, kv.value.clone()))
    };
    for round in 0..3 {
        for k in [
            format!("bindings/new{round}"),
            format!("bindings/created{round}"),
            format!("resolvers/new{round}"),
        ] {
            assert_eq!(version(&k).map(|v| v.0), Some(1), "{k}: {dump:?}");
        }
        assert_eq!(version(&format!("bindings/old{round}")), None, "{dump:?}");
    }
    let (v, api) = version("bindings/api").unwrap();
    assert_eq!(v, 4, "api: created, then updated once per round: {api}");
    assert!(api.contains("\"web2\""), "{api}");
    let (v, targets) = version("targets/api").unwrap();
    assert_eq!(v, 3, "targets of api: published once per round: {targets}");
    assert!(targets.contains("10.0.0.2"), "{targets}");
    assert_eq!(version("resolvers/api").map(|v| v.0), Some(1));
    // And the mirror says the same.
    let names = mirror_names(&a);
    assert_eq!(
        names,
        ["api", "created0", "created1", "created2", "new0", "new1", "new2"]
    );
    assert_eq!(
        a.store.get_binding("api").unwrap().unwrap().binding.service,
        "web2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_etcd_keeps_the_mirror_fails_writes_clearly_and_catches_up() {
    let mut cluster = blocking(|| EtcdCluster::start(3));
    let dir_a = Arc::new(tempfile::tempdir().unwrap());
    let a = open_at(&cluster, "host-a", dir_a.clone());
    assert!(a.store.wait_connected(Duration::from_secs(15)).await);
    let b = host(&cluster, "host-b").await;
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();

    // The member A talks to dies: A moves to another one, the fleet goes on.
    let member = session_member(&a, &cluster);
    blocking(|| cluster.kill(member));
    let t0 = Instant::now();
    loop {
        match a.store.insert_binding(&binding("one-down", "x")).await {
            Ok(()) => break,
            Err(StoreError::Unavailable { .. }) if t0.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("write with one member down: {e}"),
        }
    }
    let t1 = Instant::now();
    until(Duration::from_secs(10), "one-down on B", || {
        if t1.elapsed() > Duration::from_secs(9) {
            eprintln!("B: {:?}", b.store.status());
        }
        b.store.get_binding("one-down").unwrap().is_some()
    })
    .await;
    eprintln!(
        "one member down: write took {:?}, seen on B after {:?}",
        t1 - t0,
        t1.elapsed()
    );
    blocking(|| cluster.restart(member));

    // All members die: reads answer from the mirror, writes fail at once and name the store.
    blocking(|| cluster.kill_all());
    until(Duration::from_secs(10), "A to say unreachable", || {
        !a.store.status().connected
    })
    .await;
    let st = a.store.status();
    assert!(
        st.unreachable_since_ms.is_some() && st.last_error.is_some(),
        "{st:?}"
    );
    assert_eq!(a.store.list_bindings().unwrap().len(), 2);
    let t = Instant::now();
    let err = a
        .store
        .insert_binding(&binding("new", "x"))
        .await
        .unwrap_err();
    eprintln!("every member down: a write failed after {:?}", t.elapsed());
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "a write took {:?}",
        t.elapsed()
    );
    assert!(
        matches!(&err, StoreError::Unavailable { store, .. } if store.contains("etcd")),
        "{err}"
    );
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert!(a.store.claim_resolver("api").await.is_err());
    // A host outcome is kept and shown, and written when etcd is back.
    a.store
        .publish_host_outcome(
            "api",
            &HostOutcome {
                host: String::new(),
                state: HostState::Stale,
                at_ms: 9,
                generation: 0,
                servers: 2,
                message: Some("the store is unreachable".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        a.store.fleet_view("api").hosts[0].outcome.state,
        HostState::Stale
    );

    // A restart of the daemon while etcd is down: the bindings come from the local mirror.
    drop(a);
    let a = open_at(&cluster, "host-a", dir_a);
    let names = mirror_names(&a);
    assert_eq!(names, vec!["api", "one-down"]);
    assert!(!a.store.status().connected);

    // etcd returns: both catch up; a change made on B reaches A; A's pending outcome reaches B.
    blocking(|| cluster.restart_all());
    assert!(
        a.store.wait_connected(Duration::from_secs(20)).await,
        "{:?}",
        a.store.status()
    );
    assert!(
        b.store.wait_connected(Duration::from_secs(20)).await,
        "{:?}",
        b.store.status()
    );
    let t0 = Instant::now();
    loop {
        match b.store.insert_binding(&binding("after", "y")).await {
            Ok(()) => break,
            Err(StoreError::Unavailable { .. }) if t0.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    until(Duration::from_secs(10), "after on A", || {
        a.store.get_binding("after").unwrap().is_some()
    })
    .await;
    let _ = a
        .store
        .publish_host_outcome(
            "api",
            &HostOutcome {
                host: String::new(),
                state: HostState::Applied,
                at_ms: 10,
                generation: 0,
                servers: 2,
                message: None,
            },
        )
        .await;
    until(Duration::from_secs(10), "A's outcome on B", || {
        fleet_view_now(&b.store, "api")
            .hosts
            .iter()
            .any(|h| h.outcome.host == "host-a" && h.outcome.state == HostState::Applied && h.alive)
    })
    .await;
}
