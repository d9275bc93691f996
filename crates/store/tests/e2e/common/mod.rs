//! What the etcd store's test binaries share: a binding and a target set to save, a connected store
//! instance playing one host, and waiting for a condition. Each binary uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::Client;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingRecord, BindingStore, EtcdOptions, EtcdStore, SecretKeys, TargetSet};

/// The hosts' session lease TTL.
pub const TTL: Duration = Duration::from_secs(2);

pub fn binding(name: &str, service: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "consul".into(),
        provider: "consul".into(),
        config: BTreeMap::from([("acl_token".to_string(), serde_json::json!("t0k3n"))]),
        service: service.into(),
        interval_secs: 30,
        directives: vec![],
        drain_secs: 0,
        probe: None,
    }
}

/// A set of one server at `address`, resolved from the binding version `updated_at_ms`.
pub fn target_set(updated_at_ms: i64, address: &str) -> TargetSet {
    TargetSet {
        resolved_by: String::new(),
        at_ms: 1,
        binding_updated_at_ms: updated_at_ms,
        targets: vec![serde_json::json!({"address": address, "port": 80, "weight": 1})],
        dropped: vec![],
        ttl_seconds: None,
        generation: 0,
    }
}

pub struct Host {
    pub store: Arc<EtcdStore>,
    /// Its mirror's SQLite file.
    pub mirror: PathBuf,
    _dir: tempfile::TempDir,
}

/// Options of host `id` under `prefix`, its mirror file in `dir`: lease TTL [`TTL`], 2 s per
/// operation, nothing else set.
pub fn options(
    cluster: &EtcdCluster,
    prefix: &str,
    id: &str,
    dir: &tempfile::TempDir,
) -> EtcdOptions {
    let mut opts = EtcdOptions::new(
        cluster.endpoints(),
        prefix,
        id,
        &dir.path().join(format!("{id}.db")),
    );
    opts.lease_ttl = TTL;
    opts.op_timeout = Duration::from_secs(2);
    opts
}

/// A store instance with `opts` and the test key, not waited for (`dir` holds its mirror).
pub fn open(opts: EtcdOptions, dir: tempfile::TempDir) -> Host {
    let mirror = opts.mirror_path.clone();
    let keys = SecretKeys::from_bytes(&[&[42u8; 32]]).unwrap();
    Host {
        store: Arc::new(EtcdStore::open(opts, keys).unwrap()),
        mirror,
        _dir: dir,
    }
}

/// [`open`], connected.
pub async fn connected(opts: EtcdOptions, dir: tempfile::TempDir) -> Host {
    let id = opts.host_id.clone();
    let h = open(opts, dir);
    assert!(
        h.store.wait_connected(Duration::from_secs(15)).await,
        "{id} did not connect: {:?}",
        h.store.status()
    );
    h
}

/// The service of binding `name` as `h` has it.
pub fn service_on(h: &Host, name: &str) -> Option<String> {
    h.store
        .get_binding(name)
        .unwrap()
        .map(|sb| sb.binding.service)
}

/// A store instance as host `id` under `prefix` with `keys` (the first seals), connected.
pub async fn host(cluster: &EtcdCluster, prefix: &str, id: &str, keys: &[&[u8]]) -> Host {
    host_with(
        cluster,
        prefix,
        id,
        SecretKeys::from_bytes(keys).unwrap(),
        false,
    )
    .await
}

/// [`host`] with its secrets given, and `--etcd-require-integrity` or not.
pub async fn host_with(
    cluster: &EtcdCluster,
    prefix: &str,
    id: &str,
    secrets: SecretKeys,
    require_integrity: bool,
) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(cluster, prefix, id, &dir);
    opts.providers = Some(vec!["consul/consul".into()]);
    opts.require_integrity = require_integrity;
    let mirror = opts.mirror_path.clone();
    let store = Arc::new(EtcdStore::open(opts, secrets).unwrap());
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

/// Waits until `f` holds, at most `limit`.
pub async fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `f`, a blocking store call, without stalling the runtime's other tasks.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A plain etcd client on the cluster (what `etcdctl` would do).
pub async fn raw_client(cluster: &EtcdCluster) -> Client {
    Client::connect(cluster.endpoints(), None).await.unwrap()
}
