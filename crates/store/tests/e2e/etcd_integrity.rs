//! The fleet store's integrity rules against a real 3-member etcd cluster
//! (docs/fleet.md): a change is never lost to a lagging record, a name is unique regardless of case
//! across hosts, the mirror records a revision only once its file has it, versions are not the
//! writers' clocks, and a refused outcome write does not end the session in a loop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::common::{self, blocking, service_on, until, Host};

use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{
    BindingRecord, BindingStore, EtcdOptions, HostOutcome, HostState, StoreError, TargetSet,
    MAX_OUTCOME_MESSAGE,
};

const PREFIX: &str = "/integrity/";

fn binding(name: &str, service: &str, token: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "consul".into(),
        provider: "consul".into(),
        config: BTreeMap::from([
            ("acl_token".to_string(), serde_json::json!(token)),
            (
                "address".to_string(),
                serde_json::json!("http://127.0.0.1:8500"),
            ),
        ]),
        service: service.into(),
        interval_secs: 30,
        directives: vec![],
        probe: None,
        drain_secs: 0,
    }
}

fn options(cluster: &EtcdCluster, id: &str, dir: &tempfile::TempDir) -> EtcdOptions {
    common::options(cluster, PREFIX, id, dir)
}

async fn host(cluster: &EtcdCluster, id: &str) -> Host {
    let dir = tempfile::tempdir().unwrap();
    common::connected(options(cluster, id, &dir), dir).await
}

/// A's mirror file is locked by another writer (a backup tool, a stuck process: the same failing
/// SQLite write as a full disk) while B changes a binding: A's mirror must not record the change's
/// revision as its file's (A's reads have the change from memory at once), and must write the
/// change once its file can be written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_write_that_fails_is_applied_once_the_file_can_be_written() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let b = host(&cluster, "host-b").await;
    a.store
        .insert_binding(&binding("api", "web1", "t1"))
        .await
        .unwrap();
    until(Duration::from_secs(5), "api on B", || {
        service_on(&b, "api").is_some()
    })
    .await;

    // A's file has the first version (its writer thread commits it a moment after A's memory).
    let reader = rusqlite::Connection::open(&a.mirror).unwrap();
    until(Duration::from_secs(5), "api in A's file", || {
        reader
            .query_row("SELECT service FROM bindings WHERE name = 'api'", [], |r| {
                r.get::<_, String>(0)
            })
            .is_ok_and(|s| s == "web1")
    })
    .await;
    drop(reader);

    // Another process holds the write lock of A's mirror: A's writes fail (after SQLite's busy
    // timeout) until it lets go.
    let locker = rusqlite::Connection::open(&a.mirror).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    b.store
        .upsert_bindings(&[binding("api", "web2", "t1")])
        .await
        .unwrap();
    // A's watch gets the change at once (in A's reads: the mirror's memory); its file's write
    // waits out SQLite's busy timeout (5 s) and fails.
    until(Duration::from_secs(5), "B's change in A's reads", || {
        service_on(&a, "api").as_deref() == Some("web2")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let in_file = |locker: &rusqlite::Connection| -> String {
        locker
            .query_row("SELECT service FROM bindings WHERE name = 'api'", [], |r| {
                r.get(0)
            })
            .unwrap()
    };
    assert_eq!(in_file(&locker), "web1");
    locker.execute_batch("ROLLBACK").unwrap();

    // A's session reconnects and reads the prefix again: the change is written now (its
    // revision was not recorded as the file's, else the read would skip it).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while in_file(&locker) != "web2" {
        assert!(
            std::time::Instant::now() < deadline,
            "B's change never reached A's file after the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(locker);
    assert_eq!(service_on(&a, "api").as_deref(), Some("web2"));
    // The session applies the read before it opens its watch and says connected.
    until(Duration::from_secs(10), "A connected again", || {
        a.store.status().connected
    })
    .await;
}

fn token_on(h: &Host, name: &str) -> Option<serde_json::Value> {
    h.store
        .get_binding(name)
        .unwrap()
        .and_then(|sb| sb.binding.config.get("acl_token").cloned())
}

/// A host prepares a change from its copy of a binding (the secrets left out of the request are
/// carried over from that copy) while another host has already rotated the token: the lagging
/// copy must not be written over the rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_prepared_from_a_lagging_copy_does_not_overwrite_a_newer_one() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let b = host(&cluster, "host-b").await;
    a.store
        .insert_binding(&binding("api", "web", "old-token"))
        .await
        .unwrap();
    // What A's engine holds and prepares the next change from.
    let copy = a.store.get_binding("api").unwrap().unwrap().binding;
    until(Duration::from_secs(5), "api on B", || {
        service_on(&b, "api").is_some()
    })
    .await;
    // B rotates the token; A's mirror has it, A's copy does not.
    b.store
        .upsert_bindings(&[binding("api", "web", "new-token")])
        .await
        .unwrap();
    until(Duration::from_secs(5), "the rotation on A", || {
        token_on(&a, "api") == Some(serde_json::json!("new-token"))
    })
    .await;
    // A person on A changes the interval, giving no secret: the token comes from the copy.
    let mut change = copy.clone();
    change.interval_secs = 60;
    let r = a.store.upsert_bindings_from(&[(change, Some(copy))]).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(ref n)) if n == "api"),
        "a change prepared from a lagging copy was not refused: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for h in [&a, &b] {
        assert_eq!(
            token_on(h, "api"),
            Some(serde_json::json!("new-token")),
            "the rotation was overwritten"
        );
    }
    // Prepared from the current record, the same change is written.
    let current = a.store.get_binding("api").unwrap().unwrap().binding;
    let mut change = current.clone();
    change.interval_secs = 60;
    a.store
        .upsert_bindings_from(&[(change, Some(current))])
        .await
        .unwrap();
    until(Duration::from_secs(5), "the interval on B", || {
        b.store
            .get_binding("api")
            .unwrap()
            .is_some_and(|sb| sb.binding.interval_secs == 60)
    })
    .await;
    assert_eq!(token_on(&b, "api"), Some(serde_json::json!("new-token")));
}

