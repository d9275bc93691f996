//! What a host that is gone leaves in etcd ("Scale": garbage-collect outcomes of hosts
//! gone longer than a set time, `fleet forget-host`), against a real 3-member etcd cluster: a host
//! that stops keeps its outcomes until `forget_gone_hosts_after` has passed, then they are gone
//! from etcd and from every host's fleet view; `forget_host` of a host that is alive is refused and
//! deletes nothing; `forget_host` of a host that stopped deletes its outcomes at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::until;

use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{
    BindingRecord, BindingStore, EtcdOptions, EtcdStore, HostOutcome, HostState, SecretKeys,
};

const PREFIX: &str = "/gc/";

fn binding(name: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "consul".into(),
        provider: "consul".into(),
        config: BTreeMap::new(),
        service: "web".into(),
        interval_secs: 30,
        directives: vec![],
        probe: None,
        drain_secs: 0,
    }
}

async fn host(
    cluster: &EtcdCluster,
    id: &str,
    gc_after: Duration,
    dir: &tempfile::TempDir,
) -> Arc<EtcdStore> {
    let mut opts = EtcdOptions::new(
        cluster.endpoints(),
        PREFIX,
        id,
        &dir.path().join(format!("{id}.db")),
    );
    opts.lease_ttl = Duration::from_secs(2);
    opts.op_timeout = Duration::from_secs(2);
    opts.forget_gone_hosts_after = gc_after;
    let keys = SecretKeys::from_bytes(&[&[42u8; 32]]).unwrap();
    let store = Arc::new(EtcdStore::open(opts, keys).unwrap());
    assert!(store.wait_connected(Duration::from_secs(15)).await, "{id}");
    store
}

fn outcome() -> HostOutcome {
    HostOutcome {
        host: String::new(),
        state: HostState::Applied,
        at_ms: 1,
        generation: 1,
        servers: 1,
        message: None,
    }
}

/// `(host, alive)` of every host in `viewer`'s fleet view of `name`, the outcomes read from etcd
/// now (a host does not watch them: `refresh_fleet`, as the API and the UI do).
fn view(viewer: &EtcdStore, name: &str) -> Vec<(String, bool)> {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(viewer.refresh_fleet(Some(name)))
    });
    viewer
        .fleet_view(name)
        .hosts
        .into_iter()
        .map(|h| (h.outcome.host, h.alive))
        .collect()
}

fn outcome_keys(cluster: &EtcdCluster) -> Vec<String> {
    tokio::task::block_in_place(|| cluster.dump(&format!("{PREFIX}outcomes-by-host/")))
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_of_a_host_gone_longer_than_the_set_time_are_removed_from_etcd_and_every_view() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    const GC: Duration = Duration::from_secs(4);
    let a = host(&cluster, "host-a", GC, &dir).await;
    let b = host(&cluster, "host-b", GC, &dir).await;
    let c = host(&cluster, "host-c", GC, &dir).await;
    a.insert_binding(&binding("api")).await.unwrap();
    a.insert_binding(&binding("db")).await.unwrap();
    for s in [&a, &b, &c] {
        for name in ["api", "db"] {
            until(Duration::from_secs(10), "the binding everywhere", || {
                s.get_binding(name).unwrap().is_some()
            })
            .await;
            s.publish_host_outcome(name, &outcome()).await.unwrap();
        }
    }
    until(
        Duration::from_secs(10),
        "3 outcomes of each binding",
        || view(&a, "api").len() == 3 && view(&a, "db").len() == 3,
    )
    .await;

    // Alive: refused, nothing deleted.
    let e = c
        .forget_host("host-b", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("host \"host-b\" is alive"), "{e}");
    assert_eq!(outcome_keys(&cluster).len(), 6);

    // B stops: its outcomes stay, shown not alive, until GC has passed.
    b.close().await;
    let stopped = Instant::now();
    until(Duration::from_secs(10), "host-b shown gone", || {
        view(&a, "api").contains(&("host-b".to_string(), false))
    })
    .await;
    tokio::time::sleep(GC / 2).await;
    assert!(
        outcome_keys(&cluster)
            .iter()
            .any(|k| k.contains("/host-b/")),
        "removed before the set time"
    );
    until(GC * 4, "host-b's outcomes gone from etcd", || {
        !outcome_keys(&cluster)
            .iter()
            .any(|k| k.contains("/host-b/"))
    })
    .await;
    assert!(stopped.elapsed() >= GC, "{:?}", stopped.elapsed());
    for (id, s) in [("host-a", &a), ("host-c", &c)] {
        until(
            Duration::from_secs(10),
            &format!("{id}'s view without host-b"),
            || {
                ["api", "db"]
                    .iter()
                    .all(|n| view(s, n).iter().all(|(h, _)| h != "host-b"))
            },
        )
        .await;
    }
    // The others' outcomes stay.
    assert_eq!(outcome_keys(&cluster).len(), 4);

    // forget_host of a host that stopped: at once, long before the set time.
    let d = host(&cluster, "host-d", Duration::from_secs(3600), &dir).await;
    d.publish_host_outcome("api", &outcome()).await.unwrap();
    until(Duration::from_secs(10), "host-d's outcome", || {
        view(&a, "api").iter().any(|(h, _)| h == "host-d")
    })
    .await;
    d.close().await;
    let n = a.forget_host("host-d", false).await.unwrap();
    assert_eq!(n.keys, 1);
    assert!(!outcome_keys(&cluster)
        .iter()
        .any(|k| k.contains("/host-d/")));
    until(
        Duration::from_secs(10),
        "host-c's view without host-d",
        || view(&c, "api").iter().all(|(h, _)| h != "host-d"),
    )
    .await;
}

