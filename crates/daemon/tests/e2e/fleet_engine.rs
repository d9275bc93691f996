//! The engine in a fleet, without etcd: several engines in one process (one per simulated host,
//! each with its own conf dir and `nginx -t`), sharing the in-memory fleet store of
//! `tributary_fakes::fleet_store`. A counting plugin (a shell script answering the targets of a
//! shared file and appending one line per call to its host's `calls` file) shows which host
//! called its registry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary::engine::{Engine, EngineOptions};
use tributary::view::BindingInput;
use tributary_apply::{Applier, ApplyOptions, CommandNginx};
use tributary_fakes::fleet_store::Fleet;
use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_store::{BindingStore, HostState, OutcomeStatus};

struct Host {
    id: String,
    root: PathBuf,
    engine: Engine,
}

impl Host {
    fn file(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(
            self.root
                .join("conf/upstreams")
                .join(format!("{name}.conf")),
        )
        .ok()
    }

    fn calls(&self) -> usize {
        std::fs::read_to_string(self.root.join("calls"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

fn set_targets(path: &Path, addrs: &[&str]) {
    let list: Vec<serde_json::Value> = addrs
        .iter()
        .map(|a| serde_json::json!({"address": a, "port": 80}))
        .collect();
    std::fs::write(path, serde_json::Value::Array(list).to_string()).unwrap();
}

fn start_host(fleet: &Fleet, id: &str, base: &Path, targets: &Path, test_cmd: &[&str]) -> Host {
    let root = base.join(id);
    std::fs::create_dir_all(root.join("conf")).unwrap();
    let plugins = tributary_fakes::counting_plugin::counting_plugin(&root, targets);
    let (host, errors) = PluginHost::load(&plugins, HostOptions::default());
    assert!(errors.is_empty(), "{errors:?}");
    let nginx = CommandNginx::new(
        test_cmd.iter().map(|s| s.to_string()).collect(),
        vec!["true".into()],
    );
    let applier = Applier::open(
        &root.join("conf"),
        Box::new(nginx),
        ApplyOptions {
            min_reload_gap: Duration::ZERO,
            confirm: None,
        },
    )
    .unwrap();
    let store: Arc<dyn BindingStore> = fleet.member(id);
    let engine = Engine::start(
        store,
        Arc::new(host),
        applier,
        EngineOptions {
            conf_dir: root.join("conf"),
            batch_quiet: Duration::from_millis(10),
            batch_max: Duration::from_millis(100),
            refresh_jitter_pct: 0,
            ..Default::default()
        },
    )
    .unwrap();
    Host {
        id: id.to_string(),
        root,
        engine,
    }
}

fn input(name: &str, directives: &[&str]) -> BindingInput {
    BindingInput {
        name: name.into(),
        plugin: Some("count".into()),
        provider: Some("c".into()),
        config: BTreeMap::new(),
        service: Some("web".into()),
        // Long: only the test's own triggers resolve.
        interval_secs: Some(3600),
        directives: directives.iter().map(|d| d.to_string()).collect(),
        drain_secs: None,
        probe: None,
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn three(fleet: &Fleet, base: &Path, targets: &Path) -> Vec<Host> {
    ["a", "b", "c"]
        .iter()
        .map(|id| start_host(fleet, id, base, targets, &["true"]))
        .collect()
}

fn has(file: Option<String>, addr: &str) -> bool {
    file.is_some_and(|f| f.contains(&format!("server {addr}:80")))
}

/// Every host's fleet state of `name`, as `host` sees it, by host id.
fn states(host: &Host, name: &str) -> BTreeMap<String, HostState> {
    host.engine
        .store()
        .fleet_view(name)
        .hosts
        .iter()
        .map(|h| (h.outcome.host.clone(), h.outcome.state))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_saved_on_one_host_is_resolved_once_and_applied_by_every_host() {
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("targets.json");
    set_targets(&targets, &["10.0.0.1"]);
    let fleet = Fleet::new();
    let hosts = three(&fleet, tmp.path(), &targets);

    hosts[0].engine.add(&input("web", &[])).await.unwrap();
    until("every host wrote web.conf", || {
        hosts.iter().all(|h| has(h.file("web"), "10.0.0.1"))
    })
    .await;
    let resolver = fleet.resolver("web").expect("a resolver");
    let calls: Vec<usize> = hosts.iter().map(Host::calls).collect();
    assert_eq!(
        calls.iter().sum::<usize>(),
        1,
        "one registry call: {calls:?}"
    );
    let caller = hosts.iter().find(|h| h.calls() == 1).unwrap();
    assert_eq!(caller.id, resolver);
    // Every host's API view lists the binding; the fleet view shows all three applied.
    for h in &hosts {
        assert!(h.engine.get("web").is_some(), "{}", h.id);
    }
    until("the fleet view shows three applied hosts", || {
        states(&hosts[1], "web")
            .values()
            .filter(|s| **s == HostState::Applied)
            .count()
            == 3
    })
    .await;
    let view = hosts[2].engine.store().fleet_view("web");
    assert_eq!(view.resolver.as_deref(), Some(resolver.as_str()));
    // The API's binding view carries it.
    let api = hosts[2].engine.get("web").unwrap().fleet;
    assert_eq!(api.resolver.as_deref(), Some(resolver.as_str()));
    assert_eq!(
        api.hosts
            .iter()
            .map(|h| h.host.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert!(
        view.hosts
            .iter()
            .all(|h| h.outcome.generation == view.generation && h.outcome.servers == 1),
        "{view:?}"
    );

    // A refresh on a host that does not resolve calls no registry: it re-applies the published set.
    let follower = hosts.iter().find(|h| h.id != resolver).unwrap();
    set_targets(&targets, &["10.0.0.1", "10.0.0.2"]);
    let o = follower.engine.refresh("web").await.unwrap();
    assert_eq!(o.status, OutcomeStatus::Unchanged, "{o:?}");
    assert_eq!(hosts.iter().map(Host::calls).sum::<usize>(), 1);
    // A refresh on the resolver resolves once; every host applies the new set.
    let r = hosts.iter().find(|h| h.id == resolver).unwrap();
    let o = r.engine.refresh("web").await.unwrap();
    assert_eq!(o.status, OutcomeStatus::Ok, "{o:?}");
    until("every host has the second server", || {
        hosts.iter().all(|h| has(h.file("web"), "10.0.0.2"))
    })
    .await;
    assert_eq!(hosts.iter().map(Host::calls).sum::<usize>(), 2);

    // A change saved on another host reaches every host (re-resolved from the new version).
    hosts[2]
        .engine
        .put("web", &input("web", &["keepalive 8;"]))
        .await
        .unwrap();
    until("every host has the new directive", || {
        hosts
            .iter()
            .all(|h| h.file("web").is_some_and(|f| f.contains("keepalive 8;")))
    })
    .await;

    // A removal on one host removes the binding and its file everywhere.
    hosts[1].engine.remove("web").await.unwrap();
    until("every host removed web", || {
        hosts
            .iter()
            .all(|h| h.file("web").is_none() && h.engine.get("web").is_none())
    })
    .await;
    for h in &hosts {
        h.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_resolver_dies_another_host_takes_the_binding_over() {
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("targets.json");
    set_targets(&targets, &["10.0.0.1"]);
    let fleet = Fleet::new();
    let hosts = three(&fleet, tmp.path(), &targets);
    hosts[0].engine.add(&input("web", &[])).await.unwrap();
    until("every host wrote web.conf", || {
        hosts.iter().all(|h| has(h.file("web"), "10.0.0.1"))
    })
    .await;
    until("the fleet view shows three applied hosts", || {
        states(&hosts[0], "web")
            .values()
            .filter(|s| **s == HostState::Applied)
            .count()
            == 3
    })
    .await;
    let old = fleet.resolver("web").unwrap();
    let dead = hosts.iter().find(|h| h.id == old).unwrap();
    dead.engine.shutdown().await;
    set_targets(&targets, &["10.0.0.3"]);
    // Its lease expires: the others are told, one claims and resolves.
    fleet.kill(&old);
    let alive: Vec<&Host> = hosts.iter().filter(|h| h.id != old).collect();
    until("the live hosts applied the new resolver's set", || {
        alive.iter().all(|h| has(h.file("web"), "10.0.0.3"))
    })
    .await;
    let new = fleet.resolver("web").unwrap();
    assert_ne!(new, old);
    let new_host = alive.iter().find(|h| h.id == new).unwrap();
    assert_eq!(
        new_host.calls(),
        1,
        "the new resolver called its registry once"
    );
    let other = alive.iter().find(|h| h.id != new).unwrap();
    assert_eq!(other.calls(), 0, "the third host never called its registry");
    // The dead host keeps its servers (nothing removed its file).
    assert!(has(dead.file("web"), "10.0.0.1"));
    let view = other.engine.store().fleet_view("web");
    let dead_entry = view.hosts.iter().find(|h| h.outcome.host == old).unwrap();
    assert!(!dead_entry.alive, "{view:?}");
    for h in &hosts {
        h.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_keeps_every_upstream_and_the_hosts_catch_up_when_it_returns() {
    unreachable_then_back(true).await;
}

/// The same with a store that says only `Status` when it is back (no `Resync`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_catch_up_on_the_status_event_alone() {
    unreachable_then_back(false).await;
}

async fn unreachable_then_back(resync: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("targets.json");
    set_targets(&targets, &["10.0.0.1"]);
    let fleet = Fleet::new();
    fleet.resync_on_return(resync);
    let hosts = three(&fleet, tmp.path(), &targets);
    hosts[0].engine.add(&input("web", &[])).await.unwrap();
    until("every host wrote web.conf", || {
        hosts.iter().all(|h| has(h.file("web"), "10.0.0.1"))
    })
    .await;
    // And recorded it: a host whose file is written may still be finishing that apply, and a
    // refresh asked meanwhile answers with it (`Ok`), not with the unreachable store.
    until("every host recorded web applied", || {
        hosts
            .iter()
            .all(|h| states(h, "web").get(&h.id) == Some(&HostState::Applied))
    })
    .await;
    let before: Vec<Option<String>> = hosts.iter().map(|h| h.file("web")).collect();
    let calls = hosts.iter().map(Host::calls).sum::<usize>();

    for h in &hosts {
        fleet.set_reachable(&h.id, false);
    }
    set_targets(&targets, &["10.0.0.4"]);
    for h in &hosts {
        let o = h.engine.refresh("web").await.unwrap();
        assert_eq!(o.status, OutcomeStatus::Failed, "{o:?}");
        let why = o.why.unwrap_or_default();
        assert!(
            why.contains("unreachable") && why.contains("servers were kept"),
            "{why}"
        );
        let status = h.engine.store().status();
        assert!(
            !status.connected && status.unreachable_since_ms.is_some(),
            "{status:?}"
        );
        // The binding and its servers are still shown.
        let v = h.engine.get("web").unwrap();
        assert_eq!(v.servers.len(), 1, "{v:?}");
        assert_eq!(states(h, "web").get(&h.id), Some(&HostState::Stale));
    }
    // Saves and removals need the store: refused, nothing changed.
    let e = hosts[0]
        .engine
        .put("web", &input("web", &["keepalive 4;"]))
        .await;
    assert!(
        matches!(&e, Err(e) if e.http_status() == 503 && e.to_string().contains("unreachable")),
        "{:?}",
        e.err()
    );
    let e = hosts[1].engine.remove("web").await;
    assert!(
        matches!(&e, Err(e) if e.http_status() == 503),
        "{:?}",
        e.err()
    );
    let after: Vec<Option<String>> = hosts.iter().map(|h| h.file("web")).collect();
    assert_eq!(
        before, after,
        "no file changed while the store was unreachable"
    );
    assert_eq!(
        hosts.iter().map(Host::calls).sum::<usize>(),
        calls,
        "no registry call"
    );

    for h in &hosts {
        fleet.set_reachable(&h.id, true);
    }
    let back = Instant::now();
    until("every host caught up", || {
        hosts.iter().all(|h| has(h.file("web"), "10.0.0.4"))
    })
    .await;
    // At once, not at the next retry of the failure back-off (10 s at least).
    assert!(
        back.elapsed() < Duration::from_secs(5),
        "caught up after {:?}",
        back.elapsed()
    );
    until("the fleet view shows three applied hosts again", || {
        states(&hosts[0], "web")
            .values()
            .all(|s| *s == HostState::Applied)
            && states(&hosts[0], "web").len() == 3
    })
    .await;
    for h in &hosts {
        h.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_nginx_refuses_the_set_shows_failed_with_nginx_message() {
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("targets.json");
    set_targets(&targets, &["10.0.0.1"]);
    let fleet = Fleet::new();
    let refuse = [
        "sh",
        "-c",
        "echo 'nginx: [emerg] host c refuses this file' >&2; exit 1",
    ];
    let hosts = vec![
        start_host(&fleet, "a", tmp.path(), &targets, &["true"]),
        start_host(&fleet, "b", tmp.path(), &targets, &["true"]),
        start_host(&fleet, "c", tmp.path(), &targets, &refuse),
    ];
    hosts[0].engine.add(&input("web", &[])).await.unwrap();
    until("the fleet view has three hosts", || {
        states(&hosts[0], "web").len() == 3
    })
    .await;
    let view = hosts[1].engine.store().fleet_view("web");
    for h in &view.hosts {
        let o = &h.outcome;
        if o.host == "c" {
            assert_eq!(o.state, HostState::Failed, "{o:?}");
            let msg = o.message.as_deref().unwrap_or("");
            assert!(msg.contains("host c refuses this file"), "{msg}");
            assert_eq!(o.servers, 0, "{o:?}");
        } else {
            assert_eq!(o.state, HostState::Applied, "{o:?}");
            assert_eq!(o.servers, 1, "{o:?}");
        }
    }
    assert!(
        hosts[2].file("web").is_none(),
        "nothing left on the refusing host"
    );
    assert!(has(hosts[0].file("web"), "10.0.0.1") && has(hosts[1].file("web"), "10.0.0.1"));
    for h in &hosts {
        h.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_elsewhere_keeps_the_file_a_hosts_nginx_still_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let targets = tmp.path().join("targets.json");
    set_targets(&targets, &["10.0.0.1"]);
    let fleet = Fleet::new();
    // Host b's nginx still includes the file: its test fails without it.
    let needed = tmp.path().join("b/conf/upstreams/web.conf");
    let check = format!("test -f '{}'", needed.display());
    let hosts = vec![
        start_host(&fleet, "a", tmp.path(), &targets, &["true"]),
        start_host(&fleet, "b", tmp.path(), &targets, &["sh", "-c", &check]),
    ];
    hosts[0].engine.add(&input("web", &[])).await.unwrap();
    until("both hosts wrote web.conf", || {
        hosts.iter().all(|h| has(h.file("web"), "10.0.0.1"))
    })
    .await;
    hosts[0].engine.remove("web").await.unwrap();
    until("b dropped the binding", || {
        hosts[1].engine.get("web").is_none()
    })
    .await;
    assert!(hosts[0].file("web").is_none());
    assert!(
        has(hosts[1].file("web"), "10.0.0.1"),
        "b's nginx needs the file: kept"
    );
    for h in &hosts {
        h.engine.shutdown().await;
    }
}