/// Names are unique regardless of case across hosts: two hosts creating `Api` and `api` at the
/// same moment (single creation and bulk save), exactly one succeeds; once it is removed, the
/// other name can be created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_differing_only_in_case_created_on_two_hosts_at_once_one_wins() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let b = host(&cluster, "host-b").await;
    for round in 0..3 {
        let (upper, lower) = (format!("Api{round}"), format!("api{round}"));
        let (ba, bb) = (binding(&upper, "web", "t"), binding(&lower, "web", "t"));
        let (ra, rb) = tokio::join!(a.store.insert_binding(&ba), b.store.insert_binding(&bb));
        assert!(
            ra.is_ok() != rb.is_ok(),
            "round {round}: exactly one creation must succeed: {ra:?} {rb:?}"
        );
        let (lost, won) = if ra.is_ok() {
            (rb, &upper)
        } else {
            (ra, &lower)
        };
        assert!(
            matches!(lost, Err(StoreError::Duplicate(ref n)) if n == won),
            "round {round}: the refusal names the binding that won: {lost:?}"
        );
        let (da, db) = (
            [binding(&format!("Db{round}"), "pg", "t")],
            [binding(&format!("db{round}"), "pg", "t")],
        );
        let (ua, ub) = tokio::join!(a.store.upsert_bindings(&da), b.store.upsert_bindings(&db));
        assert!(
            ua.is_ok() != ub.is_ok(),
            "round {round}: exactly one bulk creation must succeed: {ua:?} {ub:?}"
        );
    }
    let names = |h: &Host| -> Vec<String> {
        let mut v: Vec<String> = h
            .store
            .list_bindings()
            .unwrap()
            .into_iter()
            .map(|sb| sb.binding.name.to_ascii_lowercase())
            .collect();
        v.sort();
        v
    };
    until(
        Duration::from_secs(5),
        "both hosts to hold the same six bindings",
        || names(&a).len() == 6 && names(&a) == names(&b),
    )
    .await;
    // The winner removed, the other spelling can be created.
    let won = a
        .store
        .list_bindings()
        .unwrap()
        .into_iter()
        .map(|sb| sb.binding.name)
        .find(|n| n.eq_ignore_ascii_case("api0"))
        .unwrap();
    assert!(a.store.remove_binding(&won).await.unwrap());
    let other = if won == "Api0" { "api0" } else { "Api0" };
    until(Duration::from_secs(5), "the removal on B", || {
        service_on(&b, &won).is_none()
    })
    .await;
    b.store
        .insert_binding(&binding(other, "web", "t"))
        .await
        .unwrap();
}