/// The count of a gone host survives a restart of the hosts that collect: the collecting daemon
/// may restart (a redeploy) or change (another host takes over) more often than the set time, and
/// each restarted count would then never reach it. C stops; both other hosts restart
/// `RESTART` after; C's outcomes still go about `GC` after it stopped, not `GC` after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_hosts_count_goes_on_across_a_restart_of_the_collecting_hosts() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    const GC: Duration = Duration::from_secs(12);
    const RESTART: Duration = Duration::from_secs(9);
    let a = host(&cluster, "host-a", GC, &dir).await;
    let b = host(&cluster, "host-b", GC, &dir).await;
    let c = host(&cluster, "host-c", GC, &dir).await;
    a.insert_binding(&binding("api")).await.unwrap();
    for s in [&a, &b, &c] {
        until(Duration::from_secs(10), "the binding everywhere", || {
            s.get_binding("api").unwrap().is_some()
        })
        .await;
        s.publish_host_outcome("api", &outcome()).await.unwrap();
    }
    until(Duration::from_secs(10), "3 outcomes", || {
        view(&a, "api").len() == 3
    })
    .await;

    c.close().await;
    let stopped = Instant::now();
    until(Duration::from_secs(10), "host-c shown gone", || {
        view(&a, "api").contains(&("host-c".to_string(), false))
    })
    .await;
    tokio::time::sleep(RESTART.saturating_sub(stopped.elapsed())).await;
    a.close().await;
    b.close().await;
    drop((a, b));
    let a = host(&cluster, "host-a", GC, &dir).await;
    let _b = host(&cluster, "host-b", GC, &dir).await;
    let restarted = stopped.elapsed();
    until(GC * 3, "host-c's outcome gone from etcd", || {
        !outcome_keys(&cluster)
            .iter()
            .any(|k| k.contains("/host-c/"))
    })
    .await;
    let gone_after = stopped.elapsed();
    eprintln!("host-c's outcome removed {gone_after:?} after it stopped (hosts restarted at {restarted:?})");
    assert!(
        gone_after >= GC,
        "removed before the set time: {gone_after:?}"
    );
    // A count started again by the restarted collector ends no sooner than RESTART + GC (21 s)
    // plus a collection period (GC / 4: 3 s); the count kept in etcd ends GC (12 s) plus at most
    // two periods (when C was first seen gone, and the tick after GC) after C stopped: 18 s.
    assert!(
        gone_after < RESTART + GC,
        "removed {gone_after:?} after host-c stopped: its count began again at the restart ({restarted:?})"
    );
    // The count's key goes with the outcomes; the others' outcomes stay.
    let left = tokio::task::block_in_place(|| cluster.dump(&format!("{PREFIX}outcomes-gone/")));
    assert!(
        left.iter().all(|(k, _)| !k.ends_with("/host-c")),
        "{left:?}"
    );
    assert_eq!(view(&a, "api").len(), 2);
}

