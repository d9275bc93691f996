//! The fleet end to end (issue 13): a real 3-member etcd cluster, three real daemons
//! (`serve --store etcd`), each with its own real nginx prefix. A counting plugin (a shell script
//! answering the targets of a shared file and appending one line per call to its host's `calls`
//! file) shows which host called the registry. The servers are two backends of a fourth nginx
//! (`one`, `two`), so every host's nginx serves the same bodies. A watcher asks every host's
//! nginx for the binding all along and records any answer that is not a backend's body.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{assert_ok, fleet_args, http, Daemon};
use serde_json::{json, Value};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_fakes::wait::poll_for;
use tributary_testkit::TestNginx;

/// Generous: the machine is loaded.
const WAIT: Duration = Duration::from_secs(60);
const PREFIX: &str = "/fleet-e2e/";
const TTL_SECS: u64 = 2;

struct Host {
    id: String,
    root: tempfile::TempDir,
    // Field order: the daemon stops before its nginx.
    daemon: Daemon,
    nginx: TestNginx,
}

impl Host {
    fn calls(&self) -> usize {
        std::fs::read_to_string(self.root.path().join("calls"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    fn body(&self, name: &str) -> Option<String> {
        match self.nginx.try_get(&TestNginx::upstream_path(name)) {
            Ok((200, b)) => Some(b),
            _ => None,
        }
    }

    fn detail(&self, name: &str) -> (u16, Value) {
        self.daemon
            .api("GET", &format!("/api/v1/bindings/{name}"), None)
    }

    /// `host id -> state` of the binding's fleet view, as this host's API shows it.
    fn fleet_states(&self, name: &str) -> Vec<(String, String, Value)> {
        let (_, v) = self.detail(name);
        v["binding"]["fleet"]["hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|h| {
                (
                    h["host"].as_str().unwrap_or("").to_string(),
                    h["state"].as_str().unwrap_or("").to_string(),
                    h.clone(),
                )
            })
            .collect()
    }

    fn resolver(&self, name: &str) -> Option<String> {
        let (_, v) = self.detail(name);
        v["binding"]["fleet"]["resolver"]
            .as_str()
            .map(str::to_string)
    }

    fn sigkill(&self) {
        let pid = self.daemon.pid().expect("daemon runs");
        let st = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

struct Fleet {
    hosts: Vec<Host>,
    backends: TestNginx,
    targets: PathBuf,
    cluster: EtcdCluster,
    _shared: tempfile::TempDir,
}

impl Fleet {
    /// Three hosts `host-a`, `host-b`, `host-c`; `snippets[i]` is extra `http` text of host i's
    /// nginx.
    fn start(snippets: [&str; 3]) -> Fleet {
        let cluster = EtcdCluster::start(3);
        let shared = tempfile::tempdir().unwrap();
        let key = shared.path().join("secrets.key");
        std::fs::write(&key, [9u8; 32]).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let targets = shared.path().join("targets.json");
        let backends = TestNginx::builder().backend("one").backend("two").start();
        let fleet_targets = |name: &str| {
            json!([{"address": "127.0.0.1", "port": backends.backend_port(name)}]).to_string()
        };
        std::fs::write(&targets, fleet_targets("one")).unwrap();
        let hosts = ["host-a", "host-b", "host-c"]
            .iter()
            .zip(snippets)
            .map(|(id, snippet)| {
                let root = tempfile::tempdir().unwrap();
                let mut b = TestNginx::builder();
                if !snippet.is_empty() {
                    b = b.http_snippet(snippet);
                }
                let nginx = b.start();
                tributary_fakes::counting_plugin::counting_plugin(root.path(), &targets);
                let mut extra: Vec<String> = tributary_fakes::daemon::FAST
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                extra.extend(fleet_args(&cluster, PREFIX, &key, id, TTL_SECS));
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let daemon = Daemon::start_with(root.path(), &nginx, &extra);
                Host {
                    id: id.to_string(),
                    root,
                    daemon,
                    nginx,
                }
            })
            .collect();
        Fleet {
            hosts,
            backends,
            targets,
            cluster,
            _shared: shared,
        }
    }

    /// Points the registry at backend `name` (`one` or `two`).
    fn registry(&self, name: &str) {
        let t = json!([{"address": "127.0.0.1", "port": self.backends.backend_port(name)}]);
        std::fs::write(&self.targets, t.to_string()).unwrap();
    }

    fn calls(&self) -> Vec<usize> {
        self.hosts.iter().map(Host::calls).collect()
    }

    fn host(&self, id: &str) -> &Host {
        self.hosts.iter().find(|h| h.id == id).unwrap()
    }

    /// Waits until every host in `which` serves `body` for `name` through its nginx.
    fn wait_served(&self, which: &[usize], name: &str, body: &str) {
        for &i in which {
            let h = &self.hosts[i];
            h.nginx
                .wait_for_body(&TestNginx::upstream_path(name), body, WAIT)
                .unwrap_or_else(|e| panic!("{}: {e}; log: {}", h.id, h.daemon.log_text()));
        }
    }

    /// Waits until `viewer`'s fleet view of `name` shows each of `want` (host id, state).
    fn wait_fleet(&self, viewer: usize, name: &str, want: &[(&str, &str)]) -> Vec<Value> {
        let h = &self.hosts[viewer];
        poll_for(
            &format!("{}'s fleet view of {name}: {want:?}", h.id),
            WAIT,
            || {
                let got = h.fleet_states(name);
                let ok = want
                    .iter()
                    .all(|(id, st)| got.iter().any(|(gid, gst, _)| gid == id && gst == st));
                if ok {
                    Ok(got.into_iter().map(|(_, _, v)| v).collect())
                } else {
                    Err(format!("{got:?}"))
                }
            },
        )
    }

    /// Creates binding `name` (the counting plugin, interval 10 s) through host `i`'s CLI.
    fn add(&self, i: usize, name: &str) {
        let out =
            self.hosts[i]
                .daemon
                .binding_add(name, "count", "c", "web", &[], &["--interval", "10"]);
        assert_ok(&out, &format!("binding add {name} on {}", self.hosts[i].id));
    }
}

/// Asks every listed host's nginx for `name` every 100 ms; records any answer that is not one of
/// the backends' bodies.
struct Watcher {
    stop: Arc<AtomicBool>,
    bad: Arc<Mutex<Vec<String>>>,
    handle: Option<JoinHandle<()>>,
}

impl Watcher {
    fn start(ports: Vec<u16>, name: &str) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(Mutex::new(Vec::new()));
        let (s, b) = (stop.clone(), bad.clone());
        let path = TestNginx::upstream_path(name);
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                for &p in &ports {
                    let r = std::panic::catch_unwind(|| http(p, "GET", &path, None, None));
                    match r {
                        Ok((200, body)) if body == "one" || body == "two" => {}
                        other => b.lock().unwrap().push(format!("nginx :{p}: {other:?}")),
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watcher {
            stop,
            bad,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.bad.lock().unwrap().clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

const ALL: [usize; 3] = [0, 1, 2];

fn applied_all(f: &Fleet, viewer: usize, name: &str) -> Vec<Value> {
    f.wait_fleet(
        viewer,
        name,
        &[
            ("host-a", "applied"),
            ("host-b", "applied"),
            ("host-c", "applied"),
        ],
    )
}

#[test]
fn a_binding_created_on_one_host_is_resolved_once_and_applied_by_all_three() {
    let f = Fleet::start(["", "", ""]);
    let t0 = Instant::now();
    f.add(0, "web");
    f.wait_served(&ALL, "web", "one");
    for viewer in ALL {
        let hosts = applied_all(&f, viewer, "web");
        for h in &hosts {
            assert_eq!(h["servers"], 1, "{h}");
            assert_eq!(h["alive"], true, "{h}");
        }
    }
    // One registry call in all, made by the resolver.
    let resolver = f.hosts[1].resolver("web").expect("a resolver");
    let calls = f.calls();
    assert_eq!(calls.iter().sum::<usize>(), 1, "{calls:?}");
    assert_eq!(f.host(&resolver).calls(), 1, "{resolver}: {calls:?}");

    // A registry change: resolved once (by the resolver, at its next interval), applied by all.
    let watcher = Watcher::start(f.hosts.iter().map(|h| h.nginx.port()).collect(), "web");
    f.registry("two");
    f.wait_served(&ALL, "web", "two");
    let calls = f.calls();
    let by_resolver = f.host(&resolver).calls();
    assert_eq!(
        calls.iter().sum::<usize>(),
        by_resolver,
        "only {resolver} calls the registry: {calls:?}"
    );
    // One call per interval (10 s) for the fleet, not one per host.
    let per_interval = t0.elapsed().as_secs() as usize / 10 + 2;
    assert!(
        by_resolver <= per_interval,
        "{calls:?} in {:?}",
        t0.elapsed()
    );
    // A refresh asked of a host that does not resolve calls no registry.
    let other = f.hosts.iter().find(|h| h.id != resolver).unwrap();
    let before = f.calls();
    let (st, body) = other
        .daemon
        .api("POST", "/api/v1/bindings/web/refresh", Some("{}"));
    assert!(st < 300, "{st} {body}");
    std::thread::sleep(Duration::from_secs(1));
    let after = f.calls();
    for (i, h) in f.hosts.iter().enumerate() {
        if h.id != resolver {
            assert_eq!(before[i], after[i], "{}: {before:?} -> {after:?}", h.id);
        }
    }
    let bad = watcher.finish();
    assert!(bad.is_empty(), "an nginx did not serve a backend: {bad:?}");
}

#[test]
fn the_resolver_killed_another_host_takes_over_and_no_nginx_is_emptied() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(1, "web");
    f.wait_served(&ALL, "web", "one");
    applied_all(&f, 0, "web");
    let resolver = f.hosts[0].resolver("web").expect("a resolver");
    let dead = f.hosts.iter().position(|h| h.id == resolver).unwrap();
    let live: Vec<usize> = ALL.iter().copied().filter(|i| *i != dead).collect();
    let watcher = Watcher::start(f.hosts.iter().map(|h| h.nginx.port()).collect(), "web");

    f.hosts[dead].sigkill();
    let killed = Instant::now();
    // Another host holds the claim once the dead host's lease expired (TTL 2 s).
    let viewer = &f.hosts[live[0]];
    let taker = poll_for("another host takes the claim", WAIT, || {
        match viewer.resolver("web") {
            Some(r) if r != resolver => Ok(r),
            other => Err(format!("{other:?}")),
        }
    });
    let took = killed.elapsed();
    eprintln!("{taker} took the claim {took:?} after {resolver} was killed (TTL {TTL_SECS} s)");
    // TTL, the watch's delay and a loaded machine: bounded, generously.
    assert!(took < Duration::from_secs(TTL_SECS + 13), "{took:?}");
    // The dead host shows as not live in the fleet view.
    poll_for("the dead host is not live", WAIT, || {
        let hosts = viewer.fleet_states("web");
        match hosts.iter().find(|(id, _, _)| *id == resolver) {
            Some((_, _, v)) if v["alive"] == false => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // A later registry change reaches the two live hosts, resolved by the new resolver only.
    let before = f.calls();
    f.registry("two");
    f.wait_served(&live, "web", "two");
    let after = f.calls();
    for (i, h) in f.hosts.iter().enumerate() {
        if h.id != taker {
            assert_eq!(before[i], after[i], "{}: {before:?} -> {after:?}", h.id);
        }
    }
    assert!(
        f.host(&taker).calls()
            > before[live
                .iter()
                .copied()
                .find(|i| f.hosts[*i].id == taker)
                .unwrap()]
    );
    // The killed host's nginx still serves its last servers.
    assert_eq!(f.hosts[dead].body("web").as_deref(), Some("one"));
    let bad = watcher.finish();
    assert!(bad.is_empty(), "an nginx did not serve a backend: {bad:?}");
    f.hosts[dead].daemon.stop();
}

#[test]
fn one_etcd_member_killed_bindings_are_still_created_and_applied() {
    let mut f = Fleet::start(["", "", ""]);
    // The member host B's session talks to ("connected to URL" in its store state) is killed,
    // and a save through B's API follows at once: B's store sends it to another member, so it
    // is accepted the first time (before, it was refused with 503 until B had moved, ~0.1 s).
    let member = poll_for("host B connected to a member", WAIT, || {
        let (_, v) = f.hosts[1].daemon.api("GET", "/api/v1/store", None);
        let loc = v["location"].as_str().unwrap_or("").to_string();
        f.cluster
            .endpoints()
            .iter()
            .position(|e| loc.contains(&format!("connected to {e}")))
            .ok_or(format!("{v}"))
    });
    f.cluster.kill(member);
    let killed = Instant::now();
    let body = json!({"name": "api", "plugin": "count", "provider": "c", "service": "web",
        "interval_secs": 10});
    let (st, v) = f.hosts[1]
        .daemon
        .api("POST", "/api/v1/bindings", Some(&body.to_string()));
    assert!(
        st < 300,
        "save right after B's member {member} was killed: {st} {v}"
    );
    eprintln!(
        "member {member} (host B's) killed; B's save answered {st} after {:?}",
        killed.elapsed()
    );
    f.wait_served(&ALL, "api", "one");
    applied_all(&f, 2, "api");
    assert_eq!(f.calls().iter().sum::<usize>(), 1, "{:?}", f.calls());
    // And a change saved through host C's CLI (a replace) reaches every host.
    f.registry("two");
    let out = f.hosts[2].daemon.binding_add(
        "api",
        "count",
        "c",
        "web2",
        &[],
        &["--interval", "10", "--replace"],
    );
    assert_ok(&out, "binding add --replace on C");
    f.wait_served(&ALL, "api", "two");
    for h in &f.hosts {
        let (_, v) = h.detail("api");
        assert_eq!(v["binding"]["service"], "web2", "{}: {v}", h.id);
    }
    let (_, store) = f.hosts[0].daemon.api("GET", "/api/v1/store", None);
    assert_eq!(store["connected"], true, "{store}");
}

#[test]
fn every_etcd_member_killed_hosts_keep_serving_say_so_and_catch_up_after() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(0, "web");
    f.wait_served(&ALL, "web", "one");
    applied_all(&f, 0, "web");
    let watcher = Watcher::start(f.hosts.iter().map(|h| h.nginx.port()).collect(), "web");

    f.cluster.kill_all();
    for h in &f.hosts {
        poll_for(
            &format!("{} says the store is unreachable", h.id),
            WAIT,
            || {
                let (st, v) = h.daemon.api("GET", "/api/v1/store", None);
                if st == 200 && v["connected"] == false && v["unreachable_since_ms"].is_i64() {
                    Ok(())
                } else {
                    Err(format!("{st} {v}"))
                }
            },
        );
        let (st, health) = http(h.daemon.port, "GET", "/api/v1/health", None, None);
        assert_eq!(st, 200, "{health}");
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!(health["status"], "degraded", "{}: {health}", h.id);
        let (st, metrics) = http(
            h.daemon.port,
            "GET",
            "/metrics",
            Some(&h.daemon.token()),
            None,
        );
        assert_eq!(st, 200);
        assert!(
            metrics.lines().any(|l| l == "tributary_store_connected 0"),
            "{}: {metrics}",
            h.id
        );
    }
    // A registry change while etcd is down: nothing is resolved or applied, every host keeps
    // its servers through more than one interval (10 s).
    f.registry("two");
    let calls = f.calls();
    std::thread::sleep(Duration::from_secs(12));
    for h in &f.hosts {
        assert_eq!(h.body("web").as_deref(), Some("one"), "{}", h.id);
    }
    assert_eq!(f.calls(), calls, "no registry call while the store is down");

    // etcd back: every host reconnects and the change is applied on all three.
    f.cluster.restart_all();
    for h in &f.hosts {
        poll_for(&format!("{} reconnects", h.id), WAIT, || {
            let (st, v) = h.daemon.api("GET", "/api/v1/store", None);
            if st == 200 && v["connected"] == true {
                Ok(())
            } else {
                Err(format!("{st} {v}"))
            }
        });
        let (_, metrics) = http(
            h.daemon.port,
            "GET",
            "/metrics",
            Some(&h.daemon.token()),
            None,
        );
        assert!(
            metrics.lines().any(|l| l == "tributary_store_connected 1"),
            "{}: {metrics}",
            h.id
        );
    }
    f.wait_served(&ALL, "web", "two");
    applied_all(&f, 2, "web");
    // And a binding created after the outage reaches every host.
    f.add(2, "late");
    f.wait_served(&ALL, "late", "two");
    let bad = watcher.finish();
    assert!(bad.is_empty(), "an nginx did not serve a backend: {bad:?}");
}

#[test]
fn a_host_whose_nginx_refuses_the_change_shows_failed_with_nginx_message_everywhere() {
    // Host C's nginx already has an upstream `bad`: the file `bad.conf` makes its `nginx -t`
    // fail (a duplicate upstream); hosts A and B take it.
    let f = Fleet::start(["", "", "upstream bad { server 127.0.0.1:9; }"]);
    f.add(0, "bad");
    f.wait_served(&[0, 1], "bad", "one");
    for viewer in ALL {
        let hosts = f.wait_fleet(
            viewer,
            "bad",
            &[
                ("host-a", "applied"),
                ("host-b", "applied"),
                ("host-c", "failed"),
            ],
        );
        let c = hosts.iter().find(|h| h["host"] == "host-c").unwrap();
        let msg = c["message"].as_str().unwrap_or("");
        assert!(msg.contains("duplicate upstream"), "{viewer}: {c}");
        for h in hosts.iter().filter(|h| h["host"] != "host-c") {
            assert!(h["message"].is_null(), "{h}");
        }
    }
    // Host C's nginx is unchanged: its own upstream (nothing listens on port 9), no file.
    assert!(!f.hosts[2].nginx.upstreams_dir().join("bad.conf").exists());
    assert_ne!(f.hosts[2].body("bad").as_deref(), Some("one"));
}