/// The clock of `host-b` in the test below: set to the time stamp of the version it replaces.
static BEHIND: AtomicI64 = AtomicI64::new(0);

fn behind() -> i64 {
    BEHIND.load(Ordering::SeqCst)
}

/// A writer whose clock is behind (here: reading the very time stamp of the version it replaces)
/// must still make a newer version: else a target set resolved from the old version passes as
/// the new version's, and every host applies it; the writer's change is lost until the next
/// resolution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_clock_is_behind_still_makes_a_newer_version() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&cluster, "host-b", &dir);
    opts.clock = behind;
    let b = common::connected(opts, dir).await;

    a.store
        .insert_binding(&binding("api", "web1", "t"))
        .await
        .unwrap();
    let v1 = a.store.get_binding("api").unwrap().unwrap().updated_at_ms;
    until(Duration::from_secs(5), "api on B", || {
        service_on(&b, "api").is_some()
    })
    .await;
    // The resolver of api resolves version 1 ...
    let resolver = loop {
        if a.store.claim_resolver("api").await.unwrap() {
            break &a;
        }
        if b.store.claim_resolver("api").await.unwrap() {
            break &b;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let from_v1 = TargetSet {
        resolved_by: String::new(),
        at_ms: 1,
        binding_updated_at_ms: v1,
        targets: vec![serde_json::json!({"address": "10.0.0.1", "port": 80, "weight": 1})],
        dropped: vec![],
        ttl_seconds: None,
        generation: 0,
    };
    // ... while B, its clock reading v1's stamp, changes the service.
    BEHIND.store(v1, Ordering::SeqCst);
    b.store
        .upsert_bindings(&[binding("api", "web2", "t")])
        .await
        .unwrap();
    until(Duration::from_secs(5), "the change on both hosts", || {
        service_on(&a, "api").as_deref() == Some("web2")
            && service_on(&b, "api").as_deref() == Some("web2")
    })
    .await;
    // The set resolved from version 1 is not published as version 2's.
    let r = resolver.store.publish_targets("api", &from_v1).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "a set resolved from the replaced version was published: {r:?}"
    );
    let v2 = a.store.get_binding("api").unwrap().unwrap().updated_at_ms;
    assert!(
        v2 > v1,
        "version 2 ({v2}) is not newer than version 1 ({v1})"
    );
}

