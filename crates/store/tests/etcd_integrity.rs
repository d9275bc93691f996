//! The fleet store's integrity rules against a real 3-member etcd cluster (issue 22,
//! "Correctness"): a change is never lost to a lagging record, a name is unique regardless of case
//! across hosts, the mirror records a revision only once its file has it, versions are not the
//! writers' clocks, and a refused outcome write does not end the session in a loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingRecord, BindingStore, EtcdOptions, EtcdStore, SecretKeys};

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
    }
}

struct Host {
    store: Arc<EtcdStore>,
    mirror: PathBuf,
    _dir: tempfile::TempDir,
}

fn options(cluster: &EtcdCluster, id: &str, dir: &tempfile::TempDir) -> EtcdOptions {
    let mut opts = EtcdOptions::new(
        cluster.endpoints(),
        PREFIX,
        id,
        &dir.path().join(format!("{id}.db")),
    );
    opts.lease_ttl = Duration::from_secs(2);
    opts.op_timeout = Duration::from_secs(2);
    opts
}

async fn host_with(id: &str, opts: EtcdOptions, dir: tempfile::TempDir) -> Host {
    let mirror = opts.mirror_path.clone();
    let keys = SecretKeys::from_bytes(&[&[42u8; 32]]).unwrap();
    let store = Arc::new(EtcdStore::open(opts, keys).unwrap());
    assert!(
        store.wait_connected(Duration::from_secs(15)).await,
        "{id} did not connect: {:?}",
        store.status()
    );
    Host {
        store,
        mirror,
        _dir: dir,
    }
}

async fn host(cluster: &EtcdCluster, id: &str) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(cluster, id, &dir);
    host_with(id, opts, dir).await
}

async fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn service_on(h: &Host, name: &str) -> Option<String> {
    h.store
        .get_binding(name)
        .unwrap()
        .map(|sb| sb.binding.service)
}

/// A's mirror file is locked by another writer (a backup tool, a stuck process: the same failing
/// SQLite write as a full disk) while B changes a binding: A's mirror must not record the change's
/// revision, and must apply the change once its file can be written again.
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

    // Another process holds the write lock of A's mirror: A's writes fail (after SQLite's busy
    // timeout) until it lets go.
    let locker = rusqlite::Connection::open(&a.mirror).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    b.store
        .upsert_bindings(&[binding("api", "web2", "t1")])
        .await
        .unwrap();
    // A's watch gets the change at once; its write waits out SQLite's busy timeout (5 s) and
    // fails.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(service_on(&a, "api").as_deref(), Some("web1"));
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);

    // A's session reconnects and reads the prefix again: the change is applied now.
    until(
        Duration::from_secs(20),
        "B's change on A after the lock",
        || service_on(&a, "api").as_deref() == Some("web2"),
    )
    .await;
    assert!(a.store.status().connected);
}
