//! Bindings and sets reaching the other hosts: a binding written on one host (its secrets never in
//! etcd), a closing host handing its bindings over, a prefix larger than one gRPC message.

use super::*;

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
