//! What every host applies is authenticated ("Integrity and secrets"), against a real
//! 3-member etcd cluster with store instances as hosts: a target set or binding value put by
//! anyone who can write the prefix (forged, altered, copied from another prefix, or an older
//! value put back) is applied by no host, and each host reports it in its outcome of the
//! binding; hosts holding the secrets keys in different orders do not re-seal each other's
//! writes (docs/fleet.md, "Integrity" and "Rotation").

use std::time::{Duration, Instant};

use crate::common;
use common::{binding, host, raw_client, target_set, until, Host, TTL};
use tributary_base::now_ms;

use etcd_client::{Client, GetOptions};
use serde_json::Value;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingRecord, BindingStore, TargetSet};

const KEY: [u8; 32] = [51u8; 32];
const OLD_KEY: [u8; 32] = [52u8; 32];
const NEW_KEY: [u8; 32] = [53u8; 32];

async fn get(c: &mut Client, key: &str) -> Option<Vec<u8>> {
    let r = c.get(key, None).await.unwrap();
    r.kvs().first().map(|kv| kv.value().to_vec())
}

/// Waits (at most 10 s) for the fleet's integrity key: a new fleet puts it when its first host
/// starts. The hosts then refuse values without a MAC.
async fn integrity_key(c: &mut Client, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(c, &format!("{prefix}integrity")).await.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Returns once every host in `hosts` has applied everything put under `prefix` before: a key
/// put after it (a resolver claim of a binding nobody has, which every mirror applies as is)
/// reached each one (a watch delivers in revision order).
async fn synced(c: &mut Client, prefix: &str, hosts: &[&Host]) {
    let name = format!("sync-{}", now_ms());
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

/// Host `host`'s outcome of `name` as etcd holds it, once it is `failed`, names `what` and was
/// made at `since_ms` or later (at most 5 s).
async fn reported(
    c: &mut Client,
    prefix: &str,
    name: &str,
    host: &str,
    what: &str,
    since_ms: i64,
) -> Value {
    let key = format!("{prefix}outcomes-by-host/{host}/{name}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = get(c, &key)
            .await
            .map(|v| serde_json::from_slice::<Value>(&v).unwrap());
        if let Some(v) = &v {
            if v["state"] == "failed"
                && v["message"].as_str().unwrap_or("").contains(what)
                && v["at_ms"].as_i64().unwrap_or(0) >= since_ms
            {
                return v.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{host} did not report {what:?} for {name}: its outcome is {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The host that takes the claim of `name` (the preferred one at once, any after a TTL).
async fn resolver<'h>(hosts: &[&'h Host], name: &str) -> &'h Host {
    let deadline = Instant::now() + TTL * 5;
    loop {
        for h in hosts {
            if h.store.claim_resolver(name).await.unwrap() {
                return h;
            }
        }
        assert!(Instant::now() < deadline, "nobody took the claim of {name}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn address(set: Option<TargetSet>) -> Option<String> {
    set.and_then(|s| {
        s.targets
            .first()
            .map(|t| t["address"].as_str().unwrap().to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_altered_target_set_is_applied_by_no_host_and_each_reports_it() {
    const P: &str = "/auth-targets/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    let a = host(&cluster, P, "host-a", &[&KEY]).await;
    let b = host(&cluster, P, "host-b", &[&KEY]).await;
    integrity_key(&mut raw, P).await;
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    let v1 = a.store.get_binding("api").unwrap().unwrap().updated_at_ms;
    until(Duration::from_secs(10), "B reads the binding", || {
        b.store.get_binding("api").unwrap().is_some()
    })
    .await;
    let r = resolver(&[&a, &b], "api").await;
    r.store
        .publish_targets("api", &target_set(v1, "10.0.0.1"))
        .await
        .unwrap();
    until(Duration::from_secs(10), "B has the set", || {
        address(b.store.published_targets("api")).as_deref() == Some("10.0.0.1")
    })
    .await;
    let generation = b.store.published_targets("api").unwrap().generation;

    // Someone who can write the prefix points the binding elsewhere: the published set with the
    // right binding version and another address, without its MAC ...
    let key = format!("{P}targets/api");
    let genuine_raw = get(&mut raw, &key).await.unwrap();
    let genuine: Value = serde_json::from_slice(&genuine_raw).unwrap();
    let mut forged = genuine.clone();
    forged["targets"][0]["address"] = "203.0.113.9".into();
    forged.as_object_mut().unwrap().remove("mac");
    let t0 = now_ms();
    raw.put(key.as_str(), serde_json::to_vec(&forged).unwrap(), None)
        .await
        .unwrap();
    synced(&mut raw, P, &[&a, &b]).await;
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        assert_eq!(
            address(h.store.published_targets("api")).as_deref(),
            Some("10.0.0.1"),
            "{id} took a forged set"
        );
    }
    for h in ["host-a", "host-b"] {
        let o = reported(&mut raw, P, "api", h, "it has no MAC", t0).await;
        let msg = o["message"].as_str().unwrap();
        assert!(msg.contains(&key), "{h}: the report names the key: {msg}");
    }
    // ... or the genuine value with one byte of the address changed (its MAC kept).
    let altered = String::from_utf8(genuine_raw)
        .unwrap()
        .replace("10.0.0.1", "10.0.0.9");
    assert!(
        altered.ends_with("\"}"),
        "the MAC is the last member: {altered}"
    );
    let t1 = now_ms();
    raw.put(key.as_str(), altered.into_bytes(), None)
        .await
        .unwrap();
    synced(&mut raw, P, &[&a, &b]).await;
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        let set = h.store.published_targets("api");
        assert_eq!(
            address(set.clone()).as_deref(),
            Some("10.0.0.1"),
            "{id} took a set nobody holding the key published"
        );
        assert_eq!(set.unwrap().generation, generation, "{id}");
    }
    for h in ["host-a", "host-b"] {
        reported(&mut raw, P, "api", h, "MAC verification failed", t1).await;
    }

    // The resolver publishes over it at its next run, even with the same targets: every host has
    // a set it can verify again.
    r.store
        .publish_targets("api", &target_set(v1, "10.0.0.1"))
        .await
        .unwrap();
    until(
        Duration::from_secs(10),
        "B applies the genuine set again",
        || {
            b.store
                .published_targets("api")
                .is_some_and(|s| s.generation > generation)
        },
    )
    .await;
    let now: Value = serde_json::from_slice(&get(&mut raw, &key).await.unwrap()).unwrap();
    assert_eq!(now["targets"][0]["address"], "10.0.0.1");
    assert!(now["mac"].is_string(), "{now}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_binding_copied_to_another_prefix_is_refused() {
    const P: &str = "/auth-prod/";
    const Q: &str = "/auth-staging/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    // Two fleets sharing one secrets key (prod and staging, say).
    let a = host(&cluster, P, "host-a", &[&KEY]).await;
    let s = host(&cluster, Q, "host-s", &[&KEY]).await;
    integrity_key(&mut raw, P).await;
    integrity_key(&mut raw, Q).await;
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    let first = get(&mut raw, &format!("{P}bindings/api")).await.unwrap();
    let t0 = now_ms();
    raw.put(format!("{Q}bindings/api"), first, None)
        .await
        .unwrap();
    synced(&mut raw, Q, &[&s]).await;
    assert!(
        s.store.get_binding("api").unwrap().is_none(),
        "host-s took a binding copied from another prefix"
    );
    reported(&mut raw, Q, "api", "host-s", "MAC verification failed", t0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_binding_value_put_back_or_an_altered_one_is_refused() {
    const P: &str = "/auth-replay/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    let a = host(&cluster, P, "host-a", &[&KEY]).await;
    let b = host(&cluster, P, "host-b", &[&KEY]).await;
    integrity_key(&mut raw, P).await;
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    until(Duration::from_secs(10), "B reads the binding", || {
        b.store.get_binding("api").unwrap().is_some()
    })
    .await;
    let first = get(&mut raw, &format!("{P}bindings/api")).await.unwrap();

    // Changed on A; the first value put back: every host keeps the change.
    a.store
        .upsert_bindings(&[binding("api", "web-v2")])
        .await
        .unwrap();
    until(Duration::from_secs(10), "B reads the change", || {
        b.store
            .get_binding("api")
            .unwrap()
            .is_some_and(|sb| sb.binding.service == "web-v2")
    })
    .await;
    let current = get(&mut raw, &format!("{P}bindings/api")).await.unwrap();
    let t1 = now_ms();
    raw.put(format!("{P}bindings/api"), first.clone(), None)
        .await
        .unwrap();
    synced(&mut raw, P, &[&a, &b]).await;
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        assert_eq!(
            h.store.get_binding("api").unwrap().unwrap().binding.service,
            "web-v2",
            "{id} went back to a replayed version"
        );
    }
    for h in ["host-a", "host-b"] {
        reported(&mut raw, P, "api", h, "MAC verification failed", t1).await;
    }

    // The current value with a server added to its directives (MAC kept, or dropped): refused.
    let mut v: Value = serde_json::from_slice(&current).unwrap();
    v["directives"] = serde_json::json!(["server 203.0.113.9:443;"]);
    for strip in [false, true] {
        let mut forged = v.clone();
        if strip {
            forged.as_object_mut().unwrap().remove("mac");
        }
        let t = now_ms();
        raw.put(
            format!("{P}bindings/api"),
            serde_json::to_vec(&forged).unwrap(),
            None,
        )
        .await
        .unwrap();
        synced(&mut raw, P, &[&a, &b]).await;
        for (id, h) in [("host-a", &a), ("host-b", &b)] {
            let sb = h.store.get_binding("api").unwrap().unwrap();
            assert!(
                sb.binding.directives.is_empty() && sb.binding.service == "web-v2",
                "{id} took a forged binding (MAC stripped: {strip}): {:?}",
                sb.binding.directives
            );
        }
        for h in ["host-a", "host-b"] {
            reported(&mut raw, P, "api", h, "refused", t).await;
        }
    }
}

/// The sum of the etcd versions of every binding key under `prefix`: each write adds one.
async fn binding_writes(c: &mut Client, prefix: &str) -> i64 {
    let r = c
        .get(
            format!("{prefix}bindings/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    r.kvs().iter().map(|kv| kv.version()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_holding_the_keys_in_different_orders_do_not_reseal_each_others_writes() {
    const P: &str = "/auth-rotation/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    let a = host(&cluster, P, "host-a", &[&OLD_KEY, &NEW_KEY]).await;
    let b = host(&cluster, P, "host-b", &[&OLD_KEY, &NEW_KEY]).await;
    let list: Vec<BindingRecord> = (0..20)
        .map(|i| binding(&format!("b{i:02}"), "web"))
        .collect();
    a.store.upsert_bindings(&list).await.unwrap();
    until(Duration::from_secs(10), "B reads the 20 bindings", || {
        b.store.list_bindings().unwrap().len() == 20
    })
    .await;

    // B restarted with the keys the other way round (new first), as step 2 of a rotation.
    b.store.close().await;
    drop(b);
    let b = host(&cluster, P, "host-b", &[&NEW_KEY, &OLD_KEY]).await;
    until(
        Duration::from_secs(10),
        "B reads the 20 bindings again",
        || b.store.list_bindings().unwrap().len() == 20,
    )
    .await;
    // A change saved on B (sealed with the new key) reaches A, which keeps the old key first.
    // (A save that meets a concurrent re-seal of the same binding is refused: tried again.)
    let mut saved = Err(None);
    for _ in 0..20 {
        match b.store.upsert_bindings(&[binding("b00", "web-v2")]).await {
            Ok(_) => {
                saved = Ok(());
                break;
            }
            Err(e) => saved = Err(Some(e.to_string())),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = binding_writes(&mut raw, P).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let writes = binding_writes(&mut raw, P).await - before;
    println!("re-seal writes in 30 s: {writes}");
    assert!(
        writes <= 20,
        "{writes} re-seal writes in 30 s for 20 bindings (the hosts re-seal each other's writes)"
    );
    assert_eq!(saved, Ok(()), "the change on B");
    for (id, h) in [("host-a", &a), ("host-b", &b)] {
        let l = h.store.list_bindings().unwrap();
        assert_eq!(l.len(), 20, "{id}");
        assert!(
            l.iter()
                .any(|sb| sb.binding.name == "b00" && sb.binding.service == "web-v2"),
            "{id} has the change"
        );
    }
}
