//! The etcd store against a real 3-member etcd cluster (Debian's etcd-server on loopback ports):
//! several store instances play the hosts of a fleet.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{blocking, until};

use tokio::sync::broadcast;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{
    BindingRecord, BindingStore, EtcdOptions, EtcdStore, HostOutcome, HostState, SecretKeys,
    StoreError, StoreEvent, TargetSet, Upsert,
};

const SECRET: &str = "s3cr3t-TOKEN-4711";
const PREFIX: &str = "/fleet-test/";
const TTL: Duration = Duration::from_secs(2);

fn binding(name: &str, service: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "consul".into(),
        provider: "consul".into(),
        config: BTreeMap::from([
            ("acl_token".to_string(), serde_json::json!(SECRET)),
            (
                "address".to_string(),
                serde_json::json!("http://127.0.0.1:8500"),
            ),
        ]),
        service: service.into(),
        interval_secs: 30,
        directives: vec![],
        drain_secs: 0,
        probe: None,
    }
}

struct Host {
    store: Arc<EtcdStore>,
    _dir: Arc<tempfile::TempDir>,
}

fn open_at(cluster: &EtcdCluster, id: &str, dir: Arc<tempfile::TempDir>) -> Host {
    open_with(cluster, id, dir, Duration::from_secs(2))
}

fn open_with(
    cluster: &EtcdCluster,
    id: &str,
    dir: Arc<tempfile::TempDir>,
    op_timeout: Duration,
) -> Host {
    let mut opts = EtcdOptions::new(
        cluster.endpoints(),
        PREFIX,
        id,
        &dir.path().join(format!("{id}.db")),
    );
    opts.lease_ttl = TTL;
    opts.op_timeout = op_timeout;
    let keys = SecretKeys::from_bytes(&[&[42u8; 32]]).unwrap();
    Host {
        store: Arc::new(EtcdStore::open(opts, keys).unwrap()),
        _dir: dir,
    }
}

async fn host(cluster: &EtcdCluster, id: &str) -> Host {
    let h = open_at(cluster, id, Arc::new(tempfile::tempdir().unwrap()));
    assert!(
        h.store.wait_connected(Duration::from_secs(15)).await,
        "{id} did not connect: {:?}",
        h.store.status()
    );
    h
}

/// Waits for an event matching `want`, at most `limit`; returns how long it took.
async fn wait_event(
    rx: &mut broadcast::Receiver<StoreEvent>,
    limit: Duration,
    want: impl Fn(&StoreEvent) -> bool,
) -> Duration {
    let t0 = Instant::now();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(e)) if want(&e) => return t0.elapsed(),
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("event channel: {e}"),
            Err(_) => panic!("no matching event within {limit:?}"),
        }
    }
}

/// The cluster member `h`'s session talks to (`status()` names it: "connected to URL").
/// The names of the bindings in a host's mirror.
fn mirror_names(h: &Host) -> Vec<String> {
    let list = h.store.list_bindings().unwrap();
    list.into_iter().map(|b| b.binding.name).collect()
}

