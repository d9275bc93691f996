//! The etcd store's transactions and session against real etcd (what was left of
//! "Correctness" and "Scale"): a save of many bindings is sized by bytes, not by a binding count;
//! a session held up for longer than the lease TTL keeps its lease and its claims; a
//! refusal of the host's etcd user is said as what it is, not as "unreachable".

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use common::{binding, host, raw_client, until, TTL};

use etcd_client::{EventType, GetOptions, WatchOptions};
use tributary_fakes::etcd::Etcd;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{
    BindingRecord, BindingStore, EtcdOptions, EtcdStore, SecretKeys, StoreError, StoreEvent, Upsert,
};

const KEY: [u8; 32] = [71u8; 32];
/// etcd's default `--max-request-bytes`.
const ETCD_MAX_REQUEST: usize = 1536 * 1024;

/// A binding whose config holds a CA bundle of `kib` KiB (a provider reached over TLS with its
/// own CA: tens of KiB are common).
fn with_bundle(name: &str, kib: usize) -> BindingRecord {
    let mut b = binding(name, "web");
    let pem: String = (0..kib * 1024)
        .map(|i| (b'A' + (i * 7 % 26) as u8) as char)
        .collect();
    b.config
        .insert("ca_bundle".into(), serde_json::Value::String(pem));
    b
}

/// 80 bindings of a 24 KiB bundle each are about 2.5 MiB stored: before, the first transaction
/// (60 of them, ≈ 1.9 MiB) was larger than etcd takes in one request, and the save failed with
/// "request is too large" against etcd's defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_of_bindings_larger_in_all_than_one_etcd_request_is_saved_whole() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let a = host(&cluster, "/txn/", "host-a", &[&KEY]).await;
    let b = host(&cluster, "/txn/", "host-b", &[&KEY]).await;
    let list: Vec<BindingRecord> = (0..80)
        .map(|i| with_bundle(&format!("big-{i:03}"), 24))
        .collect();
    let r = a
        .store
        .upsert_bindings(&list)
        .await
        .unwrap_or_else(|e| panic!("the save failed: {e}"));
    assert_eq!(r, vec![Upsert::Created; list.len()]);

    // etcd holds every one, more than one request's worth in all.
    let mut c = raw_client(&cluster).await;
    let stored = c
        .get("/txn/bindings/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(stored.kvs().len(), list.len());
    let total: usize = stored.kvs().iter().map(|kv| kv.value().len()).sum();
    assert!(total > ETCD_MAX_REQUEST, "stored {total} bytes");
    eprintln!(
        "{} bindings saved in one save: {total} bytes stored",
        list.len()
    );

    // The other host has them, bundles intact.
    until(Duration::from_secs(15), "host-b has every binding", || {
        b.store.list_bindings().unwrap().len() == list.len()
    })
    .await;
    let last = b.store.get_binding("big-079").unwrap().unwrap();
    assert_eq!(last.binding, list[79]);

    // An update of every one (one compare and one put each) is saved whole too.
    let changed: Vec<BindingRecord> = list
        .iter()
        .map(|x| {
            let mut x = x.clone();
            x.service = "web-v2".into();
            x
        })
        .collect();
    let r = a
        .store
        .upsert_bindings(&changed)
        .await
        .unwrap_or_else(|e| panic!("the update failed: {e}"));
    assert_eq!(r, vec![Upsert::Updated; list.len()]);
    until(Duration::from_secs(15), "host-b has every update", || {
        b.store
            .list_bindings()
            .unwrap()
            .iter()
            .all(|sb| sb.binding.service == "web-v2")
    })
    .await;
}

