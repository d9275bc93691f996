//! A real 3-member (or n-member) etcd cluster (Debian's `etcd-server`) on free 127.0.0.1 client
//! and peer ports with temporary data dirs, for the fleet store's tests: kill one member with
//! SIGKILL and restart it on its data, kill them all, restart them all, dump every key under a
//! prefix (through the v3 JSON gateway, as an operator's `etcdctl get --prefix` would see it),
//! with each key's version when a test counts how often a key was written. Every member is
//! stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::json;
use tributary_testkit::{wait_ready, NotReady};

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    /// Extra flags of every member (e.g. `--max-request-bytes`).
    flags: Vec<String>,
}

impl EtcdCluster {
    /// Starts `n` members on free ports and waits until each answers a linearizable read (a
    /// leader is elected). A port taken by another process between its choice and etcd's bind
    /// (tests run in parallel) makes a member exit: the cluster is started anew on new ports, up
    /// to 5 times.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with_flags(n, &[])
    }

    /// [`EtcdCluster::start`] with `flags` added to every member's command line (also at a
    /// restart), e.g. `["--max-request-bytes", "65536"]`.
    pub fn start_with_flags(n: usize, flags: &[&str]) -> EtcdCluster {
        let mut last = String::new();
        for _ in 0..5 {
            match EtcdCluster::try_start(n, flags) {
                Ok(c) => return c,
                Err(why) => last = why,
            }
        }
        panic!("etcd cluster did not start: {last}");
    }

    fn try_start(n: usize, flags: &[&str]) -> Result<EtcdCluster, String> {
        let mut c = EtcdCluster {
            dir: tempfile::tempdir().unwrap(),
            members: (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: tributary_testkit::free_port(),
                    peer_port: tributary_testkit::free_port(),
                    child: None,
                })
                .collect(),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        };
        for i in 0..n {
            c.spawn(i);
        }
        for i in 0..n {
            c.try_wait_ready(i, Duration::from_secs(30))?;
        }
        Ok(c)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    fn spawn(&mut self, i: usize) {
        let cluster = self.initial_cluster();
        let data = self.data_dir(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .unwrap();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(crate::etcd::binary())
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "tributary-test"])
            // Quick elections on loopback: a killed leader is replaced within a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "warn"])
            .args(&self.flags)
            .env_remove("ETCDCTL_API")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn etcd");
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` (e.g. after [`EtcdCluster::restart`]) answers a linearizable read.
    pub fn wait_ready(&mut self, i: usize, limit: Duration) {
        if let Err(why) = self.try_wait_ready(i, limit) {
            panic!("{why}");
        }
    }

    fn try_wait_ready(&mut self, i: usize, limit: Duration) -> Result<(), String> {
        let port = self.members[i].client_port;
        let child = self.members[i]
            .child
            .as_mut()
            .ok_or_else(|| format!("etcd member {i} is not running"))?;
        let ready = wait_ready(child, limit, || {
            crate::etcd::post_json(port, "/v3/kv/range", &json!({"key": "AA=="}), None)
                .is_ok_and(|v| v.get("header").is_some())
        });
        ready.map_err(|why| {
            if matches!(why, NotReady::Exited(_)) {
                self.members[i].child = None;
            }
            format!("etcd member {i} {why}: {}", self.log_text(i))
        })
    }

    pub fn log_text(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// SIGKILLs member `i` (its data dir stays). Idempotent.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILLs every member.
    pub fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// Starts member `i` again on its ports and data (it rejoins the cluster).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// Starts every stopped member again and waits until each answers.
    pub fn restart_all(&mut self) {
        let stopped: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].child.is_none())
            .collect();
        for &i in &stopped {
            self.spawn(i);
        }
        for i in 0..self.members.len() {
            self.wait_ready(i, Duration::from_secs(30));
        }
    }

    /// Copies every member's data dir to `to` (a file-level backup of the whole cluster): the
    /// members are stopped for the copy and started again.
    pub fn backup(&mut self, to: &std::path::Path) {
        self.kill_all();
        for i in 0..self.members.len() {
            copy_dir(&self.data_dir(i), &to.join(&self.members[i].name));
        }
        self.restart_all();
    }

    /// Restores the cluster from a [`EtcdCluster::backup`]: every member stopped, its data dir
    /// replaced by the backup's, started again. Its revision goes back to the backup's.
    pub fn restore(&mut self, from: &std::path::Path) {
        self.kill_all();
        for i in 0..self.members.len() {
            let data = self.data_dir(i);
            std::fs::remove_dir_all(&data).unwrap();
            copy_dir(&from.join(&self.members[i].name), &data);
        }
        self.restart_all();
    }

    /// Puts `value` at `key` through any live member, as an operator's (or an intruder's)
    /// `etcdctl put` would.
    pub fn put(&self, key: &str, value: &[u8]) {
        let body = json!({"key": B64.encode(key), "value": B64.encode(value)});
        for m in &self.members {
            if m.child.is_none() {
                continue;
            }
            if let Ok(v) = crate::etcd::post_json(m.client_port, "/v3/kv/put", &body, None) {
                if v.get("header").is_some() {
                    return;
                }
            }
        }
        panic!("no etcd member took the put of {key}");
    }

    /// Every key and value under `prefix`, read from any live member (values as text, lossy).
    pub fn dump(&self, prefix: &str) -> Vec<(String, String)> {
        self.dump_versions(prefix)
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect()
    }

    /// Every key under `prefix` with its value and version (how many times it was written since
    /// it was created), read from any live member.
    pub fn dump_versions(&self, prefix: &str) -> Vec<DumpedKey> {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().expect("non-empty prefix") += 1;
        let body = json!({"key": B64.encode(prefix), "range_end": B64.encode(&end)});
        for m in &self.members {
            if m.child.is_none() {
                continue;
            }
            let Ok(v) = crate::etcd::post_json(m.client_port, "/v3/kv/range", &body, None) else {
                continue;
            };
            if v.get("header").is_none() {
                continue;
            }
            let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
            return kvs
                .iter()
                .map(|kv| {
                    let dec = |f: &str| {
                        String::from_utf8_lossy(
                            &B64.decode(kv[f].as_str().unwrap_or("")).unwrap_or_default(),
                        )
                        .into_owned()
                    };
                    // The JSON gateway writes int64 fields as strings.
                    let version = kv["version"]
                        .as_str()
                        .and_then(|v| v.parse().ok())
                        .or_else(|| kv["version"].as_i64())
                        .unwrap_or(0);
                    DumpedKey {
                        key: dec("key"),
                        value: dec("value"),
                        version,
                    }
                })
                .collect();
        }
        panic!("no etcd member answered the dump");
    }
}

/// One key of [`EtcdCluster::dump_versions`].
#[derive(Debug, Clone)]
pub struct DumpedKey {
    pub key: String,
    /// As text (lossy).
    pub value: String,
    /// etcd's version of the key: 1 after its creation, +1 per later write.
    pub version: i64,
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Copies the directory tree `from` to `to` (created).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
