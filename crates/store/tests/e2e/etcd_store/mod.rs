//! The etcd store against a real 3-member etcd cluster (Debian's etcd-server on loopback ports):
//! several store instances play the hosts of a fleet. The hosts and the helpers are here; the
//! cases by theme: bindings and sets reaching the other hosts (`sync`), and resolvers, writes and
//! the mirror when a holder, a member or etcd goes away (`failover`).

mod failover;
mod sync;

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

/// The names of the bindings in a host's mirror.
fn mirror_names(h: &Host) -> Vec<String> {
    let list = h.store.list_bindings().unwrap();
    list.into_iter().map(|b| b.binding.name).collect()
}

/// The cluster member `h`'s session talks to (`status()` names it: "connected to URL").
fn session_member(h: &Host, cluster: &EtcdCluster) -> usize {
    let loc = h.store.status().location;
    cluster
        .endpoints()
        .iter()
        .position(|e| loc.contains(&format!("connected to {e}")))
        .unwrap_or_else(|| panic!("no member named in {loc}"))
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

/// `store`'s fleet view of `name` with the outcomes read from etcd now (hosts do not watch them:
/// `refresh_fleet` first, as the API and the UI do). In a multi-threaded runtime.
fn fleet_view_now(store: &tributary_store::EtcdStore, name: &str) -> tributary_store::FleetView {
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(store.refresh_fleet(Some(name)))
    });
    store.fleet_view(name)
}