/// nginx refused a change with a message larger than etcd takes in one request (1.5 MiB by
/// default): the outcome is published with the message cut, the session stays up (it used to end
/// and fail again at every reconnection, publishing nothing more), and later outcomes get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_too_large_for_etcd_is_cut_and_does_not_end_the_session() {
    let cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let b = host(&cluster, "host-b").await;
    for name in ["api", "db"] {
        a.store
            .insert_binding(&binding(name, "web", "t"))
            .await
            .unwrap();
    }
    until(Duration::from_secs(5), "the bindings on B", || {
        service_on(&b, "db").is_some()
    })
    .await;
    let huge = format!("nginx: [emerg] {}", "x".repeat(2 << 20));
    let outcome = |generation: i64, message: Option<String>| HostOutcome {
        host: String::new(),
        state: HostState::Failed,
        at_ms: 1,
        generation,
        servers: 1,
        message,
    };
    a.store
        .publish_host_outcome("api", &outcome(1, Some(huge)))
        .await
        .unwrap();
    let a_on_b = |name: &str| {
        fleet_view_now(&b.store, name)
            .hosts
            .into_iter()
            .find(|h| h.outcome.host == "host-a")
            .map(|h| h.outcome)
    };
    until(Duration::from_secs(10), "A's outcome of api on B", || {
        a_on_b("api").is_some()
    })
    .await;
    let seen = a_on_b("api").unwrap().message.unwrap();
    assert!(seen.len() <= MAX_OUTCOME_MESSAGE, "{} bytes", seen.len());
    assert!(seen.starts_with("nginx: [emerg] xxx"), "{seen:.60}");
    // The session is up and later outcomes get through.
    a.store
        .publish_host_outcome("db", &outcome(2, None))
        .await
        .unwrap();
    until(Duration::from_secs(5), "A's outcome of db on B", || {
        a_on_b("db").is_some_and(|o| o.generation == 2)
    })
    .await;
    let status = a.store.status();
    assert!(
        status.connected && status.last_error.is_none(),
        "{status:?}"
    );
}

/// etcd restored from a backup while the hosts run: its revisions go back. A host must rebuild
/// its mirror from what etcd holds then (the restored version of a binding, no binding created
/// after the backup) and follow the changes made after the restore, whose revisions are below the
/// ones it had seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_etcd_is_restored_from_a_backup_the_hosts_follow_it() {
    let mut cluster = blocking(|| EtcdCluster::start(3));
    let a = host(&cluster, "host-a").await;
    let b = host(&cluster, "host-b").await;
    a.store
        .insert_binding(&binding("api", "web1", "t"))
        .await
        .unwrap();
    let backup = tempfile::tempdir().unwrap();
    blocking(|| cluster.backup(backup.path()));
    for h in [&a, &b] {
        assert!(h.store.wait_connected(Duration::from_secs(15)).await);
    }
    // After the backup: many changes (revisions well past the backup's), a new binding.
    for i in 0..20 {
        a.store
            .upsert_bindings(&[binding("api", &format!("web-{i}"), "t")])
            .await
            .unwrap();
    }
    a.store
        .insert_binding(&binding("later", "web", "t"))
        .await
        .unwrap();
    until(Duration::from_secs(5), "the changes on B", || {
        service_on(&b, "later").is_some() && service_on(&b, "api").as_deref() == Some("web-19")
    })
    .await;

    blocking(|| cluster.restore(backup.path()));
    // Both hosts show what etcd holds now.
    for h in [&a, &b] {
        until(
            Duration::from_secs(20),
            "the restored state on every host",
            || {
                h.store.status().connected
                    && service_on(h, "api").as_deref() == Some("web1")
                    && service_on(h, "later").is_none()
            },
        )
        .await;
    }
    // A change made after the restore (at a revision below the ones seen before) reaches A.
    b.store
        .upsert_bindings(&[binding("api", "web-after", "t")])
        .await
        .unwrap();
    until(
        Duration::from_secs(5),
        "the change after the restore on A",
        || service_on(&a, "api").as_deref() == Some("web-after"),
    )
    .await;
}

/// `store`'s fleet view of `name` with the outcomes read from etcd now (hosts do not watch them:
/// `refresh_fleet` first, as the API and the UI do). In a multi-threaded runtime.
fn fleet_view_now(store: &tributary_store::EtcdStore, name: &str) -> tributary_store::FleetView {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(store.refresh_fleet(Some(name)))
    });
    store.fleet_view(name)
}