/// The session is held up for longer than the lease TTL while another host changes a binding:
/// every worker of the runtime its tasks run on is blocked for 3 TTLs (as tasks stuck on a slow
/// disk or a busy engine would block them), while tasks read the store as the daemon's engine
/// does: the lease is kept alive all along (a thread and runtime of its own, `lease.rs`), so the
/// host's heartbeat and resolver claims are never deleted by etcd, are held under the same lease
/// afterwards, and the session goes on with the change. (Before, the keep-alive was a task of the
/// runtime whose workers were all blocked: etcd deleted the heartbeat and the claims when the TTL
/// ran out. The session's loop no longer waits on the mirror's SQLite write at all, which is how
/// this test held it up before: `mirror_file.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_longer_than_the_lease_ttl_keeps_the_lease_and_the_claims() {
    const P: &str = "/slow/";
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    let mirror = dir.path().join("host-a.db");
    let mut opts = EtcdOptions::new(cluster.endpoints(), P, "host-a", &mirror);
    opts.lease_ttl = TTL;
    opts.op_timeout = Duration::from_secs(2);
    opts.providers = Some(vec!["consul/consul".into()]);
    let a = Arc::new(EtcdStore::open(opts, SecretKeys::from_bytes(&[&KEY]).unwrap()).unwrap());
    assert!(a.wait_connected(Duration::from_secs(15)).await);
    let b = host(&cluster, P, "host-b", &[&KEY]).await;

    let names: Vec<String> = (0..10).map(|i| format!("svc-{i}")).collect();
    let list: Vec<BindingRecord> = names.iter().map(|n| binding(n, "web")).collect();
    b.store.upsert_bindings(&list).await.unwrap();
    until(Duration::from_secs(10), "host-a has the bindings", || {
        a.list_bindings().unwrap().len() == names.len()
    })
    .await;
    // The bindings host-a resolves (the others are host-b's choice).
    let mut mine = Vec::new();
    for n in &names {
        if a.claim_resolver(n).await.unwrap() {
            mine.push(n.clone());
        }
    }
    assert!(!mine.is_empty(), "host-a resolves none of {names:?}");
    let mut c = raw_client(&cluster).await;
    let lease_of = |r: etcd_client::GetResponse| r.kvs().first().map(|kv| kv.lease());
    let heartbeat = format!("{P}hosts/host-a");
    let lease = lease_of(c.get(heartbeat.clone(), None).await.unwrap()).unwrap();
    assert_ne!(lease, 0);

    // Every deletion of a resolver claim or of host-a's heartbeat (a lease that expired).
    let deleted = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let mut stream = c
        .watch(P, Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let d = deleted.clone();
    let hb = heartbeat.clone();
    let watching = tokio::spawn(async move {
        while let Ok(Some(r)) = stream.message().await {
            for e in r.events() {
                let key = e.kv().map(|kv| kv.key_str().unwrap_or("").to_string());
                let key = key.unwrap_or_default();
                if e.event_type() == EventType::Delete
                    && (key.starts_with(&format!("{P}resolvers/")) || key == hb)
                {
                    d.lock().unwrap().push((key, Instant::now()));
                }
            }
        }
    });
    // When the session ended and when it was connected again (the store's status events).
    let mut events = a.subscribe();
    let statuses = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let s = statuses.clone();
    let status_events = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            if matches!(e, StoreEvent::Status) {
                s.lock().unwrap().push(Instant::now());
            }
        }
    });

    // Readers of the store, as the engine's tasks are (fleet view, published sets, claims).
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let a = a.clone();
            let n = names[0].clone();
            tokio::spawn(async move {
                loop {
                    let _ = a.fleet_view(&n);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    let locked = Instant::now();
    let mut changed = list[0].clone();
    changed.service = "web-v2".into();
    b.store.upsert_bindings(&[changed]).await.unwrap();
    // Both workers of this runtime (the store's session, its watch and every reader run on it)
    // blocked at once for 3 TTLs: the barrier lets neither blocker start alone.
    let both = Arc::new(std::sync::Barrier::new(2));
    let blockers: Vec<_> = (0..2)
        .map(|_| {
            let both = both.clone();
            tokio::spawn(async move {
                both.wait();
                std::thread::sleep(TTL * 3);
            })
        })
        .collect();
    for blocker in blockers {
        blocker.await.unwrap();
    }
    let released = Instant::now();
    assert!(released - locked > TTL * 3);
    until(Duration::from_secs(10), "host-a applies the change", || {
        a.get_binding(&names[0]).unwrap().unwrap().binding.service == "web-v2"
    })
    .await;
    until(Duration::from_secs(10), "host-a is connected", || {
        a.status().connected
    })
    .await;
    let times = statuses.lock().unwrap().clone();

    // The lease lived through it: nothing was deleted, the same lease holds the heartbeat and
    // every claim, and host-a still resolves every binding.
    tokio::time::sleep(TTL).await;
    let deleted: Vec<(String, Duration)> = deleted
        .lock()
        .unwrap()
        .iter()
        .map(|(k, t)| (k.clone(), t.saturating_duration_since(locked)))
        .collect();
    assert!(
        deleted.is_empty(),
        "deleted (key, time after the lock): {deleted:?}; status events after the lock: {:?}",
        times
            .iter()
            .map(|t| t.saturating_duration_since(locked))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        lease_of(c.get(heartbeat.clone(), None).await.unwrap()),
        Some(lease)
    );
    for n in &mine {
        let claim = lease_of(c.get(format!("{P}resolvers/{n}"), None).await.unwrap());
        assert_eq!(claim, Some(lease), "the claim of {n}");
        assert_eq!(a.fleet_view(n).resolver.as_deref(), Some("host-a"), "{n}");
    }
    watching.abort();
    readers.iter().for_each(|r| r.abort());
    status_events.abort();
    a.close().await;
}

fn opts(etcd: &Etcd, dir: &tempfile::TempDir, id: &str, user: &str, pw: &str) -> EtcdOptions {
    let mut o = EtcdOptions::new(
        vec![etcd.endpoint()],
        "/t/",
        id,
        &dir.path().join(format!("{id}.db")),
    );
    o.op_timeout = Duration::from_secs(2);
    o.user = Some((user.into(), pw.into()));
    o
}

/// A host whose etcd user may read the prefix and write what a host writes (heartbeat, markers,
/// claims, sets, outcomes) but not bindings (no editor role, docs/fleet.md "Per-host etcd
/// permissions"): a save, a change and a removal through it are refused as what they are, naming
/// the user and the keys (before: "store ... is unreachable", 503), nothing is written, and its
/// session stays connected. A wrong password is said as such too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_refusal_is_said_as_such_not_as_unreachable() {
    let mut etcd = tokio::task::block_in_place(Etcd::start);
    tokio::task::block_in_place(|| {
        etcd.enable_auth("root-pw-3318");
        etcd.add_user_with(
            "host-b",
            "host-b-pw-2291",
            &[
                ("/t/", "READ"),
                ("/t/hosts/host-b", "READWRITE"),
                ("/t/writes/host-b/", "READWRITE"),
                ("/t/resolvers/", "READWRITE"),
                ("/t/targets/", "READWRITE"),
                ("/t/outcomes-by-host/host-b/", "READWRITE"),
                ("/t/unable-by-host/host-b/", "READWRITE"),
            ],
        );
    });
    let keys = || SecretKeys::from_bytes(&[&KEY]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = EtcdStore::open(opts(&etcd, &dir, "host-a", "root", "root-pw-3318"), keys()).unwrap();
    assert!(a.wait_connected(Duration::from_secs(15)).await);
    a.insert_binding(&binding("api", "web")).await.unwrap();

    let b = EtcdStore::open(
        opts(&etcd, &dir, "host-b", "host-b", "host-b-pw-2291"),
        keys(),
    )
    .unwrap();
    assert!(
        b.wait_connected(Duration::from_secs(15)).await,
        "{:?}",
        b.status()
    );
    until(Duration::from_secs(10), "host-b has api", || {
        b.get_binding("api").unwrap().is_some()
    })
    .await;

    let denied = |e: StoreError, key: &str| {
        let text = e.to_string();
        assert!(
            matches!(e, StoreError::PermissionDenied { .. }),
            "{e:?}: {text}"
        );
        assert!(!text.contains("unreachable"), "{text}");
        assert!(
            text.contains("etcd user \"host-b\" has no permission for"),
            "{text}"
        );
        assert!(text.contains(key), "{text}");
        assert!(text.contains("permission denied"), "{text}");
        assert!(!text.contains("host-b-pw-2291"), "{text}");
    };
    denied(
        b.insert_binding(&binding("web", "web")).await.unwrap_err(),
        "/t/bindings/web",
    );
    let mut changed = binding("api", "changed");
    changed.interval_secs = 60;
    denied(
        b.upsert_bindings(&[changed, binding("db", "db")])
            .await
            .unwrap_err(),
        "api, db",
    );
    denied(
        b.remove_binding("api").await.unwrap_err(),
        "/t/bindings/api",
    );
    // Nothing was written, and the refusals did not end the session.
    let bindings: Vec<(String, String)> = a
        .list_bindings()
        .unwrap()
        .into_iter()
        .map(|sb| (sb.binding.name, sb.binding.service))
        .collect();
    assert_eq!(bindings, vec![("api".to_string(), "web".to_string())]);
    assert!(b.status().connected, "{:?}", b.status());

    // A wrong password: the session never connects, and a write says why.
    let c = EtcdStore::open(
        opts(&etcd, &dir, "host-c", "host-b", "wrong-pw-5120"),
        keys(),
    )
    .unwrap();
    until(
        Duration::from_secs(10),
        "host-c's first session fails",
        || {
            c.status()
                .last_error
                .is_some_and(|e| e != "not connected yet")
        },
    )
    .await;
    let e = c.insert_binding(&binding("web", "web")).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, StoreError::AuthFailed { .. }), "{e:?}: {text}");
    assert!(
        text.contains("did not accept etcd user \"host-b\""),
        "{text}"
    );
    assert!(text.contains("authentication failed"), "{text}");
    assert!(
        !text.contains("unreachable") && !text.contains("wrong-pw-5120"),
        "{text}"
    );
    c.close().await;
    b.close().await;
    a.close().await;
}