/// A gone host's count in etcd (`P/outcomes-gone/HOST`) holds a value that does not decode
/// (written by hand, or by something else than a collector): the host is still collected within
/// the bound of one whose count is fine (the bad value is replaced once by a count starting then).
/// Before, it counted as "seen now" at every pass, so the count began again each time and the host
/// was never collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_host_whose_count_does_not_decode_is_still_collected() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    const GC: Duration = Duration::from_secs(4);
    let a = host(&cluster, "host-a", GC, &dir).await;
    let b = host(&cluster, "host-b", GC, &dir).await;
    a.insert_binding(&binding("api")).await.unwrap();
    for s in [&a, &b] {
        until(Duration::from_secs(10), "the binding everywhere", || {
            s.get_binding("api").unwrap().is_some()
        })
        .await;
        s.publish_host_outcome("api", &outcome()).await.unwrap();
    }
    until(Duration::from_secs(10), "2 outcomes", || {
        view(&a, "api").len() == 2
    })
    .await;

    b.close().await;
    // A knows B is gone (else its collector would end the count as B's being back).
    until(Duration::from_secs(10), "host-b shown gone", || {
        view(&a, "api").contains(&("host-b".to_string(), false))
    })
    .await;
    let count = format!("{PREFIX}outcomes-gone/host-b");
    tokio::task::block_in_place(|| cluster.put(&count, b"not a count"));
    let junk = Instant::now();
    // The bound of the first test: GC plus a few collection periods (GC / 4 each).
    until(GC * 4, "host-b's outcome gone from etcd", || {
        !outcome_keys(&cluster)
            .iter()
            .any(|k| k.contains("/host-b/"))
    })
    .await;
    let took = junk.elapsed();
    eprintln!("host-b's outcome removed {took:?} after its count was made undecodable");
    // The count started when the bad value was replaced, not before.
    assert!(took >= GC, "removed before the set time: {took:?}");
    let left = tokio::task::block_in_place(|| cluster.dump(&format!("{PREFIX}outcomes-gone/")));
    assert!(left.iter().all(|(k, _)| k != &count), "{left:?}");
    assert_eq!(view(&a, "api").len(), 1);
}

/// `forget_host` of a host with keys of the old layout (`P/outcomes/NAME/HOST`,
/// `P/unable/NAME/HOST`: daemons of before) among more keys of other hosts than one read can
/// carry (the client takes messages of up to 4 MiB; this is ≈ 4.6 MiB of key names alone): every
/// key of that host is deleted, none of another host's. Before, the old layout's prefixes were
/// read in one range read, which failed, so the host could not be forgotten at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_host_pages_through_the_old_layouts_keys() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    let a = host(&cluster, "host-a", Duration::from_secs(3600), &dir).await;
    // Long binding names (the limit is 128) make the keys large.
    let name = |i: usize| format!("b{i:06}-{}", "n".repeat(100));
    const OTHERS: usize = 32_000;
    const MINE: usize = 150;
    let mut ops: Vec<(String, String)> = (0..OTHERS)
        .map(|i| (format!("{PREFIX}outcomes/{}/host-y", name(i)), "{}".into()))
        .collect();
    let mine: Vec<String> = (0..MINE)
        .flat_map(|i| {
            [
                format!("{PREFIX}outcomes/{}/host-x", name(i * 200)),
                format!("{PREFIX}unable/{}/host-x", name(i * 200)),
            ]
        })
        .collect();
    ops.extend(mine.iter().map(|k| (k.clone(), "{}".to_string())));
    ops.push((
        format!("{PREFIX}unable/{}/host-y", name(0)),
        "{}".to_string(),
    ));
    let raw = crate::common::raw_client(&cluster).await;
    let mut tasks = Vec::new();
    for part in ops.chunks(ops.len().div_ceil(8)) {
        let part = part.to_vec();
        let mut raw = raw.clone();
        tasks.push(tokio::spawn(async move {
            for txn in part.chunks(100) {
                let puts = txn
                    .iter()
                    .map(|(k, v)| etcd_client::TxnOp::put(k.as_str(), v.as_str(), None))
                    .collect::<Vec<_>>();
                raw.txn(etcd_client::Txn::new().and_then(puts))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let count = |prefix: String| {
        let mut raw = raw.clone();
        async move {
            raw.get(
                prefix,
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .unwrap()
            .count()
        }
    };
    assert_eq!(
        count(format!("{PREFIX}outcomes/")).await as usize,
        OTHERS + MINE
    );

    let forgot = a.forget_host("host-x", false).await.unwrap();
    assert_eq!(forgot.keys, 2 * MINE);
    for key in &mine {
        assert_eq!(count(key.clone()).await, 0, "{key} left");
    }
    assert_eq!(count(format!("{PREFIX}outcomes/")).await as usize, OTHERS);
    assert_eq!(count(format!("{PREFIX}unable/")).await, 1);
}
