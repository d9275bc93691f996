//! Test support shared by the `dns`, `etcd` and `file` plugins' tests (included with `#[path]`):
//! a plugin folder pointing at the built binary, the real `tributary serve` daemon managing a real
//! nginx (testkit), the `binding` CLI, and a poller. Every process started here stops on drop.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tributary_testkit::{free_port, TestNginx};

/// How long the polls below wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// The plugin crate's own folder (`plugins/<name>`).
pub fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `tributary` daemon binary, built next to the plugin binary `plugin_bin` by
/// `cargo build --workspace --bins`. Panics with that hint when it is missing.
pub fn tributary_bin(plugin_bin: &Path) -> PathBuf {
    let bin = plugin_bin.parent().expect("bin dir").join("tributary");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

/// Writes `<plugins>/<name>/plugin.json`: this crate's real manifest with `executable` set to the
/// built binary, and `conformance.json` when a sample is given. Returns the plugin folder.
pub fn plugin_folder(
    plugins: &Path,
    name: &str,
    plugin_bin: &Path,
    conformance: Option<Value>,
) -> PathBuf {
    let dir = plugins.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(source_dir().join("plugin.json")).unwrap();
    let mut m: Value = serde_json::from_str(&text).unwrap();
    m["executable"] = json!(plugin_bin.display().to_string());
    std::fs::write(dir.join("plugin.json"), m.to_string()).unwrap();
    if let Some(sample) = conformance {
        std::fs::write(dir.join("conformance.json"), sample.to_string()).unwrap();
    }
    dir
}

/// Polls `f` until it returns `Some`, panicking with `what` (and the last value seen) after `WAIT`.
pub fn poll<T>(what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => {
                assert!(Instant::now() < deadline, "{what}: timed out; last: {last}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// A running `tributary serve` managing `nginx`'s conf dir, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Daemon {
    child: Option<Child>,
    bin: PathBuf,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on a free port with the plugins directory `plugins`, a short reload gap
    /// and batch window.
    pub fn start(bin: PathBuf, root: &Path, plugins: &Path, nginx: &TestNginx) -> Daemon {
        let port = free_port();
        let data_dir = root.join("data");
        let log = root.join("daemon.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(&bin)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--plugins-dir")
            .arg(plugins)
            .arg("--conf-dir")
            .arg(nginx.conf_dir())
            .args(["--test-cmd", &nginx.test_cmd().join(" ")])
            .args(["--reload-cmd", &nginx.reload_cmd().join(" ")])
            .args(["--min-reload-gap-ms", "100", "--batch-quiet-ms", "50"])
            .env_remove("TRIBUTARY_TOKEN")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("spawn tributary serve");
        let mut d = Daemon {
            child: Some(child),
            bin,
            port,
            data_dir,
            log,
        };
        poll("tributary serve answers /api/v1/health", || {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tributary serve exited with {status}: {}", d.log_text());
            }
            match http_get(port, "/api/v1/health") {
                Ok(200) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        d
    }

    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `tributary ARGS --api ... --data-dir ...`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .args(args)
            .args(["--api", &format!("http://127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .env_remove("TRIBUTARY_TOKEN")
            .output()
            .expect("run tributary")
    }

    /// [`Daemon::cli`] with `--json`: (success, parsed stdout, all output as text).
    pub fn cli_json(&self, args: &[&str]) -> (bool, Value, String) {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli(&a);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("tributary {args:?} --json printed no JSON ({e}): {text}"));
        (out.status.success(), v, text)
    }

    /// `binding show NAME --json` → the binding object.
    pub fn show(&self, name: &str) -> Value {
        let (ok, v, text) = self.cli_json(&["binding", "show", name]);
        assert!(ok, "binding show {name}: {text}");
        v["binding"].clone()
    }

    /// Stops the daemon (SIGTERM, SIGKILL after 15 s). Idempotent.
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

/// `GET path` on 127.0.0.1:port; the status code.
fn http_get(port: u16, path: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad HTTP answer"))
}

/// Asserts a CLI run succeeded; returns stdout.
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

/// The backend names nginx answers through `/u/<upstream>/` over `rounds` requests (round robin).
pub fn backends_seen(nginx: &TestNginx, upstream: &str, rounds: usize) -> Vec<String> {
    let mut seen: Vec<String> = (0..rounds)
        .filter_map(|_| {
            let (status, body) = nginx.get(&TestNginx::upstream_path(upstream));
            (status == 200).then_some(body)
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// Polls nginx until the set of backends answering for `upstream` is exactly `want`.
pub fn wait_backends(nginx: &TestNginx, upstream: &str, want: &[&str]) {
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    let mut check = || {
        let seen = backends_seen(nginx, upstream, want.len() * 4);
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    };
    poll(&format!("nginx serves {want:?} for {upstream}"), &mut check);
    // The worker of the previous configuration may still answer for a moment: wait until it has
    // gone, then check again.
    nginx.wait_settled(WAIT).unwrap();
    poll(
        &format!("nginx serves {want:?} for {upstream} after settling"),
        check,
    );
}

/// Runs `tributary plugin check DIR` and asserts the plugin conforms with nothing skipped but the
/// "missing required field" check when `no_required_fields` (a provider without required fields).
pub fn assert_cli_check_passes(tributary: &Path, dir: &Path, no_required_fields: bool) {
    let out = Command::new(tributary)
        .args(["plugin", "check"])
        .arg(dir)
        .output()
        .expect("run tributary plugin check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "tributary plugin check failed: {text}"
    );
    for line in text.lines().filter(|l| l.contains("SKIP")) {
        assert!(
            no_required_fields && line.contains("missing required field"),
            "a check was skipped: {text}"
        );
    }
    assert!(text.contains("conforms"), "{text}");
}
