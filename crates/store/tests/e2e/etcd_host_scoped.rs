//! Host-scoped outcome keys (issue 22; `docs/fleet.md`, "Key layout", "Per-host etcd
//! permissions", "Rolling upgrade of the key layout"), against a real etcd: a host writes its
//! outcomes and `unable` markers under `P/outcomes-by-host/HOST/` and `P/unable-by-host/HOST/`,
//! so its etcd user can be limited to its own keys; keys of the old layout
//! (`P/outcomes/NAME/HOST`, daemons of before) are read, and a host deletes its own once; a
//! refusal of `fleet forget-host` names the etcd user instead of saying "unreachable".

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::{blocking, until};

use etcd_client::{Client, ConnectOptions, GetOptions};
use tributary_fakes::etcd::Etcd;
use tributary_store::{
    BindingRecord, BindingStore, EtcdOptions, EtcdStore, HostOutcome, HostState, SecretKeys,
    StoreError, TargetSet,
};

const KEY: [u8; 32] = [29u8; 32];

fn binding(name: &str) -> BindingRecord {
    BindingRecord {
        name: name.to_string(),
        plugin: "static".into(),
        provider: "static".into(),
        config: BTreeMap::from([("targets".to_string(), serde_json::json!("127.0.0.1:80"))]),
        service: "web".into(),
        interval_secs: 30,
        directives: vec![],
        drain_secs: 0,
        probe: None,
    }
}

fn outcome(state: HostState, generation: i64) -> HostOutcome {
    HostOutcome {
        host: String::new(),
        state,
        at_ms: 1,
        generation,
        servers: 1,
        message: None,
    }
}

/// A store instance as host `id` on `etcd` under `/t/`, as etcd user `user` (none: auth off).
async fn open(
    etcd: &Etcd,
    dir: &tempfile::TempDir,
    id: &str,
    user: Option<(&str, &str)>,
) -> EtcdStore {
    let mut o = EtcdOptions::new(
        vec![etcd.endpoint()],
        "/t/",
        id,
        &dir.path().join(format!("{id}.db")),
    );
    o.op_timeout = Duration::from_secs(2);
    o.lease_ttl = Duration::from_secs(2);
    o.user = user.map(|(u, p)| (u.to_string(), p.to_string()));
    let s = EtcdStore::open(o, SecretKeys::from_bytes(&[&KEY]).unwrap()).unwrap();
    assert!(
        s.wait_connected(Duration::from_secs(15)).await,
        "{id}: {:?}",
        s.status()
    );
    s
}

/// What a host's etcd user is granted (docs/fleet.md, "Per-host etcd permissions"): read the
/// whole prefix; write its heartbeat, its writes' markers, the claims and sets (any host may
/// resolve any binding), and its own outcomes and markers, each prefix ending with `/`.
fn host_grants(host: &str) -> Vec<(String, &'static str)> {
    vec![
        ("/t/".into(), "READ"),
        (format!("/t/hosts/{host}"), "READWRITE"),
        (format!("/t/writes/{host}/"), "READWRITE"),
        ("/t/resolvers/".into(), "READWRITE"),
        ("/t/targets/".into(), "READWRITE"),
        (format!("/t/outcomes-by-host/{host}/"), "READWRITE"),
        (format!("/t/unable-by-host/{host}/"), "READWRITE"),
    ]
}

/// The editor role: hosts through which people save bindings.
const EDITOR: [(&str, &str); 2] = [("/t/bindings/", "READWRITE"), ("/t/names/", "READWRITE")];

fn add_user(etcd: &Etcd, user: &str, password: &str, extra: &[(&str, &str)]) {
    let mut grants = host_grants(user);
    grants.extend(extra.iter().map(|(p, m)| (p.to_string(), *m)));
    let grants: Vec<(&str, &str)> = grants.iter().map(|(p, m)| (p.as_str(), *m)).collect();
    etcd.add_user_with(user, password, &grants);
}

async fn client(etcd: &Etcd, user: Option<(&str, &str)>) -> Client {
    let opts = user.map(|(u, p)| ConnectOptions::new().with_user(u, p));
    Client::connect([etcd.endpoint()], opts).await.unwrap()
}

/// The keys under `prefix` in etcd now.
async fn keys_under(c: &mut Client, prefix: &str) -> Vec<String> {
    c.get(
        prefix,
        Some(GetOptions::new().with_prefix().with_keys_only()),
    )
    .await
    .unwrap()
    .kvs()
    .iter()
    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
    .collect()
}

