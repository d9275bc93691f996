//! The resolver claim's guards against a real 3-member etcd cluster: a host that cannot
//! open a binding's newest version gives its claim up and cannot publish a set resolved from the
//! version it has; a set published under a claim of this host id but another lease is refused;
//! a host that stepped out is left out of the resolver choice.

use std::time::{Duration, Instant};

use crate::common;
use common::{binding, raw_client, target_set, until, Host, TTL};

use etcd_client::{Client, PutOptions};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingStore, StoreError};

const PREFIX: &str = "/claims-test/";
const OLD_KEY: [u8; 32] = [42u8; 32];
const NEW_KEY: [u8; 32] = [43u8; 32];

/// A store instance as host `id` under [`PREFIX`] with `keys` (the first seals), connected.
async fn host(cluster: &EtcdCluster, id: &str, keys: &[&[u8]]) -> Host {
    common::host(cluster, PREFIX, id, keys).await
}

/// The published set of `name` as etcd has it (not a mirror).
async fn targets_in_etcd(c: &mut Client, name: &str) -> Option<serde_json::Value> {
    let r = c
        .get(format!("{PREFIX}targets/{name}"), None)
        .await
        .unwrap();
    r.kvs()
        .first()
        .map(|kv| serde_json::from_slice(kv.value()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_cannot_open_the_newest_version_gives_its_claim_up_and_cannot_publish_the_old_one(
) {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    // A alone, with the old key: it saves the binding and holds its claim.
    let a = host(&cluster, "host-a", &[&OLD_KEY]).await;
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    let v1 = a.store.get_binding("api").unwrap().unwrap().updated_at_ms;
    assert!(a.store.claim_resolver("api").await.unwrap());
    a.store
        .publish_targets("api", &target_set(v1, "10.0.0.1"))
        .await
        .unwrap();

    // B seals with the new key (and opens both); it changes the binding: A cannot open the
    // new version and keeps the one it has.
    let b = host(&cluster, "host-b", &[&NEW_KEY, &OLD_KEY]).await;
    until(Duration::from_secs(10), "B reads the binding", || {
        b.store.get_binding("api").unwrap().is_some()
    })
    .await;
    // (B re-seals the binding with its key as soon as it reads it: a change racing that re-seal
    // loses once and is made again.)
    let mut tries = 0;
    while let Err(e) = b.store.upsert_bindings(&[binding("api", "web2")]).await {
        tries += 1;
        assert!(tries < 20 && matches!(e, StoreError::Conflict(_)), "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v2 = b.store.get_binding("api").unwrap().unwrap().updated_at_ms;
    assert_ne!(v1, v2);
    // A still holds v1 decoded (whether or not its watch has delivered v2 yet).
    assert_eq!(
        a.store.get_binding("api").unwrap().unwrap().updated_at_ms,
        v1
    );

    // A resolved v1 (it holds the claim): that set is not published, by A's store nor by etcd.
    let err = a
        .store
        .publish_targets("api", &target_set(v1, "10.0.0.2"))
        .await
        .expect_err("a set resolved from a version A cannot open was published");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let in_etcd = targets_in_etcd(&mut raw, "api").await.unwrap();
    assert_eq!(in_etcd["targets"][0]["address"], "10.0.0.1", "{in_etcd}");

    // Once A has seen the new version it gives its claim up (it cannot resolve the binding) and
    // B, which can, takes it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.store.claim_resolver("api").await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "A keeps the claim of a binding it cannot open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        a.store.get_binding("api").unwrap().unwrap().updated_at_ms,
        v1
    );
    until(Duration::from_secs(10), "B sees the claim free", || {
        b.store.fleet_view("api").resolver.is_none()
    })
    .await;
    assert!(b.store.claim_resolver("api").await.unwrap());
    b.store
        .publish_targets("api", &target_set(v2, "10.0.0.3"))
        .await
        .unwrap();
    // A never takes it back while B is live.
    until(Duration::from_secs(10), "A sees B's claim", || {
        a.store.fleet_view("api").resolver.as_deref() == Some("host-b")
    })
    .await;
    assert!(!a.store.claim_resolver("api").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_this_host_id_under_another_lease_does_not_let_this_host_publish() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    let a = host(&cluster, "host-a", &[&OLD_KEY]).await;
    a.store
        .insert_binding(&binding("api", "web"))
        .await
        .unwrap();
    let v1 = a.store.get_binding("api").unwrap().unwrap().updated_at_ms;

    // The claim is held under this host id by another session (another daemon started with the
    // same --host-id while etcd was unreachable, say): its lease is not A's.
    let other = raw.lease_grant(30, None).await.unwrap().id();
    raw.put(
        format!("{PREFIX}resolvers/api"),
        "host-a",
        Some(PutOptions::new().with_lease(other)),
    )
    .await
    .unwrap();
    until(Duration::from_secs(10), "A sees the claim", || {
        a.store.fleet_view("api").resolver.as_deref() == Some("host-a")
    })
    .await;
    // A does not resolve under a claim that is not its session's, and cannot publish.
    assert!(!a.store.claim_resolver("api").await.unwrap());
    let err = a
        .store
        .publish_targets("api", &target_set(v1, "10.0.0.9"))
        .await
        .expect_err("published under another session's claim");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(targets_in_etcd(&mut raw, "api").await, None);
    raw.lease_revoke(other).await.unwrap();
}

/// Creates bindings on `a` until one whose preferred resolver is `a` (it claims it at once);
/// that binding's name.
async fn preferred_by(a: &Host) -> String {
    for i in 0..40 {
        let n = format!("s{i}");
        a.store.insert_binding(&binding(&n, "web")).await.unwrap();
        if a.store.claim_resolver(&n).await.unwrap() {
            return n;
        }
    }
    panic!("A is preferred for none of 40 bindings");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stepped_out_is_left_out_until_it_steps_back_in() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    let a = host(&cluster, "host-a", &[&OLD_KEY]).await;
    let b = host(&cluster, "host-b", &[&OLD_KEY]).await;
    // A has seen B's heartbeat (its watch), so A's choice is between A and B.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Bindings until one whose preferred resolver is A: A claims it at once.
    let name = preferred_by(&a).await;
    until(Duration::from_secs(10), "B reads the binding", || {
        b.store.get_binding(&name).unwrap().is_some()
    })
    .await;

    // A's resolutions keep failing: it steps out. Its claim goes, its marker is in etcd under
    // its lease, and B, not preferred, takes the binding at once and keeps it.
    a.store
        .step_out(&name, "3 failed resolutions in a row")
        .await
        .unwrap();
    let marker = raw
        .get(format!("{PREFIX}unable-by-host/host-a/{name}"), None)
        .await
        .unwrap();
    assert_eq!(marker.kvs().len(), 1);
    assert_ne!(
        marker.kvs()[0].lease(),
        0,
        "the marker lives with A's lease"
    );
    until(Duration::from_secs(10), "B sees the step-out", || {
        b.store.fleet_view(&name).resolver.is_none()
    })
    .await;
    let mut took = false;
    for _ in 0..50 {
        if b.store.claim_resolver(&name).await.unwrap() {
            took = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(took, "B takes the binding A stepped out of");
    assert!(!a.store.claim_resolver(&name).await.unwrap());
    // Past a lease TTL B would hand a binding back to its preferred host; not to one that
    // stepped out.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    assert!(b.store.claim_resolver(&name).await.unwrap());

    // A steps back in: B hands the binding over once A has been live for a TTL (as ever).
    a.store.step_in(&name).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if !b.store.claim_resolver(&name).await.unwrap()
            && a.store.claim_resolver(&name).await.unwrap()
        {
            break;
        }
        assert!(Instant::now() < deadline, "A did not get the binding back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stepped_out_stays_out_when_its_lease_is_lost() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let mut raw = raw_client(&cluster).await;
    let a = host(&cluster, "host-a", &[&OLD_KEY]).await;
    let b = host(&cluster, "host-b", &[&OLD_KEY]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let name = preferred_by(&a).await;
    a.store
        .step_out(&name, "3 failed resolutions in a row")
        .await
        .unwrap();
    let key = format!("{PREFIX}unable-by-host/host-a/{name}");
    let first = raw.get(key.as_str(), None).await.unwrap().kvs()[0].lease();

    // A's lease is lost (revoked here; an overloaded host misses its keep-alives the same way):
    // the marker goes with it. A's next session puts it again under its new lease.
    raw.lease_revoke(first).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = raw.get(key.as_str(), None).await.unwrap();
        if r.kvs()
            .first()
            .is_some_and(|kv| kv.lease() != first && kv.lease() != 0)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A's step-out marker is not back under a new lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past a TTL of A's new session B would hand a binding back to its preferred host; A
    // stepped out, so B keeps it and A cannot take it.
    tokio::time::sleep(TTL * 2).await;
    assert!(!a.store.claim_resolver(&name).await.unwrap());
    assert!(b.store.claim_resolver(&name).await.unwrap());
}
