//! The etcd store's local mirror against a real 3-member etcd cluster: readers never wait on the
//! mirror's SQLite write (it is made outside the mirror's lock), and a host does not write a
//! binding that it saved the moment it connected to a new fleet a second time.

use std::time::{Duration, Instant};

use crate::common::{self, binding, blocking, service_on, until, Host};

use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingStore, OutcomeRecord, OutcomeStatus};

/// Host `id` under `prefix` (not waited for).
fn open(cluster: &EtcdCluster, prefix: &str, id: &str) -> Host {
    let dir = tempfile::tempdir().unwrap();
    common::open(common::options(cluster, prefix, id, &dir), dir)
}

async fn connected(cluster: &EtcdCluster, prefix: &str, id: &str) -> Host {
    let dir = tempfile::tempdir().unwrap();
    common::connected(common::options(cluster, prefix, id, &dir), dir).await
}

fn outcome(at_ms: i64) -> OutcomeRecord {
    OutcomeRecord {
        at_ms,
        duration_ms: 3,
        status: OutcomeStatus::Ok,
        failure: None,
        why: None,
        code: None,
        field: None,
        kept: vec![],
        dropped: vec![],
        ttl_seconds: None,
        changed: true,
        reloaded: true,
        nginx_error: None,
        applied: None,
        applied_reason: None,
        reload_reason: None,
    }
}

/// Another process holds the write lock of A's mirror file (`BEGIN IMMEDIATE`: a backup tool, or
/// a disk so slow that a write takes seconds) while B changes a binding: A's session applies the
/// change and its SQLite write waits (up to SQLite's busy timeout, 5 s). Meanwhile every read of
/// A's store answers at once, with what the file has committed (the old version), and the
/// outcome history is read; the change is applied once the file can be written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_answer_at_once_while_the_mirrors_sqlite_write_waits() {
    const PREFIX: &str = "/mirror-lock/";
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = connected(&cluster, PREFIX, "host-a").await;
    let b = connected(&cluster, PREFIX, "host-b").await;
    a.store
        .insert_binding(&binding("api", "web1"))
        .await
        .unwrap();
    a.store
        .record_outcomes(&[("api".to_string(), outcome(1))])
        .await
        .unwrap();
    until(Duration::from_secs(5), "api on B", || {
        service_on(&b, "api").is_some()
    })
    .await;

    let locker = rusqlite::Connection::open(&a.mirror).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let watched = a.store.watch_events();
    b.store
        .upsert_bindings(&[binding("api", "web2")])
        .await
        .unwrap();
    // A's watch delivered the change: its session is writing it to the locked file from now on.
    until(Duration::from_secs(5), "the change in A's watch", || {
        a.store.watch_events() > watched
    })
    .await;
    let held = Instant::now();

    // Every reader of A's store, for 4 s (less than the busy timeout the write waits out).
    let mut slowest = (Duration::ZERO, "");
    let mut timed = |what: &'static str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        let took = t.elapsed();
        if took > slowest.0 {
            slowest = (took, what);
        }
    };
    let mut rounds = 0;
    while held.elapsed() < Duration::from_secs(4) {
        rounds += 1;
        timed("get_binding", &mut || {
            // What the file has committed: the write of web2 is held up.
            assert_eq!(service_on(&a, "api").as_deref(), Some("web1"));
        });
        timed("list_bindings", &mut || {
            assert_eq!(a.store.list_bindings().unwrap().len(), 1);
        });
        timed("status", &mut || {
            let _ = a.store.status();
        });
        timed("published_targets", &mut || {
            assert!(a.store.published_targets("api").is_none());
        });
        timed("fleet_view", &mut || {
            let _ = a.store.fleet_view("api");
        });
        timed("fleet_hosts", &mut || {
            assert!(!a.store.fleet_hosts().is_empty());
        });
        timed("recent_outcomes", &mut || {
            assert_eq!(a.store.recent_outcomes("api", 5).unwrap().len(), 1);
        });
        timed("last_outcomes", &mut || {
            assert!(a.store.last_outcomes().unwrap().contains_key("api"));
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The write was still held up when the reads ended.
    assert_eq!(service_on(&a, "api").as_deref(), Some("web1"));
    assert!(
        slowest.0 < Duration::from_secs(1),
        "{} waited {:?} for the mirror's SQLite write ({rounds} rounds of reads)",
        slowest.1,
        slowest.0
    );
    eprintln!(
        "{rounds} rounds of reads while the write waited; slowest: {} {:?}",
        slowest.1, slowest.0
    );

    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);
    // The revision of the failed write was not recorded: the change is applied again.
    until(
        Duration::from_secs(20),
        "B's change on A after the lock",
        || service_on(&a, "api").as_deref() == Some("web2"),
    )
    .await;
}

/// A host joins a new fleet (an empty prefix: it puts the integrity key) and saves a binding the
/// moment its store says connected. Before, the session counted as connected before it put the
/// key, and learnt the key only from its watch: a binding saved in that gap was sealed for a fleet
/// without integrity and then written again by the re-seal task, so etcd held it at version 2 for
/// one save (the flaky `etcd_store::writes_right_after_the_sessions_member_is_killed_...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_saved_the_moment_a_new_fleet_connects_is_written_once() {
    const PREFIX: &str = "/mirror-fresh/";
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = open(&cluster, PREFIX, "host-a");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !a.store.status().connected {
        assert!(Instant::now() < deadline, "{:?}", a.store.status());
        tokio::task::yield_now().await;
    }
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    until(
        Duration::from_secs(5),
        "the fleet requires integrity",
        || a.store.status().integrity_required,
    )
    .await;
    // The re-seal task runs as soon as the mirror applied the key (and every 5 s): long enough.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dump = blocking(|| cluster.dump_versions(PREFIX));
    let version = |k: &str| {
        dump.iter()
            .find(|kv| kv.key == format!("{PREFIX}{k}"))
            .map(|kv| kv.version)
    };
    assert_eq!(version("integrity"), Some(1), "{dump:?}");
    assert_eq!(version("bindings/api"), Some(1), "saved once: {dump:?}");
}
