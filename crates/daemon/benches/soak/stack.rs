//! The system under test, started as a user would: a front nginx (master + 2 workers, the
//! combined-upstreams module, its upstreams API on a unix socket), `tributary serve --apply live`
//! with the real `file` plugin, and the registry file that plugin reads. The backends are a
//! separate nginx that no fault touches. Also the `/proc` helpers (children, RSS, signals).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tributary_testkit::{free_port, procfs, Nginx};

use crate::client;

/// The upstreams (one binding each, service of the same name in the registry) and the extra
/// directives of each: round robin with upstream keep-alive, least_conn, plain round robin.
pub const BINDINGS: &[(&str, &[&str])] = &[
    ("web", &["keepalive 8;"]),
    ("api", &["least_conn;"]),
    ("img", &[]),
];

/// Backends in the pool the registry draws from.
pub const BACKENDS: usize = 6;

/// Bytes of the long-lived answer and the backend's `limit_rate` (bytes/s): a 25 s stream.
pub const SLOW_BYTES: usize = 50_000;
const SLOW_RATE: usize = 2_000;

/// The backends: one nginx, not the one under test, never signalled by the soak. Each backend
/// `bN` answers `bN` to any path, and a 25 s stream of [`SLOW_BYTES`] to a path ending in `/slow`.
pub fn start_backends() -> (Nginx, Vec<u16>) {
    let ports: Vec<u16> = (0..BACKENDS).map(|_| free_port()).collect();
    let mut b = Nginx::builder()
        .workers(1)
        .without_upstreams_glob()
        .conf_file("slow/slow.bin", vec![b'x'; SLOW_BYTES])
        // The soak reports this log's `[alert]`/`[crit]`/`[emerg]` lines (checks::scan_log).
        .own_log_check();
    for (i, port) in ports.iter().enumerate() {
        b = b.http_snippet(&format!(
            "server {{\n    listen 127.0.0.1:{port};\n    location / {{ return 200 \"b{i}\"; }}\n    \
             location ~ /slow$ {{ root conf/slow; try_files /slow.bin =404; limit_rate {SLOW_RATE}; }}\n}}"
        ));
    }
    (b.start(), ports)
}

/// The nginx under test: 2 workers, the module, its API with `write=on` on a unix socket, every
/// answer naming its worker (`X-Worker`), HTTP/1.1 to the upstreams (so `keepalive` works).
/// The soak checks its error log itself (`checks::scan_log`: a worker's `exited on signal 9` is
/// explained only by a pid the soak killed; requests cut by the kills log `[error]` lines).
pub fn start_front() -> Nginx {
    Nginx::builder()
        .workers(2)
        .own_log_check()
        .live_api("")
        .http_snippet(
            "add_header X-Worker $pid always;\nproxy_http_version 1.1;\nproxy_set_header Connection \"\";",
        )
        .start()
}

/// The module API's unix socket of `front`.
pub fn api_socket(front: &Nginx) -> PathBuf {
    front.prefix().join("logs/api.sock")
}

/// The registry: a JSON file the `file` plugin reads, replaced atomically (temp file + rename).
pub struct Registry {
    pub path: PathBuf,
    ports: Vec<u16>,
    rng: fastrand::Rng,
    pub writes: u64,
}

impl Registry {
    pub fn new(dir: &Path, ports: Vec<u16>, seed: u64) -> Registry {
        let mut r = Registry {
            path: dir.join("services.json"),
            ports,
            rng: fastrand::Rng::with_seed(seed),
            writes: 0,
        };
        r.rotate();
        r
    }

    /// Writes a new registry: for each service a random non-empty subset of the backends, each with
    /// a random weight 1–5.
    pub fn rotate(&mut self) {
        let mut doc = serde_json::Map::new();
        for (name, _) in BINDINGS {
            let mut servers = Vec::new();
            while servers.is_empty() {
                for port in &self.ports {
                    if self.rng.bool() {
                        let w = self.rng.u32(1..=5);
                        servers.push(Value::String(format!("127.0.0.1:{port}:{w}")));
                    }
                }
            }
            doc.insert((*name).to_string(), Value::Array(servers));
        }
        let tmp = self.path.with_extension("json.tmp");
        fs::write(&tmp, Value::Object(doc).to_string()).expect("write the registry");
        fs::rename(&tmp, &self.path).expect("rename the registry");
        self.writes += 1;
    }
}

/// `tributary serve`, restarted after a kill as systemd's `Restart=` would: same arguments, same
/// port, same data dir, its log appended.
pub struct DaemonProc {
    bin: PathBuf,
    args: Vec<String>,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    pub starts: u32,
}

