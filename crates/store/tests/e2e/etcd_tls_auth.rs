//! The etcd store over TLS (a test CA) and with etcd's authentication, against a real
//! single-member etcd.

use std::collections::BTreeMap;
use std::time::Duration;

use tributary_fakes::etcd::Etcd;
use tributary_fakes::tls::TestCa;
use tributary_store::{BindingRecord, BindingStore, EtcdOptions, EtcdStore, EtcdTls, SecretKeys};

fn binding(name: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "static".into(),
        provider: "static".into(),
        config: BTreeMap::from([("targets".to_string(), serde_json::json!("127.0.0.1:80"))]),
        service: "s".into(),
        interval_secs: 30,
        directives: vec![],
        drain_secs: 0,
        probe: None,
    }
}

fn opts(endpoint: String, dir: &tempfile::TempDir) -> EtcdOptions {
    let mut o = EtcdOptions::new(vec![endpoint], "/t/", "h1", &dir.path().join("m.db"));
    o.op_timeout = Duration::from_secs(2);
    o
}

fn keys() -> SecretKeys {
    SecretKeys::from_bytes(&[&[3u8; 32]]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_ca_connects_and_without_it_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let pem = TestCa::generate("tributary test CA").write_pem_files(tmp.path());
    let etcd =
        tokio::task::block_in_place(|| Etcd::start_with(Some((pem.cert.clone(), pem.key.clone()))));
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(etcd.endpoint(), &dir);
    o.tls = Some(EtcdTls {
        ca: Some(pem.ca.clone()),
        cert: None,
        key: None,
    });
    let s = EtcdStore::open(o, keys()).unwrap();
    assert!(
        s.wait_connected(Duration::from_secs(15)).await,
        "{:?}",
        s.status()
    );
    s.insert_binding(&binding("api")).await.unwrap();
    assert!(s.get_binding("api").unwrap().is_some());

    // Without the CA the server's certificate is not trusted: never connected, and it says why.
    let dir2 = tempfile::tempdir().unwrap();
    let mut o = opts(etcd.endpoint(), &dir2);
    o.tls = Some(EtcdTls::default());
    let s2 = EtcdStore::open(o, keys()).unwrap();
    assert!(!s2.wait_connected(Duration::from_secs(3)).await);
    assert!(s2.status().last_error.is_some());
    assert!(s2.insert_binding(&binding("x")).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password_connect_and_a_wrong_password_is_refused_without_being_shown() {
    let mut etcd = tokio::task::block_in_place(Etcd::start);
    tokio::task::block_in_place(|| etcd.enable_auth("root-pw-8641"));
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(etcd.endpoint(), &dir);
    o.user = Some(("root".into(), "root-pw-8641".into()));
    let s = EtcdStore::open(o, keys()).unwrap();
    assert!(
        s.wait_connected(Duration::from_secs(15)).await,
        "{:?}",
        s.status()
    );
    s.insert_binding(&binding("api")).await.unwrap();

    let dir2 = tempfile::tempdir().unwrap();
    let mut o = opts(etcd.endpoint(), &dir2);
    o.user = Some(("root".into(), "wrong-pw-2957".into()));
    let dbg = format!("{o:?}");
    assert!(!dbg.contains("wrong-pw-2957"), "{dbg}");
    let s2 = EtcdStore::open(o, keys()).unwrap();
    assert!(!s2.wait_connected(Duration::from_secs(3)).await);
    let st = s2.status();
    let err = st.last_error.clone().unwrap_or_default();
    assert!(!err.is_empty() && !err.contains("wrong-pw-2957"), "{st:?}");
    let e = s2
        .insert_binding(&binding("x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(!e.contains("wrong-pw-2957"), "{e}");
}

/// A user who may read and write the prefix and nothing else does every kind of write: the
/// writes' marker keys are under the prefix and their lease needs no other permission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_the_prefix_writes_everything() {
    let mut etcd = tokio::task::block_in_place(Etcd::start);
    tokio::task::block_in_place(|| {
        etcd.enable_auth("root-pw-5521");
        etcd.add_prefix_writer("fleet", "fleet-pw-1187", "/t/");
    });
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(etcd.endpoint(), &dir);
    o.user = Some(("fleet".into(), "fleet-pw-1187".into()));
    let s = EtcdStore::open(o, keys()).unwrap();
    assert!(
        s.wait_connected(Duration::from_secs(15)).await,
        "{:?}",
        s.status()
    );
    s.insert_binding(&binding("api")).await.unwrap();
    let mut changed = binding("api");
    changed.service = "s2".into();
    s.upsert_bindings(&[changed, binding("db")]).await.unwrap();
    assert!(s.claim_resolver("api").await.unwrap());
    let set = tributary_store::TargetSet {
        resolved_by: String::new(),
        at_ms: 1,
        // Resolved from the version the store holds (another version's set is refused).
        binding_updated_at_ms: s.get_binding("api").unwrap().unwrap().updated_at_ms,
        targets: vec![serde_json::json!({"address": "10.0.0.1", "port": 80, "weight": 1})],
        dropped: vec![],
        ttl_seconds: None,
        generation: 0,
    };
    s.publish_targets("api", &set).await.unwrap();
    assert!(s.remove_binding("db").await.unwrap());
    assert_eq!(s.get_binding("api").unwrap().unwrap().binding.service, "s2");
}

/// A user who may write everything under the prefix but host outcomes (a per-host permission
/// layout gone wrong): its outcome writes are refused, dropped with a warning, and the session
/// stays up (a refused batch used to end the session, and the reconnection flushed it again:
/// a loop in which the store said unreachable most of the time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_outcome_write_is_dropped_and_does_not_end_the_session() {
    let mut etcd = tokio::task::block_in_place(Etcd::start);
    tokio::task::block_in_place(|| {
        etcd.enable_auth("root-pw-7103");
        let writable: Vec<String> = [
            "bindings",
            "hosts",
            "resolvers",
            "targets",
            "unable-by-host",
            "writes",
            "names",
        ]
        .iter()
        .map(|kind| format!("/t/{kind}/"))
        .collect();
        let mut grants = vec![("/t/", "READ")];
        grants.extend(writable.iter().map(|p| (p.as_str(), "READWRITE")));
        etcd.add_user_with("fleet", "fleet-pw-3319", &grants);
    });
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(etcd.endpoint(), &dir);
    o.user = Some(("fleet".into(), "fleet-pw-3319".into()));
    let s = EtcdStore::open(o, keys()).unwrap();
    assert!(
        s.wait_connected(Duration::from_secs(15)).await,
        "{:?}",
        s.status()
    );
    s.insert_binding(&binding("api")).await.unwrap();
    let outcome = tributary_store::HostOutcome {
        host: String::new(),
        state: tributary_store::HostState::Applied,
        at_ms: 1,
        generation: 1,
        servers: 1,
        message: None,
    };
    s.publish_host_outcome("api", &outcome).await.unwrap();
    // For two seconds the session stays connected.
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        let st = s.status();
        assert!(st.connected, "the session ended: {st:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The store still writes; the refused outcome is not pending any more.
    s.insert_binding(&binding("db")).await.unwrap();
    assert!(
        s.fleet_view("api").hosts.is_empty(),
        "{:?}",
        s.fleet_view("api")
    );
}
