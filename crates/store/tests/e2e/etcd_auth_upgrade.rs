//! The upgrade of a fleet to authenticated values and the retirement of a secrets key
//! (docs/fleet.md "Integrity" and "Rotation"), against a real 3-member etcd cluster with store
//! instances as hosts: values without a MAC (a fleet of before) are applied and written again
//! with one until the explicit step (`--etcd-require-integrity` on one host) makes every host
//! refuse them; a retired key's values are re-sealed once each, and nothing re-seals them back.

use std::time::{Duration, Instant};

use crate::common;
use common::{binding, host_with as host, until, Host};

use etcd_client::{Client, GetOptions};
use serde_json::{json, Value};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingRecord, BindingStore, SecretKeys};

const OLD_KEY: [u8; 32] = [61u8; 32];
const NEW_KEY: [u8; 32] = [62u8; 32];

async fn get(c: &mut Client, key: &str) -> Option<Value> {
    let r = c.get(key, None).await.unwrap();
    r.kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).unwrap())
}

/// A binding value as a daemon of before wrote it: config sealed `v1`, no MAC.
fn legacy_value(keys: &SecretKeys, name: &str, service: &str, version: i64) -> Vec<u8> {
    let config = serde_json::to_vec(&json!({"acl_token": "t0k3n"})).unwrap();
    serde_json::to_vec(&json!({
        "plugin": "consul",
        "provider": "consul",
        "service": service,
        "interval_secs": 30,
        "directives": [],
        "config": keys.seal(name, &config),
        "created_at_ms": 1,
        "updated_at_ms": version,
    }))
    .unwrap()
}

fn service(h: &Host, name: &str) -> Option<String> {
    h.store
        .get_binding(name)
        .unwrap()
        .map(|sb| sb.binding.service)
}

