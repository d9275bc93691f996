//! What a host's watch receives ("Scale": watch traffic that grows with the fleet, not
//! its square), against a real 3-member etcd cluster: a host watches only what it needs (bindings,
//! target sets, resolver claims, `unable` markers, heartbeats, the integrity key). Another host's
//! outcome and the markers of another host's writes deliver no event to its watch; the outcomes
//! are read on demand (`refresh_fleet`) and then show in its fleet view.

use crate::common;

use std::time::Duration;

use common::{binding, host, raw_client, target_set, until, Host};
use etcd_client::GetOptions;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingStore, HostOutcome, HostState};

const PREFIX: &str = "/watch/";
const KEY: [u8; 32] = [7u8; 32];
const BINDINGS: usize = 5;

fn outcome(generation: i64) -> HostOutcome {
    HostOutcome {
        host: String::new(),
        state: HostState::Applied,
        at_ms: 1,
        generation,
        servers: 1,
        message: None,
    }
}

/// The number of keys under `PREFIX/sub` in etcd now.
async fn count(client: &mut etcd_client::Client, sub: &str) -> usize {
    client
        .get(
            format!("{PREFIX}{sub}"),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap()
        .count() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hosts_watch_gets_no_event_for_other_hosts_outcomes_or_write_markers() {
    let cluster = EtcdCluster::start(3);
    let a = host(&cluster, PREFIX, "host-a", &[&KEY]).await;
    let b = host(&cluster, PREFIX, "host-b", &[&KEY]).await;
    let c = host(&cluster, PREFIX, "host-c", &[&KEY]).await;
    let hosts: [&Host; 3] = [&a, &b, &c];
    let names: Vec<String> = (0..BINDINGS).map(|i| format!("b{i}")).collect();
    for n in &names {
        a.store.insert_binding(&binding(n, "web")).await.unwrap();
    }
    until(
        Duration::from_secs(10),
        "every binding on every host",
        || {
            hosts
                .iter()
                .all(|h| h.store.list_bindings().unwrap().len() == BINDINGS)
        },
    )
    .await;
    // Quiet: heartbeats are put once per session, nothing else moves.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<u64> = hosts.iter().map(|h| h.store.watch_events()).collect();

    // host-a and host-c publish their outcome of every binding.
    for n in &names {
        a.store.publish_host_outcome(n, &outcome(1)).await.unwrap();
        c.store.publish_host_outcome(n, &outcome(1)).await.unwrap();
    }
    let mut raw = raw_client(&cluster).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count(&mut raw, "outcomes-by-host/").await < 2 * BINDINGS {
        assert!(std::time::Instant::now() < deadline, "outcomes not in etcd");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Time for a watch event to arrive, had one been sent.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let after: Vec<u64> = hosts.iter().map(|h| h.store.watch_events()).collect();
    let delta: Vec<u64> = after.iter().zip(&before).map(|(x, y)| x - y).collect();
    println!("watch events per host for 10 outcomes written by host-a and host-c: {delta:?}");
    assert_eq!(
        delta,
        vec![0, 0, 0],
        "10 outcomes of host-a and host-c (in etcd: {} outcome keys) reached the hosts' watches",
        count(&mut raw, "outcomes-by-host/").await
    );

    // Read on demand, the fleet view of host-b holds them.
    b.store.refresh_fleet(Some("b0")).await;
    let view: Vec<(String, HostState, i64)> = b
        .store
        .fleet_view("b0")
        .hosts
        .into_iter()
        .map(|h| (h.outcome.host, h.outcome.state, h.outcome.generation))
        .collect();
    assert_eq!(
        view,
        vec![
            ("host-a".to_string(), HostState::Applied, 1),
            ("host-c".to_string(), HostState::Applied, 1)
        ]
    );
    b.store.refresh_fleet(None).await;
    let members: Vec<(String, bool)> = b
        .store
        .fleet_hosts()
        .into_iter()
        .map(|m| (m.host, m.alive))
        .collect();
    assert_eq!(
        members,
        vec![
            ("host-a".to_string(), true),
            ("host-b".to_string(), true),
            ("host-c".to_string(), true)
        ]
    );

    // A target set published by the resolver of b0 (one write: the set and the write's marker):
    // exactly one event (the set) on each other host.
    let mut resolver = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while resolver.is_none() {
        for (i, h) in hosts.iter().enumerate() {
            if h.store.claim_resolver("b0").await.unwrap() {
                resolver = Some(i);
                break;
            }
        }
        assert!(std::time::Instant::now() < deadline, "nobody claimed b0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = resolver.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<u64> = hosts.iter().map(|h| h.store.watch_events()).collect();
    let v = hosts[r]
        .store
        .get_binding("b0")
        .unwrap()
        .unwrap()
        .updated_at_ms;
    hosts[r]
        .store
        .publish_targets("b0", &target_set(v, "10.0.0.9"))
        .await
        .unwrap();
    until(Duration::from_secs(10), "the set on every host", || {
        hosts
            .iter()
            .all(|h| h.store.published_targets("b0").is_some())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The write's marker is in etcd (the write carried it) but was not delivered.
    assert!(count(&mut raw, "writes/host-").await >= 1);
    let delta: Vec<u64> = hosts
        .iter()
        .zip(&before)
        .map(|(h, b)| h.store.watch_events() - b)
        .collect();
    println!("watch events per host for one published target set: {delta:?}");
    assert!(
        delta.iter().all(|d| *d == 1),
        "one target set (one key) delivered {delta:?} events"
    );
}
