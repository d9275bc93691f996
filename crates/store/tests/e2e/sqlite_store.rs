//! The single-host `BindingStore` contract of `SqliteStore`: the same calls the etcd store
//! answers, with this host as the whole fleet.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_store::{
    BindingRecord, BindingStore, HostOutcome, HostState, OutcomeRecord, OutcomeStatus, SqliteStore,
    StoreError, StoredBinding, TargetSet, Upsert,
};

fn binding(name: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "static".into(),
        provider: "static".into(),
        config: BTreeMap::from([("targets".to_string(), serde_json::json!("127.0.0.1:80"))]),
        service: "api".into(),
        interval_secs: 60,
        directives: vec![],
        drain_secs: 0,
        probe: None,
    }
}

fn set(addr: &str) -> TargetSet {
    TargetSet {
        resolved_by: String::new(),
        at_ms: 1,
        binding_updated_at_ms: 5,
        targets: vec![serde_json::json!({"address": addr, "port": 80, "weight": 1})],
        dropped: vec![],
        ttl_seconds: None,
        generation: 0,
    }
}

fn names(list: Vec<StoredBinding>) -> Vec<String> {
    list.into_iter().map(|b| b.binding.name).collect()
}

fn open(dir: &tempfile::TempDir) -> Arc<dyn BindingStore> {
    Arc::new(SqliteStore::open(&dir.path().join("t.db"), Default::default(), "host-a").unwrap())
}

#[tokio::test]
async fn crud_and_history_through_the_trait_object() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    s.insert_binding(&binding("api")).await.unwrap();
    assert!(matches!(
        s.insert_binding(&binding("api")).await,
        Err(StoreError::Duplicate(n)) if n == "api"
    ));
    let mut changed = binding("api");
    changed.service = "other".into();
    let ups = s
        .upsert_bindings(&[changed.clone(), binding("web")])
        .await
        .unwrap();
    assert_eq!(ups, vec![Upsert::Updated, Upsert::Created]);
    assert_eq!(s.get_binding("api").unwrap().unwrap().binding, changed);
    s.record_outcomes(&[("api".into(), OutcomeRecord::new(7, OutcomeStatus::Ok))])
        .await
        .unwrap();
    assert_eq!(s.recent_outcomes("api", 5).unwrap()[0].at_ms, 7);
    assert_eq!(s.last_outcomes().unwrap().len(), 1);
    assert!(s.remove_binding("api").await.unwrap());
    assert!(!s.remove_binding("api").await.unwrap());
    assert_eq!(names(s.list_bindings().unwrap()), ["web"]);
}

#[tokio::test]
async fn this_host_is_the_whole_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    let mut events = s.subscribe();
    s.insert_binding(&binding("api")).await.unwrap();
    assert!(s.claim_resolver("api").await.unwrap());
    assert_eq!(s.status().kind, "sqlite");
    assert!(s.status().connected);
    assert_eq!(s.host_id(), "host-a");

    assert!(s.published_targets("api").is_none());
    s.publish_targets("api", &set("10.0.0.1")).await.unwrap();
    let first = s.published_targets("api").unwrap();
    assert_eq!(first.resolved_by, "host-a");
    assert!(first.generation > 0);
    // The same set again is not a new generation; a different one is.
    let mut again = set("10.0.0.1");
    again.at_ms = 99;
    s.publish_targets("api", &again).await.unwrap();
    assert_eq!(
        s.published_targets("api").unwrap().generation,
        first.generation
    );
    s.publish_targets("api", &set("10.0.0.2")).await.unwrap();
    let second = s.published_targets("api").unwrap();
    assert!(second.generation > first.generation);

    s.publish_host_outcome(
        "api",
        &HostOutcome {
            host: String::new(),
            state: HostState::Applied,
            at_ms: 3,
            generation: second.generation,
            servers: 1,
            message: None,
        },
    )
    .await
    .unwrap();
    let view = s.fleet_view("api");
    assert_eq!(view.resolver.as_deref(), Some("host-a"));
    assert_eq!(view.generation, second.generation);
    assert_eq!(view.hosts.len(), 1);
    assert_eq!(view.hosts[0].outcome.host, "host-a");
    assert!(view.hosts[0].alive);

    // Nothing happens elsewhere: no event.
    assert!(matches!(
        events.try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Empty)
    ));
    s.remove_binding("api").await.unwrap();
    assert!(s.published_targets("api").is_none());
    assert!(s.fleet_view("api").hosts.is_empty());
}

/// A write waits on SQLite (another connection holds the file's write lock: a backup tool, a
/// slow disk; up to the 5 s busy timeout) while the engine and the API read: the reads answer at
/// once with what is committed, and the write goes through once the lock is released. Before,
/// the reads waited behind the write on the store's one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_at_once_while_a_write_waits_on_the_files_lock() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    s.insert_binding(&binding("api")).await.unwrap();
    s.record_outcomes(&[("api".into(), OutcomeRecord::new(7, OutcomeStatus::Ok))])
        .await
        .unwrap();
    let locker = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let write = {
        let s = s.clone();
        tokio::spawn(async move { s.insert_binding(&binding("web")).await })
    };
    // Setup, not the assertion: the write has reached SQLite and waits on the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!write.is_finished());
    let reader = s.clone();
    let t = Instant::now();
    let (list, one, history) = tokio::task::spawn_blocking(move || {
        (
            reader.list_bindings(),
            reader.get_binding("api"),
            reader.recent_outcomes("api", 5),
        )
    })
    .await
    .unwrap();
    let took = t.elapsed();
    assert!(
        took <= Duration::from_millis(500),
        "the reads waited {took:?} for a write held up by the file's lock"
    );
    assert_eq!(names(list.unwrap()), ["api"]);
    assert!(one.unwrap().is_some());
    assert_eq!(history.unwrap().len(), 1);
    locker.execute_batch("ROLLBACK").unwrap();
    write.await.unwrap().unwrap();
    assert_eq!(names(s.list_bindings().unwrap()), ["api", "web"]);
}
