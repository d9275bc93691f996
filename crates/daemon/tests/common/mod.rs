//! Shared harness of the daemon's end-to-end tests: the real `tributary` binary, the real
//! `static` plugin process, a real nginx (testkit). Every process is stopped on drop.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tributary_testkit::{free_port, TestNginx};

/// The `tributary` binary under test.
pub fn tributary_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tributary"))
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// The built `tributary-plugin-static` binary (next to the `tributary` binary).
pub fn static_plugin_bin() -> PathBuf {
    let bin = tributary_bin()
        .parent()
        .expect("bin dir")
        .join("tributary-plugin-static");
    assert!(
        bin.is_file(),
        "{} is missing: build the plugins first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

/// A plugins directory holding only the `static` plugin: its real manifest from
/// `plugins/static/plugin.json`, with `executable` pointing at the built binary.
pub fn static_plugins_dir(root: &Path) -> PathBuf {
    let src = workspace_root().join("plugins/static/plugin.json");
    let text =
        std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    let mut manifest: serde_json::Value = serde_json::from_str(&text).expect("static manifest");
    manifest["executable"] = serde_json::Value::String(static_plugin_bin().display().to_string());
    let dir = root.join("plugins");
    std::fs::create_dir_all(dir.join("static")).unwrap();
    std::fs::write(
        dir.join("static/plugin.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    dir
}

/// The plugin host's misbehaving test plugin (`tributary-testplug`), next to the `tributary` binary.
pub fn testplug_bin() -> PathBuf {
    let bin = tributary_bin()
        .parent()
        .expect("bin dir")
        .join("tributary-testplug");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

/// Adds the misbehaving test plugin as `testplug` (provider `t`: a secret `token`, a plain
/// `note`) to the plugins directory `dir`. Its `service` picks the behaviour (`ok`, `hang`,
/// `exit`, `garbage`, `config-error`, ...; see `crates/plugin-host/src/bin/tributary-testplug.rs`).
pub fn add_testplug(dir: &Path) {
    let manifest = serde_json::json!({
        "name": "testplug",
        "version": "0.1.0",
        "description": "misbehaves on purpose",
        "executable": testplug_bin().display().to_string(),
        "capabilities": ["upstream.discovery"],
        "permissions": ["network"],
        "discovery": {"providers": [{
            "code": "t",
            "name": "Test",
            "configuration": {"fields": [
                {"key": "token", "display_name": "Token", "secret": true},
                {"key": "note", "display_name": "Note"}
            ]}
        }]}
    });
    std::fs::create_dir_all(dir.join("testplug")).unwrap();
    std::fs::write(
        dir.join("testplug/plugin.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

/// A minimal blocking HTTP/1.1 request (Connection: close). Returns status and body.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the daemon");
    s.set_read_timeout(Some(Duration::from_secs(150))).unwrap();
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP answer: {text:?}"));
    (status, body.to_string())
}

/// A running `tributary serve`, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Daemon {
    child: Option<Child>,
    pub port: u16,
    pub data_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub conf_dir: PathBuf,
    pub log: PathBuf,
    test_cmd: String,
    reload_cmd: String,
    extra: Vec<String>,
}

impl Daemon {
    /// Starts a daemon on a free port managing `nginx`'s conf dir, with a short reload gap and
    /// batch window so tests run fast.
    pub fn start(root: &Path, nginx: &TestNginx) -> Daemon {
        Daemon::start_with(
            root,
            nginx,
            &["--min-reload-gap-ms", "100", "--batch-quiet-ms", "50"],
        )
    }

    /// Starts a daemon with extra `serve` arguments (none: the defaults).
    pub fn start_with(root: &Path, nginx: &TestNginx, extra: &[&str]) -> Daemon {
        let plugins_dir = static_plugins_dir(root);
        if extra.contains(&"--with-testplug") {
            add_testplug(&plugins_dir);
        }
        let extra: Vec<&str> = extra
            .iter()
            .copied()
            .filter(|a| *a != "--with-testplug")
            .collect();
        let mut d = Daemon {
            child: None,
            port: 0,
            data_dir: root.join("data"),
            plugins_dir,
            conf_dir: nginx.conf_dir(),
            log: root.join("daemon.log"),
            test_cmd: nginx.test_cmd().join(" "),
            reload_cmd: nginx.reload_cmd().join(" "),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        d.spawn();
        d
    }

    /// Starts the process (again) with the same data dir, on a new free port.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.port = free_port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(tributary_bin())
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--plugins-dir")
            .arg(&self.plugins_dir)
            .arg("--conf-dir")
            .arg(&self.conf_dir)
            .args(["--test-cmd", &self.test_cmd])
            .args(["--reload-cmd", &self.reload_cmd])
            .args(&self.extra)
            .env_remove("TRIBUTARY_TOKEN")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn tributary serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!("tributary serve exited with {status}: {}", self.log_text());
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && http(self.port, "GET", "/api/v1/health", None, None).0 == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tributary serve did not answer in time: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The API token the daemon created.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .expect("token file")
            .trim()
            .to_string()
    }

    /// Runs `tributary ARGS --api ... --data-dir ...` (for `binding` commands).
    pub fn cli(&self, args: &[&str]) -> Output {
        let out = Command::new(tributary_bin())
            .args(args)
            .args(["--api", &format!("http://127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .env_remove("TRIBUTARY_TOKEN")
            .output()
            .expect("run tributary");
        out
    }

    /// Like [`Daemon::cli`] with `--json`, parsing stdout.
    pub fn cli_json(&self, args: &[&str]) -> (bool, serde_json::Value) {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli(&a);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "tributary {args:?} --json printed no JSON ({e}); stdout: {} stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.success(), v)
    }

    /// An authenticated API call.
    pub fn api(&self, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
        let (status, text) = http(self.port, method, path, Some(&self.token()), body);
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        (status, v)
    }

    /// Polls `GET /api/v1/bindings/{name}` until `pred` holds for the detail; returns it.
    pub fn wait_for(
        &self,
        name: &str,
        mut pred: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, v) = self.api("GET", &format!("/api/v1/bindings/{name}"), None);
            if status == 200 && pred(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "binding {name}: condition not met; last: {v}; log: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the daemon gracefully (SIGTERM), killing it after 15 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
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
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Asserts a CLI run succeeded, showing its output otherwise.
pub fn assert_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): stdout: {} stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Asserts a CLI run failed; returns stdout + stderr.
pub fn assert_fails(out: &Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{what} should have failed: {text}");
    text
}