fn session_member(h: &Host, cluster: &EtcdCluster) -> usize {
    let loc = h.store.status().location;
    cluster
        .endpoints()
        .iter()
        .position(|e| loc.contains(&format!("connected to {e}")))
        .unwrap_or_else(|| panic!("no member named in {loc}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_written_on_one_host_reaches_the_others_and_secrets_never_reach_etcd() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let b = host(&cluster, "host-b").await;
    let mut a_events = a.store.subscribe();
    let mut b_events = b.store.subscribe();

    // Create on A: B hears of it and reads it (config decrypted) from its mirror.
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    assert_eq!(
        a.store.get_binding("api").unwrap().unwrap().binding,
        binding("api", "web")
    );
    wait_event(&mut b_events, Duration::from_secs(5), |e| {
        *e == StoreEvent::Binding("api".into())
    })
    .await;
    let on_b = b.store.get_binding("api").unwrap().unwrap();
    assert_eq!(on_b.binding, binding("api", "web"));
    // The same name again, on B: a duplicate (etcd decides, not the mirror).
    assert!(matches!(
        b.store.insert_binding(&binding("api", "x")).await,
        Err(StoreError::Duplicate(_))
    ));

    // Change on B (upsert): A hears of it; A's own write made no event on A.
    let ups = b
        .store
        .upsert_bindings(&[binding("api", "web2"), binding("db", "pg")])
        .await
        .unwrap();
    assert_eq!(ups, vec![Upsert::Updated, Upsert::Created]);
    wait_event(&mut a_events, Duration::from_secs(5), |e| {
        *e == StoreEvent::Binding("api".into())
    })
    .await;
    // The event may be the echo of A's own insert (its watch can deliver the write before the
    // write's answer names its revision; events are level-triggered, so that is harmless): the
    // mirror must show B's change soon after, not necessarily at this first event.
    until(Duration::from_secs(5), "B's change of api on A", || {
        a.store.get_binding("api").unwrap().unwrap().binding.service == "web2"
    })
    .await;
    until(Duration::from_secs(5), "db on A", || {
        a.store.get_binding("db").unwrap().is_some()
    })
    .await;
    // Created-at survives an update made on another host.
    assert_eq!(
        a.store.get_binding("api").unwrap().unwrap().created_at_ms,
        on_b.created_at_ms
    );

    // Fleet state: targets and outcomes, so the dump below holds every kind of key.
    assert!(
        a.store.claim_resolver("api").await.unwrap() ^ b.store.claim_resolver("api").await.unwrap()
    );
    let resolver = if a.store.claim_resolver("api").await.unwrap() {
        &a
    } else {
        &b
    };
    let set = target_set(resolver, "api", "10.0.0.7");
    resolver.store.publish_targets("api", &set).await.unwrap();
    for h in [&a, &b] {
        h.store
            .publish_host_outcome(
                "api",
                &HostOutcome {
                    host: String::new(),
                    state: HostState::Applied,
                    at_ms: 5,
                    generation: 1,
                    servers: 1,
                    message: None,
                },
            )
            .await
            .unwrap();
    }
    until(
        Duration::from_secs(5),
        "both outcomes in A's fleet view",
        || fleet_view_now(&a.store, "api").hosts.len() == 2,
    )
    .await;
    let other = if std::ptr::eq(resolver, &a) { &b } else { &a };
    until(Duration::from_secs(5), "targets on the other host", || {
        other
            .store
            .published_targets("api")
            .is_some_and(|t| t.targets == set.targets)
    })
    .await;

    // A raw dump of the prefix: every kind of key, no secret value nor secret key name.
    let dump = blocking(|| cluster.dump(PREFIX));
    let keys: Vec<&str> = dump.iter().map(|(k, _)| k.as_str()).collect();
    for kind in [
        "bindings/api",
        "bindings/db",
        "hosts/host-a",
        "resolvers/api",
        "targets/api",
        "outcomes-by-host/host-a/api",
    ] {
        assert!(
            keys.iter().any(|k| k.ends_with(kind)),
            "{kind} missing from {keys:?}"
        );
    }
    for (k, v) in &dump {
        assert!(
            !v.contains(SECRET) && !v.contains("acl_token"),
            "{k} holds a secret: {v}"
        );
    }

    // Remove on A: gone on B, with its fleet keys.
    assert!(a.store.remove_binding("api").await.unwrap());
    until(Duration::from_secs(5), "api gone on B", || {
        b.store.get_binding("api").unwrap().is_none()
    })
    .await;
    // Each host deletes its own outcome of it (before its next outcome flush, docs/fleet.md).
    until(Duration::from_secs(5), "api's keys gone from etcd", || {
        blocking(|| cluster.dump(PREFIX))
            .iter()
            .all(|(k, _)| !k.contains("/api"))
    })
    .await;
    assert!(!b.store.remove_binding("api").await.unwrap());
}

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

/// A set resolved from the version of `name` that `h` holds (a set of another version is refused).
fn target_set(h: &Host, name: &str, address: &str) -> TargetSet {
    TargetSet {
        resolved_by: String::new(),
        at_ms: 1,
        binding_updated_at_ms: h.store.get_binding(name).unwrap().unwrap().updated_at_ms,
        targets: vec![serde_json::json!({"address": address, "port": 80, "weight": 1})],
        dropped: vec![],
        ttl_seconds: None,
        generation: 0,
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_closes_hands_its_bindings_over_at_once() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let h1 = host(&cluster, "h1").await;
    let h2 = host(&cluster, "h2").await;
    h1.store.insert_binding(&binding("api", "s")).await.unwrap();
    until(Duration::from_secs(5), "api on h2", || {
        h2.store.get_binding("api").unwrap().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let holder_is_h1 = h1.store.claim_resolver("api").await.unwrap();
    let (closing, other) = if holder_is_h1 { (&h1, &h2) } else { (&h2, &h1) };
    assert!(closing.store.claim_resolver("api").await.unwrap());
    assert!(!other.store.claim_resolver("api").await.unwrap());
    // Both see the claim before the close (so the event below is the release, not the claim).
    let holder = closing.store.host_id().to_string();
    until(
        Duration::from_secs(5),
        "the claim seen by the other host",
        || other.store.fleet_view("api").resolver.as_deref() == Some(holder.as_str()),
    )
    .await;
    let mut ev = other.store.subscribe();
    let t0 = Instant::now();
    closing.store.close().await;
    wait_event(&mut ev, Duration::from_secs(5), |e| {
        *e == StoreEvent::Resolver("api".into())
    })
    .await;
    // Under a loaded machine the release may still be on its way: ask until it is taken.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !other.store.claim_resolver("api").await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "not taken over: {:?} {:?}",
            other.store.fleet_view("api"),
            other.store.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    // Well under the 2 s lease TTL: the lease was revoked, not left to expire.
    assert!(
        took < Duration::from_millis(1500),
        "hand-over took {took:?}"
    );
    // The closed store refuses writes and still reads its mirror.
    assert!(matches!(
        closing.store.insert_binding(&binding("x", "s")).await,
        Err(StoreError::Unavailable { .. })
    ));
    assert!(closing.store.get_binding("api").unwrap().is_some());
}

/// A fleet whose values outgrow one gRPC message still syncs: 1,200 bindings with 60 targets each
/// (every target with display tags, as registries give them: ≈ 8 KiB per set, so 1,000 keys of
/// the prefix are ≈ 8 MiB, twice the gRPC client's 4 MiB default) are read by a host that starts
/// afterwards, every set complete. Before pages were sized by bytes, that host's first page was
/// refused by its client ("decoded message length too large") and it never connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_syncs_a_prefix_larger_than_one_grpc_message() {
    const BINDINGS: usize = 1_200;
    const TARGETS: usize = 60;
    let cluster = blocking(|| EtcdCluster::start(3));
    let writer = host(&cluster, "writer").await;
    let names: Vec<String> = (0..BINDINGS).map(|i| format!("svc-{i:04}")).collect();
    let list: Vec<BindingRecord> = names.iter().map(|n| binding(n, n)).collect();
    writer.store.upsert_bindings(&list).await.unwrap();
    until(
        Duration::from_secs(60),
        "bindings in the writer's mirror",
        || writer.store.list_bindings().unwrap().len() == BINDINGS,
    )
    .await;
    // Claimed and published 32 at a time (one after another it takes a minute on a busy machine).
    let mut bytes = 0usize;
    for chunk in names.chunks(32).enumerate() {
        let (c, chunk) = chunk;
        let mut tasks = tokio::task::JoinSet::new();
        for (i, n) in chunk.iter().enumerate() {
            let b = c * 32 + i;
            let mut set = target_set(&writer, n, "10.0.0.1");
            set.targets = (0..TARGETS)
                .map(|t| {
                    serde_json::json!({
                        "address": format!("10.{}.{}.{}", b / 250, b % 250, t + 1),
                        "port": 8080,
                        "weight": 1,
                        "tags": [
                            format!("node=ip-10-{}-{}-{}.eu-west-1.compute.internal", b / 250, b % 250, t + 1),
                            format!("zone=eu-west-1{}", ["a", "b", "c"][t % 3]),
                            "version=2026.12.1",
                        ],
                    })
                })
                .collect();
            bytes += serde_json::to_vec(&set).unwrap().len();
            let (store, n) = (writer.store.clone(), n.clone());
            tasks.spawn(async move {
                assert!(store.claim_resolver(&n).await.unwrap(), "{n}: claimed");
                store.publish_targets(&n, &set).await.unwrap();
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    }
    eprintln!(
        "published {BINDINGS} sets of {TARGETS} targets: {} KiB in all, {} bytes per set",
        bytes / 1024,
        bytes / BINDINGS
    );
    assert!(
        bytes / BINDINGS * 1000 > 4 << 20,
        "the sets of one 1,000-key page must exceed the client's 4 MiB default"
    );

    let t0 = Instant::now();
    let late = open_at(&cluster, "late", Arc::new(tempfile::tempdir().unwrap()));
    assert!(
        late.store.wait_connected(Duration::from_secs(60)).await,
        "the late host did not sync: {:?}",
        late.store.status()
    );
    eprintln!("the late host synced in {:?}", t0.elapsed());
    assert_eq!(late.store.list_bindings().unwrap().len(), BINDINGS);
    for n in &names {
        let set = late
            .store
            .published_targets(n)
            .unwrap_or_else(|| panic!("{n}: no set on the late host"));
        assert_eq!(set.targets.len(), TARGETS, "{n}: the whole set");
    }
}

/// `store`'s fleet view of `name` with the outcomes read from etcd now (hosts do not watch them:
/// `refresh_fleet` first, as the API and the UI do). In a multi-threaded runtime.
fn fleet_view_now(store: &tributary_store::EtcdStore, name: &str) -> tributary_store::FleetView {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(store.refresh_fleet(Some(name)))
    });
    store.fleet_view(name)
}