/// Every host in `hosts` has applied what was put under `prefix` before (a resolver claim put
/// after it reached each one).
async fn synced(c: &mut Client, prefix: &str, hosts: &[&Host], n: u32) {
    let name = format!("sync-{n}");
    c.put(format!("{prefix}resolvers/{name}"), "sync", None)
        .await
        .unwrap();
    for h in hosts {
        until(Duration::from_secs(10), "the hosts catch up", || {
            h.store.fleet_view(&name).resolver.as_deref() == Some("sync")
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_before_are_applied_and_signed_until_the_step_makes_every_host_refuse_them() {
    const P: &str = "/auth-upgrade/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = Client::connect(cluster.endpoints(), None).await.unwrap();
    let keys = || SecretKeys::from_bytes(&[&NEW_KEY]).unwrap();
    // A fleet of before: its binding has no MAC.
    raw.put(
        format!("{P}bindings/api"),
        legacy_value(&keys(), "api", "web", 10),
        None,
    )
    .await
    .unwrap();
    let a = host(&cluster, P, "host-a", keys(), false).await;
    let b = host(&cluster, P, "host-b", keys(), false).await;
    // Not a new fleet: no integrity key, and both hosts apply the value of before ...
    assert_eq!(get(&mut raw, &format!("{P}integrity")).await, None);
    for h in [&a, &b] {
        until(Duration::from_secs(10), "the binding of before", || {
            service(h, "api").as_deref() == Some("web")
        })
        .await;
    }
    // ... and the host rendezvous prefers for it writes it again with a MAC, same version.
    let mut signed = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while signed.is_none() && Instant::now() < deadline {
        signed = get(&mut raw, &format!("{P}bindings/api"))
            .await
            .filter(|v| v["mac"].is_string());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let signed = signed.expect("the value of before written again with a MAC");
    assert_eq!(signed["updated_at_ms"], 10);
    // Until the step, a value without a MAC is still applied (unauthenticated).
    raw.put(
        format!("{P}bindings/api"),
        legacy_value(&keys(), "api", "web-by-hand", 11),
        None,
    )
    .await
    .unwrap();
    synced(&mut raw, P, &[&a, &b], 1).await;
    assert_eq!(service(&a, "api").as_deref(), Some("web-by-hand"));

    // The step: B restarted with --etcd-require-integrity puts the fleet's integrity key.
    b.store.close().await;
    drop(b);
    let b = host(&cluster, P, "host-b", keys(), true).await;
    until(Duration::from_secs(10), "B reads the binding", || {
        b.store.get_binding("api").unwrap().is_some()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&mut raw, &format!("{P}integrity")).await.is_none() {
        assert!(Instant::now() < deadline, "no integrity key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The binding's config is sealed `v2` again by the host rendezvous prefers (its associated
    // data binds prefix, name and version), with a MAC.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = get(&mut raw, &format!("{P}bindings/api")).await.unwrap();
        if v["config"].as_str().unwrap().starts_with("v2:") && v["mac"].is_string() {
            assert_eq!(v["service"], "web-by-hand");
            break;
        }
        assert!(Instant::now() < deadline, "not sealed v2: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A (not restarted) and B refuse a value without a MAC from now on.
    let before = service(&a, "api");
    raw.put(
        format!("{P}bindings/api"),
        legacy_value(&keys(), "api", "web-forged", 99),
        None,
    )
    .await
    .unwrap();
    synced(&mut raw, P, &[&a, &b], 2).await;
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        assert_ne!(service(h, "api").as_deref(), Some("web-forged"), "{id}");
    }
    assert_eq!(service(&a, "api"), before);
    // The integrity key cannot be forged or undone by deleting it: a host remembers it.
    raw.delete(format!("{P}integrity"), None).await.unwrap();
    raw.put(
        format!("{P}bindings/api"),
        legacy_value(&keys(), "api", "web-forged-2", 100),
        None,
    )
    .await
    .unwrap();
    synced(&mut raw, P, &[&a, &b], 3).await;
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        assert_ne!(service(h, "api").as_deref(), Some("web-forged-2"), "{id}");
    }
}

/// The etcd versions of every binding key under `prefix`, summed (each write adds one), and
/// the key ids their configs are sealed with.
async fn bindings_state(c: &mut Client, prefix: &str) -> (i64, Vec<String>) {
    let r = c
        .get(
            format!("{prefix}bindings/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let ids = r
        .kvs()
        .iter()
        .map(|kv| {
            let v: Value = serde_json::from_slice(kv.value()).unwrap();
            SecretKeys::key_id_of(v["config"].as_str().unwrap())
                .unwrap()
                .to_string()
        })
        .collect();
    (r.kvs().iter().map(|kv| kv.version()).sum(), ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_key_is_resealed_once_per_binding_and_nothing_reseals_it_back() {
    const P: &str = "/auth-retire/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = Client::connect(cluster.endpoints(), None).await.unwrap();
    let both = || SecretKeys::from_bytes(&[&OLD_KEY, &NEW_KEY]).unwrap();
    let old_id = both().active_id().to_string();
    let a = host(&cluster, P, "host-a", both(), false).await;
    let b = host(&cluster, P, "host-b", both(), false).await;
    let list: Vec<BindingRecord> = (0..20)
        .map(|i| binding(&format!("b{i:02}"), "web"))
        .collect();
    a.store.upsert_bindings(&list).await.unwrap();
    until(Duration::from_secs(10), "B reads the 20 bindings", || {
        b.store.list_bindings().unwrap().len() == 20
    })
    .await;
    let (before, ids) = bindings_state(&mut raw, P).await;
    assert!(ids.iter().all(|id| *id == old_id), "{ids:?}");

    // B restarted with the new key first and the old one retired; A keeps `old,new`.
    b.store.close().await;
    drop(b);
    let retiring = SecretKeys::with_retired(&[&NEW_KEY], &[&OLD_KEY]).unwrap();
    let new_id = retiring.active_id().to_string();
    let b = host(&cluster, P, "host-b", retiring, false).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, ids) = bindings_state(&mut raw, P).await;
        if ids.iter().all(|id| *id == new_id) {
            break;
        }
        assert!(Instant::now() < deadline, "not re-sealed: {ids:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Once each, and nothing more (A does not re-seal them with its first key).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (after, ids) = bindings_state(&mut raw, P).await;
    println!("re-seal writes: {}", after - before);
    assert_eq!(after - before, 20, "one re-seal per binding");
    assert!(ids.iter().all(|id| *id == new_id), "{ids:?}");
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        assert_eq!(h.store.list_bindings().unwrap().len(), 20, "{id}");
    }
}
