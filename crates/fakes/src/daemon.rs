//! The plugin side of an end-to-end test, shared by every discovery plugin's tests and benches and
//! by the daemon's own end-to-end tests: a plugins directory holding one plugin (its real
//! `plugin.json`, `executable` pointing at the built binary) and optionally the plugin host's
//! misbehaving `tributary-testplug`, `tributary plugin check`, and the real `tributary serve`
//! managing a [`Nginx`]. Stopped on drop (also on panic).

use std::ffi::OsString;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_testkit::client::http_request_within;
use tributary_testkit::{free_port, listening, wait_ready, Nginx, NotReady};

/// Writes `<plugins>/<name>/plugin.json` (`name` from the manifest): the real manifest of the plugin
/// whose source folder is `plugin_src`, with `executable` set to the built binary `bin`, and
/// `conformance.json` when a sample is given. Returns the plugin folder.
pub fn plugin_folder(
    plugins: &Path,
    plugin_src: &Path,
    bin: &Path,
    conformance: Option<&Value>,
) -> PathBuf {
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    let text = std::fs::read_to_string(plugin_src.join("plugin.json")).expect("plugin.json");
    let mut manifest: Value = serde_json::from_str(&text).expect("plugin.json is JSON");
    let name = manifest["name"].as_str().expect("name").to_string();
    manifest["executable"] = Value::String(bin.display().to_string());
    let dir = plugins.join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("plugin.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    if let Some(sample) = conformance {
        std::fs::write(dir.join("conformance.json"), sample.to_string()).unwrap();
    }
    dir
}

/// `<root>/plugins` holding the plugin of [`plugin_folder`] (no conformance sample).
pub fn plugins_dir(root: &Path, plugin_src: &Path, bin: &Path) -> PathBuf {
    let dir = root.join("plugins");
    plugin_folder(&dir, plugin_src, bin, None);
    dir
}