impl DaemonProc {
    pub fn new(bin: &Path, root: &Path, plugins: &Path, front: &Nginx) -> DaemonProc {
        let data_dir = root.join("data");
        let args = vec![
            "serve".to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--plugins-dir".into(),
            plugins.display().to_string(),
            "--conf-dir".into(),
            front.conf_dir().display().to_string(),
            "--test-cmd".into(),
            front.test_cmd().join(" "),
            "--reload-cmd".into(),
            front.reload_cmd().join(" "),
            "--apply".into(),
            "live".into(),
            "--live-api".into(),
            front.live_api_address(),
        ];
        DaemonProc {
            bin: bin.to_path_buf(),
            args,
            port: free_port(),
            data_dir,
            log: root.join("daemon.log"),
            child: None,
            starts: 0,
        }
    }

    /// Starts the process; returns once `/api/v1/health` answers 200 (or why it did not, in 60 s).
    pub fn spawn(&mut self) -> Result<(), String> {
        let logf = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args(&self.args[..1])
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(&self.args[1..])
            .env_remove("TRIBUTARY_TOKEN")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(logf))
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("tributary serve exited with {status} at start"));
            }
            let h = client::tcp_once(
                self.port,
                "GET",
                "/api/v1/health",
                None,
                "",
                Duration::from_secs(5),
            );
            if matches!(h, Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("tributary serve did not answer in 60 s: {h:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) -> Option<u32> {
        let mut child = self.child.take()?;
        let pid = child.id();
        signal(pid, "KILL");
        let _ = child.wait();
        Some(pid)
    }

    /// Whether the process still runs (it was not killed by someone else or crashed).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM, then SIGKILL after 15 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn token(&self) -> Option<String> {
        fs::read_to_string(self.data_dir.join("token"))
            .ok()
            .map(|t| t.trim().to_string())
    }

    /// An authenticated API call: (status, body parsed as JSON, `Null` when it is not).
    pub fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let token = self.token().ok_or("no token file yet")?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let (status, text) = client::tcp_once(
            self.port,
            method,
            path,
            Some(&token),
            &body,
            Duration::from_secs(60),
        )?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Creates every binding of [`BINDINGS`] on the `file` plugin reading `registry`, waiting
    /// for its first resolution.
    pub fn add_bindings(&self, registry: &Path) -> Result<(), String> {
        for (name, directives) in BINDINGS {
            let body = json!({"plugin": "file", "provider": "file", "service": name,
                "config": {"path": registry.display().to_string()},
                "interval_secs": 10, "directives": directives});
            let (status, v) = self.api(
                "PUT",
                &format!("/api/v1/bindings/{name}?wait=true"),
                Some(&body),
            )?;
            let o = &v["binding"]["last_outcome"];
            if !(status == 200 || status == 201) || o["status"] != "ok" {
                return Err(format!("binding {name}: {status} {v}"));
            }
        }
        Ok(())
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `kill -SIG pid` (the crate forbids `unsafe`, so no `libc::kill`).
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Pids whose parent is `ppid`.
pub fn children(ppid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                == Some(ppid)
        })
        .collect()
}

/// The command line of a process (`""` when it is gone).
pub fn cmdline(pid: u32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim()
        .to_string()
}

/// `VmRSS` of a process in KiB (0 when it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The front nginx's workers that accept connections (not "shutting down").
pub fn live_workers(front: &Nginx) -> Vec<u32> {
    front
        .workers()
        .into_iter()
        .filter(|p| {
            let cmd = procfs::title(*p);
            cmd.contains("worker process") && !cmd.contains("shutting down")
        })
        .collect()
}

/// The `file` plugin's process: the daemon's child running its binary.
pub fn plugin_pid(daemon_pid: u32) -> Option<u32> {
    children(daemon_pid).into_iter().find(|pid| {
        fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.to_string_lossy().contains("tributary-plugin-file"))
            .unwrap_or(false)
    })
}

/// The servers of an upstream file: `(address, weight)` sorted.
pub fn file_set(path: &Path) -> Result<Vec<(String, u64)>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("server ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let mut words = rest.split_whitespace();
        let addr = words.next().unwrap_or("").to_string();
        let weight = words
            .find_map(|w| w.strip_prefix("weight=")?.parse().ok())
            .unwrap_or(1);
        out.push((addr, weight));
    }
    out.sort();
    Ok(out)
}

/// A short text of a set, for the report.
pub fn set_text(set: &[(String, u64)]) -> String {
    let mut s = String::new();
    for (a, w) in set {
        let _ = write!(s, "{}:w{w} ", a.rsplit(':').next().unwrap_or(a));
    }
    s.trim_end().to_string()
}
