//! The etcd store's local mirror against a real 3-member etcd cluster: neither readers nor the
//! session wait on the mirror's SQLite write (made by a writer thread, outside the mirror's lock),
//! and a host does not write a binding that it saved the moment it connected to a new fleet a
//! second time.

use std::time::{Duration, Instant};

use crate::common::{self, binding, blocking, service_on, until, Host};

use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingStore, HostOutcome, HostState, OutcomeRecord, OutcomeStatus};

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

/// The service of binding `name` in the mirror file at `path` as committed now (read through a
/// connection of its own, as another process would).
fn service_in_file(path: &std::path::Path, name: &str) -> Option<String> {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row(
        "SELECT service FROM bindings WHERE name = ?1",
        [name],
        |r| r.get(0),
    )
    .ok()
}

/// Another process holds the write lock of A's mirror file (`BEGIN IMMEDIATE`: a backup tool, or
/// a disk so slow that a write takes seconds) for 4 s (less than SQLite's busy timeout, 5 s, that
/// the write waits out) while B changes a binding: A's session applies the change in memory at
/// once (every read of A's store has it within 1 s) and goes on (A's outcome, published
/// meanwhile, reaches etcd), while the mirror's writer waits; every read answers at once, the
/// outcome history is read; the file has the change once the lock is released. Before, the
/// session waited for the write: A's reads had the old version for the 4 s, and its outcome
/// waited as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_answer_at_once_while_the_mirrors_sqlite_write_waits() {
    const PREFIX: &str = "/mirror-lock/";
    const HELD: Duration = Duration::from_secs(4);
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
    until(Duration::from_secs(5), "api in A's file", || {
        service_in_file(&a.mirror, "api").as_deref() == Some("web1")
    })
    .await;

    let locker = rusqlite::Connection::open(&a.mirror).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = Instant::now();
    b.store
        .upsert_bindings(&[binding("api", "web2")])
        .await
        .unwrap();
    // A's reads have it within 1 s, while its file is locked.
    until(Duration::from_secs(1), "B's change in A's reads", || {
        service_on(&a, "api").as_deref() == Some("web2")
    })
    .await;
    let seen = held.elapsed();
    // A's session goes on: an outcome A publishes now reaches etcd (B reads it there).
    a.store
        .publish_host_outcome(
            "api",
            &HostOutcome {
                host: String::new(),
                state: HostState::Applied,
                at_ms: 1,
                generation: 7,
                servers: 1,
                message: None,
            },
        )
        .await
        .unwrap();
    let published = Instant::now();
    let a_on_b = || {
        blocking(|| tokio::runtime::Handle::current().block_on(b.store.refresh_fleet(Some("api"))));
        b.store
            .fleet_view("api")
            .hosts
            .iter()
            .any(|h| h.outcome.host == "host-a" && h.outcome.generation == 7)
    };
    until(Duration::from_secs(2), "A's outcome on B", a_on_b).await;
    let flushed = published.elapsed();

    // Every reader of A's store, while the lock is held.
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
    while held.elapsed() < HELD {
        rounds += 1;
        timed("get_binding", &mut || {
            assert_eq!(service_on(&a, "api").as_deref(), Some("web2"));
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
    // The file's write was still held up when the reads ended (the locker reads what is
    // committed).
    let in_file: String = locker
        .query_row("SELECT service FROM bindings WHERE name = 'api'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(in_file, "web1");
    assert!(
        slowest.0 < Duration::from_secs(1),
        "{} waited {:?} for the mirror's SQLite write ({rounds} rounds of reads)",
        slowest.1,
        slowest.0
    );
    eprintln!(
        "change in A's reads {seen:?} after the lock; A's outcome on B {flushed:?} after it was \
         published; {rounds} rounds of reads while the write waited; slowest: {} {:?}",
        slowest.1, slowest.0
    );

    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);
    until(Duration::from_secs(10), "B's change in A's file", || {
        service_in_file(&a.mirror, "api").as_deref() == Some("web2")
    })
    .await;
    assert_eq!(service_on(&a, "api").as_deref(), Some("web2"));
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