/// The binary `name`, next to `sibling` (another binary cargo built into the same folder).
pub fn sibling_bin(sibling: &Path, name: &str) -> PathBuf {
    let bin = sibling.parent().expect("bin dir").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

/// The `tributary` binary, next to `sibling` (see [`sibling_bin`]).
pub fn tributary_bin(sibling: &Path) -> PathBuf {
    sibling_bin(sibling, "tributary")
}

/// Adds the plugin host's misbehaving test plugin (the built `tributary-testplug` at `bin`) to the
/// plugins directory `plugins` as `testplug`: provider `t` with a secret `token`, a plain
/// `note` and an `endpoint` field `address`, and provider `n` as a third-party manifest may
/// declare it (secrets `token` and `key`, `note` and `address` marked nothing); its `service` picks the behaviour (`ok`, `hang`, `exit`, `garbage`, `config-error`, ...;
/// see `crates/plugin-host/src/bin/tributary-testplug.rs`).
pub fn add_testplug(plugins: &Path, bin: &Path) {
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        bin.display()
    );
    let manifest = serde_json::json!({
        "name": "testplug",
        "version": "0.1.0",
        "description": "misbehaves on purpose",
        "executable": bin.display().to_string(),
        "capabilities": ["upstream.discovery"],
        "permissions": ["network"],
        "discovery": {"providers": [{
            "code": "t",
            "name": "Test",
            "configuration": {"fields": [
                {"key": "token", "display_name": "Token", "secret": true},
                {"key": "note", "display_name": "Note"},
                {"key": "address", "display_name": "Address", "endpoint": true}
            ]}
        }, {
            "code": "n",
            "name": "Test, no endpoint marked",
            "configuration": {"fields": [
                {"key": "token", "display_name": "Token", "secret": true},
                {"key": "note", "display_name": "Note"},
                {"key": "address", "display_name": "Address"},
                {"key": "key", "display_name": "Key", "secret": true}
            ]}
        }]}
    });
    let dir = plugins.join("testplug");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("plugin.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

/// stdout then stderr of a finished command, as text.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts a command succeeded; returns its stdout.
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

/// Asserts a command failed; returns its stdout then stderr.
pub fn assert_fails(out: &Output, what: &str) -> String {
    let text = output_text(out);
    assert!(!out.status.success(), "{what} should have failed: {text}");
    text
}

/// Runs `tributary plugin check DIR` (the CLI's conformance checker); returns (success, output).
pub fn plugin_check_cli(tributary: &Path, dir: &Path) -> (bool, String) {
    let out = Command::new(tributary)
        .args(["plugin", "check"])
        .arg(dir)
        .output()
        .expect("run tributary plugin check");
    (out.status.success(), output_text(&out))
}

/// Runs `tributary plugin check DIR` and asserts the plugin conforms with nothing skipped but the
/// "missing required field" check when `no_required_fields` (a provider without required fields).
pub fn assert_cli_check_passes(tributary: &Path, dir: &Path, no_required_fields: bool) {
    let (ok, text) = plugin_check_cli(tributary, dir);
    assert!(ok, "tributary plugin check failed: {text}");
    for line in text.lines().filter(|l| l.contains("SKIP")) {
        assert!(
            no_required_fields && line.contains("missing required field"),
            "a check was skipped: {text}"
        );
    }
    assert!(text.contains("conforms"), "{text}");
}

/// The `serve` arguments of [`Daemon::start`]: a short reload gap and batch window, a 10 s plugin
/// timeout.
pub const FAST: &[&str] = &[
    "--min-reload-gap-ms",
    "100",
    "--batch-quiet-ms",
    "50",
    "--plugin-timeout-secs",
    "10",
];

/// A running `tributary serve` with `RUST_LOG=debug` (or the caller's `RUST_LOG`), its stderr in
/// [`Daemon::log`].
pub struct Daemon {
    child: Option<Child>,
    bin: PathBuf,
    /// The `serve` arguments after `--listen`.
    args: Vec<OsString>,
    pub port: u16,
    pub data_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub conf_dir: PathBuf,
    pub log: PathBuf,
    /// Extra environment variables of the daemon process (applied at the next [`Daemon::spawn`]).
    pub env: Vec<(OsString, OsString)>,
}

impl Daemon {
    /// Starts the daemon with the [`FAST`] arguments (see [`Daemon::start_with`]).
    pub fn start(bin: &Path, root: &Path, plugins: &Path, nginx: &Nginx) -> Daemon {
        Daemon::start_with(bin, root, plugins, nginx, FAST)
    }

    /// Starts the daemon `bin` on a free port with `plugins` as plugins dir and `<root>/data` as
    /// data dir, managing `nginx`'s conf dir, with the `serve` arguments `extra` (none: the
    /// daemon's defaults). Returns once `/api/v1/health` answers.
    pub fn start_with(
        bin: &Path,
        root: &Path,
        plugins: &Path,
        nginx: &Nginx,
        extra: &[&str],
    ) -> Daemon {
        let data_dir = root.join("data");
        let conf_dir = nginx.conf_dir();
        let mut args: Vec<OsString> = vec![
            "--data-dir".into(),
            data_dir.clone().into(),
            "--plugins-dir".into(),
            plugins.into(),
            "--conf-dir".into(),
            conf_dir.clone().into(),
            "--test-cmd".into(),
            nginx.test_cmd().join(" ").into(),
            "--reload-cmd".into(),
            nginx.reload_cmd().join(" ").into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        let log = root.join("daemon.log");
        std::fs::File::create(&log).unwrap();
        let mut d = Daemon {
            child: None,
            bin: bin.to_path_buf(),
            args,
            port: 0,
            data_dir,
            plugins_dir: plugins.to_path_buf(),
            conf_dir,
            log,
            env: Vec::new(),
        };
        d.spawn();
        d
    }

    /// Starts the process (again, after [`Daemon::stop`]) with the same arguments and data dir, on a
    /// new free port, appending to the same log. Returns once `/api/v1/health` answers.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "tributary serve is already running");
        self.port = free_port();
        let logf = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.bin)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .args(&self.args)
            .env_remove("TRIBUTARY_TOKEN")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "debug".to_string()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(logf))
            .spawn()
            .expect("spawn tributary serve");
        let port = self.port;
        let child = self.child.insert(child);
        let ready = wait_ready(child, Duration::from_secs(30), || {
            listening(port) && http(port, "GET", "/api/v1/health", None, None).0 == 200
        });
        if let Err(why) = ready {
            if matches!(why, NotReady::Exited(_)) {
                self.child = None;
            }
            panic!("tributary serve {why}: {}", self.log_text());
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

    /// The API token.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("token"))
            .expect("token file")
            .trim()
            .to_string()
    }

    /// An authenticated API call; the body parsed as JSON (`Null` when it is not).
    pub fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.api_raw(method, path, body.map(Value::to_string).as_deref())
    }

    /// [`Daemon::api`] with the body sent as is (also text that is not JSON).
    pub fn api_raw(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = http(self.port, method, path, Some(&self.token()), body);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
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

    /// `tributary binding add NAME --plugin PLUGIN --provider PROVIDER --service SERVICE`, a
    /// `--config` per `key=value` of `config`, then `extra` (e.g. `--replace`, `--interval 10`).
    /// Each value goes through a file (`--config key=@FILE`, mode 0600, next to the data dir), the
    /// way secret fields must be given (the CLI refuses them inline).
    pub fn binding_add(
        &self,
        name: &str,
        plugin: &str,
        provider: &str,
        service: &str,
        config: &[&str],
        extra: &[&str],
    ) -> Output {
        let mut args = vec!["binding", "add", name];
        args.extend([
            "--plugin",
            plugin,
            "--provider",
            provider,
            "--service",
            service,
        ]);
        let files = self.data_dir.with_file_name("cli-config");
        std::fs::create_dir_all(&files).unwrap();
        let mut owned = Vec::new();
        for (i, kv) in config.iter().enumerate() {
            let (k, v) = kv.split_once('=').expect("config entries are key=value");
            let path = files.join(format!("{name}-{i}-{k}"));
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut f, v.as_bytes()).unwrap();
            owned.push(format!("{k}=@{}", path.display()));
        }
        for kv in &owned {
            args.extend(["--config", kv.as_str()]);
        }
        args.extend(extra);
        self.cli(&args)
    }

    /// [`Daemon::cli`]: (success, stdout + stderr).
    pub fn cli_text(&self, args: &[&str]) -> (bool, String) {
        let out = self.cli(args);
        (out.status.success(), output_text(&out))
    }

    /// [`Daemon::cli`] with `--json`: (success, parsed stdout, all output as text).
    pub fn cli_json(&self, args: &[&str]) -> (bool, Value, String) {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli(&a);
        let text = output_text(&out);
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("tributary {args:?} --json printed no JSON ({e}): {text}"));
        (out.status.success(), v, text)
    }

    /// `binding show NAME --json`: the binding object.
    pub fn show(&self, name: &str) -> Value {
        let (ok, v, text) = self.cli_json(&["binding", "show", name]);
        assert!(ok, "binding show {name}: {text}");
        v["binding"].clone()
    }

    /// Polls the binding's detail until `pred` holds (at most `timeout`); returns it.
    pub fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        crate::wait::poll_for(&format!("binding {name}: condition"), timeout, || {
            let (status, v) = self.api("GET", &format!("/api/v1/bindings/{name}"), None);
            if status == 200 && pred(&v) {
                Ok(v)
            } else {
                Err(format!("{status} {v}; log: {}", self.log_text()))
            }
        })
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after 15 s).
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

/// A blocking HTTP/1.1 request to the daemon on 127.0.0.1:`port` (testkit's client, one
/// connection, `Host: 127.0.0.1:PORT` as the daemon's host check wants, a JSON content type, a
/// bearer token when given); `(status, body)`. Waits up to 150 s for the answer (a bulk save on a
/// loaded machine). Panics when the daemon cannot be reached or answers no HTTP.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let body = body.unwrap_or("");
    let host = format!("127.0.0.1:{port}");
    let auth = token.map(|t| format!("Bearer {t}"));
    let length = body.len().to_string();
    let mut headers = vec![
        ("Host", host.as_str()),
        ("Content-Type", "application/json"),
        ("Content-Length", length.as_str()),
    ];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let r = http_request_within(
        port,
        method,
        path,
        &headers,
        body.as_bytes(),
        Duration::from_secs(150),
    )
    .unwrap_or_else(|e| {
        let why = e.message().unwrap_or("no answer");
        panic!("{method} {path} to the daemon on port {port}: {why}")
    });
    (r.status, r.text())
}
