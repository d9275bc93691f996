//! The fleet harness of the end-to-end tests: a real 3-member etcd cluster, three real daemons
//! (`serve --store etcd`), each with its own real nginx prefix. A counting plugin (a shell script
//! answering the targets of a shared file and appending one line per call to its host's `calls`
//! file) shows which host called the registry. The servers are two backends of a fourth nginx
//! (`one`, `two`), so every host's nginx serves the same bodies. A watcher asks every host's
//! nginx for the binding all along and records any answer that is not a backend's body.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_fakes::wait::poll_for;
use tributary_testkit::Nginx;

use super::{assert_ok, fleet_args, http, Daemon};

/// Generous: the machine is loaded.
pub const WAIT: Duration = Duration::from_secs(60);
pub const PREFIX: &str = "/fleet-e2e/";
pub const TTL_SECS: u64 = 2;

pub struct Host {
    pub id: String,
    pub root: tempfile::TempDir,
    // Field order: the daemon stops before its nginx.
    pub daemon: Daemon,
    pub nginx: Nginx,
}

impl Host {
    pub fn calls(&self) -> usize {
        std::fs::read_to_string(self.root.path().join("calls"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    pub fn body(&self, name: &str) -> Option<String> {
        match self.nginx.try_get(&Nginx::upstream_path(name)) {
            Ok((200, b)) => Some(b),
            _ => None,
        }
    }

    pub fn detail(&self, name: &str) -> (u16, Value) {
        self.daemon
            .api("GET", &format!("/api/v1/bindings/{name}"), None)
    }

    /// `host id -> state` of the binding's fleet view, as this host's API shows it.
    pub fn fleet_states(&self, name: &str) -> Vec<(String, String, Value)> {
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

    pub fn resolver(&self, name: &str) -> Option<String> {
        let (_, v) = self.detail(name);
        v["binding"]["fleet"]["resolver"]
            .as_str()
            .map(str::to_string)
    }

    pub fn sigkill(&self) {
        let pid = self.daemon.pid().expect("daemon runs");
        let st = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

/// The two secrets keys of [`Fleet::start_hosts`] (by index in [`HostSetup::keys`]).
pub const KEYS: [[u8; 32]; 2] = [[9u8; 32], [7u8; 32]];

/// How one host of [`Fleet::start_hosts`] is set up.
#[derive(Default)]
pub struct HostSetup<'a> {
    /// Extra `http` text of its nginx.
    pub snippet: &'a str,
    /// Its plugins dir is empty (no counting plugin).
    pub empty_plugins_dir: bool,
    /// Its counting plugin cannot reach the registry: every call fails (a malformed answer).
    pub registry_unreachable: bool,
    /// Its `--secrets-key` files, by index in [`KEYS`], the sealing one first (empty: `[0]`).
    pub keys: &'a [usize],
}

pub struct Fleet {
    pub hosts: Vec<Host>,
    pub backends: Nginx,
    pub targets: PathBuf,
    pub cluster: EtcdCluster,
    _shared: tempfile::TempDir,
}

impl Fleet {
    /// Three hosts `host-a`, `host-b`, `host-c`; `snippets[i]` is extra `http` text of host i's
    /// nginx.
    pub fn start(snippets: [&str; 3]) -> Fleet {
        Fleet::start_with(snippets, &[])
    }

    /// [`Fleet::start`] with `args` added to every daemon's `serve` arguments.
    pub fn start_with(snippets: [&str; 3], args: &[&str]) -> Fleet {
        Fleet::start_hosts(
            snippets.map(|snippet| HostSetup {
                snippet,
                ..HostSetup::default()
            }),
            args,
        )
    }

    /// Three hosts set up each as `setups` says, with `args` added to every daemon's `serve`
    /// arguments.
    pub fn start_hosts(setups: [HostSetup<'_>; 3], args: &[&str]) -> Fleet {
        Fleet::start_on(EtcdCluster::start(3), setups, args)
    }

    /// [`Fleet::start_hosts`] on `cluster` (e.g. one started with extra member flags).
    pub fn start_on(cluster: EtcdCluster, setups: [HostSetup<'_>; 3], args: &[&str]) -> Fleet {
        let shared = tempfile::tempdir().unwrap();
        // Two secrets keys: `KEYS[0]` (every host's by default) and `KEYS[1]`.
        let key_files: Vec<PathBuf> = KEYS
            .iter()
            .enumerate()
            .map(|(i, bytes)| {
                let f = shared.path().join(format!("secrets-{i}.key"));
                std::fs::write(&f, bytes).unwrap();
                std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
                f
            })
            .collect();
        let targets = shared.path().join("targets.json");
        let backends = Nginx::builder().backend("one").backend("two").start();
        let fleet_targets = |name: &str| {
            json!([{"address": "127.0.0.1", "port": backends.backend_port(name)}]).to_string()
        };
        std::fs::write(&targets, fleet_targets("one")).unwrap();
        let hosts = ["host-a", "host-b", "host-c"]
            .iter()
            .zip(setups)
            .map(|(id, setup)| {
                let root = tempfile::tempdir().unwrap();
                let mut b = Nginx::builder();
                if !setup.snippet.is_empty() {
                    b = b.http_snippet(setup.snippet);
                }
                let nginx = b.start();
                let mut extra: Vec<String> = tributary_fakes::daemon::FAST
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                let keys = if setup.keys.is_empty() {
                    &[0][..]
                } else {
                    setup.keys
                };
                extra.extend(fleet_args(
                    &cluster,
                    PREFIX,
                    &key_files[keys[0]],
                    id,
                    TTL_SECS,
                ));
                for k in &keys[1..] {
                    extra.push("--secrets-key".into());
                    extra.push(key_files[*k].display().to_string());
                }
                extra.extend(args.iter().map(|s| s.to_string()));
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let daemon = if setup.empty_plugins_dir {
                    let empty = root.path().join("no-plugins");
                    std::fs::create_dir_all(&empty).unwrap();
                    Daemon(tributary_fakes::daemon::Daemon::start_with(
                        &super::tributary_bin(),
                        root.path(),
                        &empty,
                        &nginx,
                        &extra,
                    ))
                } else {
                    let registry = if setup.registry_unreachable {
                        let broken = root.path().join("unreachable-registry");
                        std::fs::write(&broken, "no route to the registry").unwrap();
                        broken
                    } else {
                        targets.clone()
                    };
                    tributary_fakes::counting_plugin::counting_plugin(root.path(), &registry);
                    Daemon::start_with(root.path(), &nginx, &extra)
                };
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
    pub fn registry(&self, name: &str) {
        let t = json!([{"address": "127.0.0.1", "port": self.backends.backend_port(name)}]);
        std::fs::write(&self.targets, t.to_string()).unwrap();
    }

    pub fn calls(&self) -> Vec<usize> {
        self.hosts.iter().map(Host::calls).collect()
    }

    pub fn host(&self, id: &str) -> &Host {
        self.hosts.iter().find(|h| h.id == id).unwrap()
    }

    /// Waits until every host in `which` serves `body` for `name` through its nginx.
    pub fn wait_served(&self, which: &[usize], name: &str, body: &str) {
        for &i in which {
            let h = &self.hosts[i];
            h.nginx
                .wait_for_body(&Nginx::upstream_path(name), body, WAIT)
                .unwrap_or_else(|e| panic!("{}: {e}; log: {}", h.id, h.daemon.log_text()));
        }
    }

    /// Waits until `viewer`'s fleet view of `name` shows each of `want` (host id, state).
    pub fn wait_fleet(&self, viewer: usize, name: &str, want: &[(&str, &str)]) -> Vec<Value> {
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
    pub fn add(&self, i: usize, name: &str) {
        let out =
            self.hosts[i]
                .daemon
                .binding_add(name, "count", "c", "web", &[], &["--interval", "10"]);
        assert_ok(&out, &format!("binding add {name} on {}", self.hosts[i].id));
    }
}

/// Asks every listed host's nginx for `name` every 100 ms; records any answer that is not one of
/// the backends' bodies.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    bad: Arc<Mutex<Vec<String>>>,
    handle: Option<JoinHandle<()>>,
}

impl Watcher {
    pub fn start(ports: Vec<u16>, name: &str) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(Mutex::new(Vec::new()));
        let (s, b) = (stop.clone(), bad.clone());
        let path = Nginx::upstream_path(name);
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

    pub fn finish(mut self) -> Vec<String> {
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

pub const ALL: [usize; 3] = [0, 1, 2];

pub fn applied_all(f: &Fleet, viewer: usize, name: &str) -> Vec<Value> {
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