/// `(host, state)` of every host in `viewer`'s fleet view of `name`, the outcomes read from
/// etcd now (`all`: every binding's, as the binding list does; else this binding's).
fn view(viewer: &EtcdStore, name: &str, all: bool) -> Vec<(String, HostState)> {
    blocking(|| {
        tokio::runtime::Handle::current().block_on(viewer.refresh_fleet(if all {
            None
        } else {
            Some(name)
        }))
    });
    viewer
        .fleet_view(name)
        .hosts
        .into_iter()
        .map(|h| (h.outcome.host, h.outcome.state))
        .collect()
}

/// (a) With etcd auth on, hosts whose users may write only their own outcome and marker
/// prefixes (and the claims and sets), plus the editor role for host-a, run normally: host-b
/// gets the binding, one of them resolves it and publishes a set, both apply it and publish
/// their outcome, each outcome is in the other host's view, a step-out marker is written and
/// deleted, and after the binding's removal each host deleted its own outcome. host-b's user is
/// refused writing host-a's outcome or marker, an old-layout outcome, and the outcome of a host
/// whose id starts with its own (`host-b2`: the grants end with `/`). Before, outcomes were
/// `P/outcomes/NAME/HOST`: these users could not write them (dropped), and no view showed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_limited_to_its_own_prefixes_runs_and_cannot_write_another_hosts_outcome() {
    let mut etcd = blocking(Etcd::start);
    blocking(|| {
        etcd.enable_auth("root-pw-6120");
        add_user(&etcd, "host-a", "pw-a-4410", &EDITOR);
        add_user(&etcd, "host-b", "pw-b-9023", &[]);
    });
    let dir = tempfile::tempdir().unwrap();
    let a = open(&etcd, &dir, "host-a", Some(("host-a", "pw-a-4410"))).await;
    let b = open(&etcd, &dir, "host-b", Some(("host-b", "pw-b-9023"))).await;
    let mut root = client(&etcd, Some(("root", "root-pw-6120"))).await;

    a.insert_binding(&binding("api")).await.unwrap();
    until(Duration::from_secs(10), "host-b has api", || {
        b.get_binding("api").unwrap().is_some()
    })
    .await;
    // The preferred host claims at once, the other once the binding stayed unclaimed a TTL.
    let deadline = Instant::now() + Duration::from_secs(10);
    let resolver = loop {
        if a.claim_resolver("api").await.unwrap() {
            break &a;
        }
        if b.claim_resolver("api").await.unwrap() {
            break &b;
        }
        assert!(Instant::now() < deadline, "nobody took api's claim");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let updated = resolver.get_binding("api").unwrap().unwrap().updated_at_ms;
    let set = TargetSet {
        resolved_by: String::new(),
        at_ms: 1,
        binding_updated_at_ms: updated,
        targets: vec![serde_json::json!({"address": "10.0.0.7", "port": 80, "weight": 1})],
        dropped: vec![],
        ttl_seconds: None,
        generation: 0,
    };
    resolver.publish_targets("api", &set).await.unwrap();
    for s in [&a, &b] {
        until(
            Duration::from_secs(10),
            "the set reaches both hosts",
            || s.published_targets("api").is_some(),
        )
        .await;
        let generation = s.published_targets("api").unwrap().generation;
        s.publish_host_outcome("api", &outcome(HostState::Applied, generation))
            .await
            .unwrap();
    }
    for (viewer, other) in [(&a, "host-b"), (&b, "host-a")] {
        until(
            Duration::from_secs(10),
            &format!("{other}'s outcome in the other host's view"),
            || view(viewer, "api", false).contains(&(other.to_string(), HostState::Applied)),
        )
        .await;
    }
    let outcomes = keys_under(&mut root, "/t/outcomes-by-host/").await;
    assert_eq!(
        outcomes,
        vec![
            "/t/outcomes-by-host/host-a/api".to_string(),
            "/t/outcomes-by-host/host-b/api".to_string()
        ]
    );
    assert!(keys_under(&mut root, "/t/outcomes/").await.is_empty());
    // Read all at once too (the binding list's read).
    let all = view(&a, "api", true);
    assert_eq!(all.len(), 2, "{all:?}");

    // host-b steps out of api and back in: its marker under its own prefix.
    b.step_out("api", "3 failed resolutions in a row")
        .await
        .unwrap();
    assert_eq!(
        keys_under(&mut root, "/t/unable-by-host/").await,
        vec!["/t/unable-by-host/host-b/api".to_string()]
    );
    b.step_in("api").await.unwrap();
    assert!(keys_under(&mut root, "/t/unable-by-host/").await.is_empty());

    // host-b's user writes its own prefix, and nothing of another host's.
    let mut as_b = client(&etcd, Some(("host-b", "pw-b-9023"))).await;
    as_b.put("/t/outcomes-by-host/host-b/scratch", "{}", None)
        .await
        .unwrap();
    as_b.delete("/t/outcomes-by-host/host-b/scratch", None)
        .await
        .unwrap();
    for key in [
        "/t/outcomes-by-host/host-a/api",
        "/t/outcomes-by-host/host-b2/api",
        "/t/unable-by-host/host-a/api",
        "/t/outcomes/api/host-a",
    ] {
        let e = as_b.put(key, "{}", None).await.unwrap_err();
        assert!(e.to_string().contains("permission denied"), "{key}: {e}");
    }
    assert!(b.status().connected, "{:?}", b.status());
    assert!(a.status().connected, "{:?}", a.status());

    // The binding removed through host-a: each host deletes its own outcome of it.
    assert!(a.remove_binding("api").await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = keys_under(&mut root, "/t/outcomes-by-host/").await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "outcomes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.close().await;
    b.close().await;
}

/// (b) A rolling upgrade: outcomes and a marker written raw in the old layout (as a daemon of
/// before does) are read by a new host, in its read of every binding and of one binding; where
/// a host has a key in each layout, the new one wins. A new host that starts deletes its own
/// old-layout keys (and no other host's). `forget_host` deletes a host's keys of both layouts,
/// and a binding's removal deletes the old layout's keys of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_layout_keys_are_read_and_a_new_host_deletes_its_own_once() {
    let etcd = blocking(Etcd::start);
    let dir = tempfile::tempdir().unwrap();
    let a = open(&etcd, &dir, "host-a", None).await;
    a.insert_binding(&binding("api")).await.unwrap();
    a.insert_binding(&binding("db")).await.unwrap();
    let mut raw = client(&etcd, None).await;
    let json = |state, generation| serde_json::to_string(&outcome(state, generation)).unwrap();
    for (key, value) in [
        ("/t/outcomes/api/old-host", json(HostState::Applied, 1)),
        ("/t/outcomes/db/old-host", json(HostState::Applied, 1)),
        ("/t/outcomes/api/host-b", json(HostState::Stale, 1)),
        ("/t/outcomes/db/host-b", json(HostState::Stale, 1)),
        ("/t/unable/api/host-b", r#"{"why":"x"}"#.to_string()),
        ("/t/outcomes/api/host-c", json(HostState::Failed, 1)),
        (
            "/t/outcomes-by-host/host-c/api",
            json(HostState::Applied, 2),
        ),
    ] {
        raw.put(key, value, None).await.unwrap();
    }
    let states = |v: Vec<(String, HostState)>| -> Vec<(String, HostState)> {
        let mut v = v;
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let want_api = vec![
        ("host-b".to_string(), HostState::Stale),
        ("host-c".to_string(), HostState::Applied),
        ("old-host".to_string(), HostState::Applied),
    ];
    assert_eq!(states(view(&a, "api", true)), want_api);
    assert_eq!(states(view(&a, "api", false)), want_api);
    assert_eq!(
        states(view(&a, "db", false)),
        vec![
            ("host-b".to_string(), HostState::Stale),
            ("old-host".to_string(), HostState::Applied),
        ]
    );
    let members: Vec<(String, bool)> = a
        .fleet_hosts()
        .into_iter()
        .map(|m| (m.host, m.alive))
        .collect();
    for h in ["host-b", "host-c", "old-host"] {
        assert!(members.contains(&(h.to_string(), false)), "{members:?}");
    }

    // host-b upgraded: it deletes its old-layout keys, not the others'.
    let b = open(&etcd, &dir, "host-b", None).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let old: Vec<String> = [
            keys_under(&mut raw, "/t/outcomes/").await,
            keys_under(&mut raw, "/t/unable/").await,
        ]
        .concat();
        if !old.iter().any(|k| k.ends_with("/host-b")) {
            assert_eq!(
                old,
                vec![
                    "/t/outcomes/api/host-c".to_string(),
                    "/t/outcomes/api/old-host".to_string(),
                    "/t/outcomes/db/old-host".to_string(),
                ]
            );
            break;
        }
        assert!(Instant::now() < deadline, "host-b's old keys left: {old:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.publish_host_outcome("api", &outcome(HostState::Applied, 3))
        .await
        .unwrap();
    until(Duration::from_secs(10), "host-b's new outcome read", || {
        view(&a, "api", false).contains(&("host-b".to_string(), HostState::Applied))
    })
    .await;
    assert_eq!(
        keys_under(&mut raw, "/t/outcomes-by-host/host-b/").await,
        vec!["/t/outcomes-by-host/host-b/api".to_string()]
    );

    // forget_host: both layouts.
    assert_eq!(a.forget_host("host-c", false).await.unwrap().keys, 2);
    assert_eq!(a.forget_host("old-host", false).await.unwrap().keys, 2);
    for p in ["/t/outcomes/", "/t/outcomes-by-host/host-c/"] {
        assert!(keys_under(&mut raw, p).await.is_empty(), "{p}");
    }
    // A binding's removal takes the old layout's keys of it while there are any.
    raw.put(
        "/t/outcomes/db/old-host-2",
        json(HostState::Applied, 1),
        None,
    )
    .await
    .unwrap();
    assert!(a.remove_binding("db").await.unwrap());
    assert!(keys_under(&mut raw, "/t/outcomes/").await.is_empty());
    a.close().await;
    b.close().await;
}

/// The number of keys under `prefix` (one answer however many: the keys of the next test are
/// more than a plain client takes).
async fn count_under(c: &mut Client, prefix: &str) -> i64 {
    c.get(
        prefix,
        Some(GetOptions::new().with_prefix().with_count_only()),
    )
    .await
    .unwrap()
    .count()
}

/// (c) A host that starts with more keys of its own than one answer carries (≈ 4.8 MiB of key
/// names under `P/outcomes-by-host/HOST/`: its outcomes of bindings removed while it was down)
/// and keys of the old layout of its own: it deletes every one of them (and no other host's, nor
/// its outcome of a binding that exists) and runs normally. Before, its sweep after the first
/// full read read its own prefixes in one range read, which failed ("decoded message length too
/// large", taken as a refusal: logged, the sweep given up), so none of them was deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_more_own_keys_than_one_answer_deletes_them_at_start() {
    let etcd = blocking(Etcd::start);
    let dir = tempfile::tempdir().unwrap();
    let a = open(&etcd, &dir, "host-a", None).await;
    a.insert_binding(&binding("api")).await.unwrap();
    a.insert_binding(&binding("db")).await.unwrap();
    let mut raw = client(&etcd, None).await;
    // What host-b left: outcomes (and a few markers) of many bindings removed since (long
    // names, the limit is 128, make the keys large), its outcome of `api`, and old-layout keys.
    let name = |i: usize| format!("gone{i:06}-{}", "n".repeat(100));
    const REMOVED: usize = 32_000;
    let mut puts: Vec<String> = (0..REMOVED)
        .map(|i| format!("/t/outcomes-by-host/host-b/{}", name(i)))
        .collect();
    puts.extend((0..10).map(|i| format!("/t/unable-by-host/host-b/{}", name(i))));
    puts.extend(
        [
            "/t/outcomes-by-host/host-b/api",
            "/t/outcomes/api/host-b",
            "/t/outcomes/db/host-b",
            "/t/unable/db/host-b",
            "/t/outcomes/api/old-host",
        ]
        .map(String::from),
    );
    let mut tasks = Vec::new();
    for part in puts.chunks(puts.len().div_ceil(8)) {
        let part = part.to_vec();
        let mut raw = raw.clone();
        tasks.push(tokio::spawn(async move {
            for txn in part.chunks(100) {
                let ops = txn
                    .iter()
                    .map(|k| etcd_client::TxnOp::put(k.as_str(), "{}", None))
                    .collect::<Vec<_>>();
                raw.txn(etcd_client::Txn::new().and_then(ops))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        count_under(&mut raw, "/t/outcomes-by-host/host-b/").await,
        REMOVED as i64 + 1
    );

    let b = open(&etcd, &dir, "host-b", None).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = count_under(&mut raw, "/t/outcomes-by-host/host-b/").await
            + count_under(&mut raw, "/t/unable-by-host/host-b/").await;
        let old: Vec<String> = [
            keys_under(&mut raw, "/t/outcomes/").await,
            keys_under(&mut raw, "/t/unable/").await,
        ]
        .concat();
        if left == 1 && !old.iter().any(|k| k.ends_with("/host-b")) {
            assert_eq!(old, vec!["/t/outcomes/api/old-host".to_string()]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "host-b's keys left: {left} of its own prefixes, old layout {old:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        keys_under(&mut raw, "/t/outcomes-by-host/host-b/").await,
        vec!["/t/outcomes-by-host/host-b/api".to_string()]
    );
    // host-b runs normally: it has the bindings, and its outcome reaches host-a's view.
    assert!(b.status().connected, "{:?}", b.status());
    assert!(b.get_binding("db").unwrap().is_some());
    b.publish_host_outcome("db", &outcome(HostState::Applied, 3))
        .await
        .unwrap();
    until(Duration::from_secs(10), "host-b's outcome read", || {
        view(&a, "db", false).contains(&("host-b".to_string(), HostState::Applied))
    })
    .await;
    a.close().await;
    b.close().await;
}

/// `fleet forget-host` run by a host without the operator role is refused as what it is, naming
/// the etcd user (the API's 403), not "unreachable": with `--force` (revoking a live host's
/// lease takes the permission to write its heartbeat; before, said as unreachable) and without
/// (deleting another host's outcomes). Nothing is deleted; an operator forgets the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_host_without_the_operator_role_names_the_user_not_unreachable() {
    let mut etcd = blocking(Etcd::start);
    blocking(|| {
        etcd.enable_auth("root-pw-2750");
        add_user(&etcd, "host-a", "pw-a-1862", &EDITOR);
        add_user(&etcd, "host-b", "pw-b-3307", &[]);
        add_user(
            &etcd,
            "host-op",
            "pw-op-5519",
            &[
                ("/t/outcomes-by-host/", "READWRITE"),
                ("/t/unable-by-host/", "READWRITE"),
                ("/t/outcomes-gone/", "READWRITE"),
                ("/t/writes/", "READWRITE"),
            ],
        );
    });
    let dir = tempfile::tempdir().unwrap();
    let a = open(&etcd, &dir, "host-a", Some(("host-a", "pw-a-1862"))).await;
    let b = open(&etcd, &dir, "host-b", Some(("host-b", "pw-b-3307"))).await;
    a.insert_binding(&binding("api")).await.unwrap();
    until(Duration::from_secs(10), "host-b has api", || {
        b.get_binding("api").unwrap().is_some()
    })
    .await;
    let denied = |e: StoreError, what: &str| {
        let text = e.to_string();
        assert!(
            matches!(e, StoreError::PermissionDenied { .. }),
            "{what}: {e:?}: {text}"
        );
        assert!(
            text.contains("etcd user \"host-a\" has no permission for"),
            "{what}: {text}"
        );
        assert!(text.contains("permission denied"), "{what}: {text}");
        assert!(!text.contains("unreachable"), "{what}: {text}");
        assert!(!text.contains("pw-a-1862"), "{what}: {text}");
    };
    denied(
        a.forget_host("host-b", true).await.unwrap_err(),
        "--force on a live host",
    );
    assert!(b.status().connected, "{:?}", b.status());
    b.publish_host_outcome("api", &outcome(HostState::Applied, 1))
        .await
        .unwrap();
    until(Duration::from_secs(10), "host-b's outcome", || {
        view(&a, "api", false).contains(&("host-b".to_string(), HostState::Applied))
    })
    .await;
    b.close().await;
    until(Duration::from_secs(10), "host-b gone", || {
        a.fleet_hosts()
            .iter()
            .any(|m| m.host == "host-b" && !m.alive)
    })
    .await;
    denied(
        a.forget_host("host-b", false).await.unwrap_err(),
        "a host gone",
    );
    let mut root = client(&etcd, Some(("root", "root-pw-2750"))).await;
    assert_eq!(
        keys_under(&mut root, "/t/outcomes-by-host/host-b/")
            .await
            .len(),
        1
    );
    let op = open(&etcd, &dir, "host-op", Some(("host-op", "pw-op-5519"))).await;
    assert_eq!(op.forget_host("host-b", false).await.unwrap().keys, 1);
    assert!(keys_under(&mut root, "/t/outcomes-by-host/host-b/")
        .await
        .is_empty());
    a.close().await;
    op.close().await;
}
