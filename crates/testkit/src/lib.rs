//! Test fixtures for Tributary: a real nginx (Debian's package) on a free loopback port with its own
//! temporary prefix, tiny backends served by the same nginx, free ports ([`free_port`],
//! [`free_tcp_udp_port`]), a minimal HTTP client, and the plugin package a plugin's tests check
//! ([`this_plugin!`]: its built executable and source folder).
//!
//! Used as a dev-dependency only. Nothing here is mocked: [`TestNginx`] runs
//! `nginx -p DIR -c DIR/conf/nginx.conf -e stderr` as a child process (`daemon off`, master + one
//! worker, or several with [`TestNginxBuilder::workers`]) and stops it when dropped, also when the
//! test panics.
//!
//! Layout of the prefix `DIR`:
//! ```text
//! DIR/conf/nginx.conf        generated main config (see below)
//! DIR/conf/upstreams/        where tributary-apply writes `<name>.conf` (created empty)
//! DIR/conf/stop.conf         minimal config used only to signal the master on drop
//! DIR/logs/error.log         nginx's error log (level notice: reloads are visible)
//! DIR/logs/nginx.pid         pid file
//! DIR/logs/stderr.log        the master's stderr
//! ```
//! The main config has, at `http` level: `include upstreams/*.conf;` (unless disabled with
//! [`TestNginxBuilder::without_upstreams_glob`]), the caller's snippets, one `server` per backend
//! (`return 200 "<name>"`), and the main server on [`TestNginx::port`] with
//! - `GET /` → `200 tributary-testkit`
//! - `GET /u/<upstream>/...` → `proxy_pass http://<upstream>` (an upstream that does not exist gives 502).
//!
//! A missing nginx binary makes the fixture panic with a clear message; tests never skip silently.
#![forbid(unsafe_code)]

mod plugin;
mod ports;

pub use plugin::PluginPackage;
pub use ports::{free_port, free_tcp_udp_port};

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long [`TestNginx`] waits for nginx to listen after starting it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Finds the nginx binary: `$TRIBUTARY_NGINX`, else `nginx` on `PATH`, else `/usr/sbin/nginx`.
///
/// # Panics
/// When none exists, with a message telling how to install it.
pub fn nginx_binary() -> PathBuf {
    try_nginx_binary().unwrap_or_else(|e| panic!("{e}"))
}

/// Whether `unshare -n` works here (a new network namespace needs root or CAP_SYS_ADMIN).
/// Checked once per process.
pub fn network_isolation_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("unshare")
            .args(["-n", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Like [`nginx_binary`], returning the error text instead of panicking.
pub fn try_nginx_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TRIBUTARY_NGINX") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("TRIBUTARY_NGINX={} is not a file", p.display()))
        };
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("nginx"))
                .collect()
        })
        .unwrap_or_default();
    candidates.push(PathBuf::from("/usr/sbin/nginx"));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "nginx binary not found (looked in $TRIBUTARY_NGINX, PATH, /usr/sbin/nginx): \
         install Debian's nginx package (scripts/setup.sh does it)"
            .to_string()
    })
}

fn running_as_root() -> bool {
    // /proc/self is owned by the effective uid of the process reading it.
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Builder for a [`TestNginx`] with backends, extra `http`-level config and pre-created files.
#[derive(Debug, Clone)]
pub struct TestNginxBuilder {
    backends: Vec<String>,
    http_snippets: Vec<String>,
    files: Vec<(PathBuf, Vec<u8>)>,
    upstreams_glob: bool,
    workers: usize,
    /// `Some(extra)`: load the combined-upstreams module and serve its `upstreams_api` on a unix
    /// socket, `extra` being more directives of that location.
    live_api: Option<String>,
    /// The API location takes `PUT`s (`write=on`; [`TestNginxBuilder::live_api_read_only`] turns
    /// it off).
    live_api_write: bool,
}

/// Environment variable that overrides where the combined-upstreams module `.so` is looked up
/// (the same one `module/t` reads).
pub const MODULE_ENV: &str = "COMBINED_UPSTREAMS_MODULE";

/// The combined-upstreams module `.so`: `$COMBINED_UPSTREAMS_MODULE`, else the release build in
/// the target dir (`$CARGO_TARGET_DIR`, else `<workspace>/target`), as `module/t` finds it. Built
/// by `cargo build --release -p ngx-combined-upstreams` (`scripts/test.sh` does).
pub fn combined_upstreams_module() -> Result<PathBuf, String> {
    let path = match std::env::var_os(MODULE_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
            .join("release/libngx_http_combined_upstreams_module.so"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the combined-upstreams module is not at {} (build it with `cargo build --release -p \
             ngx-combined-upstreams`, or set {MODULE_ENV})",
            path.display()
        ))
    }
}

impl Default for TestNginxBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TestNginxBuilder {
    /// No backends, no snippets, `include upstreams/*.conf;` on.
    pub fn new() -> Self {
        TestNginxBuilder {
            backends: Vec::new(),
            http_snippets: Vec::new(),
            files: Vec::new(),
            upstreams_glob: true,
            workers: 1,
            live_api: None,
            live_api_write: true,
        }
    }

    /// Loads the combined-upstreams module ([`combined_upstreams_module`]) and serves its live
    /// upstreams API on a unix socket in the prefix ([`TestNginx::live_api_address`]), location
    /// `/api/` with `location_extra` (e.g. `limit_except GET { deny all; }`) before
    /// `upstreams_api write=on;`. Starting fails when the module is not built.
    pub fn live_api(mut self, location_extra: &str) -> Self {
        self.live_api = Some(location_extra.to_string());
        self
    }

    /// [`Self::live_api`] with a read-only location (`upstreams_api;`: `GET` only).
    pub fn live_api_read_only(mut self) -> Self {
        self.live_api = Some(String::new());
        self.live_api_write = false;
        self
    }

    /// Runs `n` worker processes (default 1): a reload then has to replace all of them.
    pub fn workers(mut self, n: usize) -> Self {
        assert!(n >= 1, "nginx needs at least one worker");
        self.workers = n;
        self
    }

    /// Adds a backend: a `server` of the same nginx on its own free port answering `200 <name>`
    /// (no trailing newline) to every request. `name` may hold letters, digits, `_ - .` only.
    pub fn backend(mut self, name: &str) -> Self {
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')),
            "backend name {name:?}: use letters, digits, _ - . only"
        );
        self.backends.push(name.to_string());
        self
    }

    /// Adds text at `http` level of the main config, e.g. `include upstreams/api.conf;`.
    pub fn http_snippet(mut self, text: &str) -> Self {
        self.http_snippets.push(text.to_string());
        self
    }

    /// Writes a file (path relative to the conf dir, e.g. `upstreams/api.conf`) before nginx starts.
    pub fn conf_file(mut self, relative: &str, contents: impl Into<Vec<u8>>) -> Self {
        let rel = PathBuf::from(relative);
        assert!(
            rel.is_relative() && !relative.split('/').any(|c| c == ".."),
            "conf_file path must be relative to the conf dir: {relative:?}"
        );
        self.files.push((rel, contents.into()));
        self
    }

    /// Leaves out `include upstreams/*.conf;`: only the snippets decide what is included.
    pub fn without_upstreams_glob(mut self) -> Self {
        self.upstreams_glob = false;
        self
    }

    /// Starts nginx.
    ///
    /// # Panics
    /// When nginx is missing or does not start; the message carries nginx's own output.
    pub fn start(self) -> TestNginx {
        self.try_start()
            .unwrap_or_else(|e| panic!("TestNginx failed to start: {e}"))
    }

    /// Starts nginx, returning the reason as text when it cannot. Retries with new ports when a
    /// chosen port was taken in the meantime.
    pub fn try_start(self) -> Result<TestNginx, String> {
        let binary = try_nginx_binary()?;
        if self.live_api.is_some() {
            combined_upstreams_module()?;
        }
        let mut last = String::new();
        for _attempt in 0..5 {
            match self.start_once(&binary) {
                Ok(n) => return Ok(n),
                Err(StartError::PortTaken(msg)) => last = msg,
                Err(StartError::Other(msg)) => return Err(msg),
            }
        }
        Err(format!("ports kept being taken: {last}"))
    }

    fn start_once(&self, binary: &Path) -> Result<TestNginx, StartError> {
        let other = |what: &str, e: io::Error| StartError::Other(format!("{what}: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("tributary-nginx-")
            .tempdir()
            .map_err(|e| other("create temp prefix", e))?;
        let prefix = dir.path().to_path_buf();
        for sub in ["conf/upstreams", "logs", "tmp"] {
            fs::create_dir_all(prefix.join(sub)).map_err(|e| other("create prefix dirs", e))?;
        }
        for (rel, contents) in &self.files {
            let path = prefix.join("conf").join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| other("create conf_file dir", e))?;
            }
            fs::write(&path, contents).map_err(|e| other("write conf_file", e))?;
        }

        let port = free_port();
        let backends: Vec<(String, u16)> = self
            .backends
            .iter()
            .map(|b| (b.clone(), free_port()))
            .collect();
        let config = self.render_config(&prefix, port, &backends);
        fs::write(prefix.join("conf/nginx.conf"), config).map_err(|e| other("write conf", e))?;
        let stop_conf = format!(
            "pid {};\nerror_log stderr;\nevents {{}}\n",
            prefix.join("logs/nginx.pid").display()
        );
        fs::write(prefix.join("conf/stop.conf"), stop_conf).map_err(|e| other("write conf", e))?;

        let stderr = fs::File::create(prefix.join("logs/stderr.log"))
            .map_err(|e| other("create stderr log", e))?;
        let conf_path = prefix.join("conf/nginx.conf");
        let child = Command::new(binary)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf_path)
            .args(["-e", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| other(&format!("spawn {}", binary.display()), e))?;

        let mut nginx = TestNginx {
            dir,
            port,
            backends,
            child: Some(child),
            binary: binary.to_path_buf(),
            workers: self.workers,
        };
        let mut ports = vec![port];
        ports.extend(nginx.backends.iter().map(|(_, p)| *p));
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = nginx
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                nginx.child = None;
                let output = format!(
                    "nginx exited with {status} at start-up; stderr: {}; error.log: {}",
                    nginx.stderr_log().trim(),
                    nginx.error_log().trim()
                );
                return Err(if output.contains("Address already in use") {
                    StartError::PortTaken(output)
                } else {
                    StartError::Other(output)
                });
            }
            let all_up = ports.iter().all(|p| {
                TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, *p)),
                    Duration::from_millis(200),
                )
                .is_ok()
            });
            if all_up && nginx.pid_file_written() {
                return Ok(nginx);
            }
            if Instant::now() > deadline {
                let msg = format!(
                    "nginx did not listen on {ports:?} within {STARTUP_TIMEOUT:?}; stderr: {}; error.log: {}",
                    nginx.stderr_log().trim(),
                    nginx.error_log().trim()
                );
                return Err(StartError::Other(msg));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn render_config(&self, prefix: &Path, port: u16, backends: &[(String, u16)]) -> String {
        let p = prefix.display();
        let workers = self.workers;
        let mut c = String::new();
        if self.live_api.is_some() {
            if let Ok(so) = combined_upstreams_module() {
                let _ = writeln!(c, "load_module {};", so.display());
            }
        }
        if running_as_root() {
            // Workers keep the fixture's uid so they can use the private temp prefix.
            c.push_str("user root;\n");
        }
        let _ = write!(
            c,
            "daemon off;\nmaster_process on;\nworker_processes {workers};\n\
             pid {p}/logs/nginx.pid;\nerror_log {p}/logs/error.log notice;\n\
             events {{\n    worker_connections 256;\n}}\n\
             http {{\n    access_log off;\n    default_type text/plain;\n\
             \x20   client_body_temp_path {p}/tmp/client_body;\n\
             \x20   proxy_temp_path {p}/tmp/proxy;\n\
             \x20   fastcgi_temp_path {p}/tmp/fastcgi;\n\
             \x20   uwsgi_temp_path {p}/tmp/uwsgi;\n\
             \x20   scgi_temp_path {p}/tmp/scgi;\n"
        );
        if self.upstreams_glob {
            c.push_str("    include upstreams/*.conf;\n");
        }
        for s in &self.http_snippets {
            for line in s.lines() {
                let _ = writeln!(c, "    {line}");
            }
        }
        if let Some(extra) = &self.live_api {
            let write = if self.live_api_write { " write=on" } else { "" };
            let _ = writeln!(
                c,
                "    server {{\n        listen unix:{p}/logs/api.sock;\n        \
                 location /api/ {{ {extra} upstreams_api{write}; }}\n    }}"
            );
        }
        for (name, bport) in backends {
            let _ = writeln!(
                c,
                "    server {{\n        listen 127.0.0.1:{bport};\n        \
                 location / {{ return 200 \"{name}\"; }}\n    }}"
            );
        }
        let _ = write!(
            c,
            "    server {{\n        listen 127.0.0.1:{port};\n\
             \x20       location = / {{ return 200 \"tributary-testkit\"; }}\n\
             \x20       location ~ ^/u/([A-Za-z0-9_.-]+)/ {{\n\
             \x20           set $tk_upstream $1;\n\
             \x20           proxy_connect_timeout 2s;\n\
             \x20           proxy_pass http://$tk_upstream;\n\
             \x20       }}\n    }}\n}}\n"
        );
        c
    }
}

enum StartError {
    PortTaken(String),
    Other(String),
}

/// A running nginx with its own temporary prefix on a free 127.0.0.1 port. Stopped on drop.
#[derive(Debug)]
pub struct TestNginx {
    dir: tempfile::TempDir,
    port: u16,
    backends: Vec<(String, u16)>,
    child: Option<Child>,
    binary: PathBuf,
    workers: usize,
}

impl TestNginx {
    /// The `--live-api` address of the API a builder's [`TestNginxBuilder::live_api`] set up.
    pub fn live_api_address(&self) -> String {
        format!("unix:{}/logs/api.sock:/api/", self.prefix().display())
    }

    /// Starts a plain nginx (no backends). Panics with nginx's output when it cannot start.
    pub fn start() -> TestNginx {
        TestNginxBuilder::new().start()
    }

    /// A builder for backends, snippets and pre-created files.
    pub fn builder() -> TestNginxBuilder {
        TestNginxBuilder::new()
    }

    /// The prefix directory (`-p`).
    pub fn prefix(&self) -> &Path {
        self.dir.path()
    }

    /// The conf dir: the folder of `nginx.conf`; relative includes resolve against it.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("conf")
    }

    /// The main config file.
    pub fn conf_path(&self) -> PathBuf {
        self.conf_dir().join("nginx.conf")
    }

    /// `conf_dir()/upstreams`.
    pub fn upstreams_dir(&self) -> PathBuf {
        self.conf_dir().join("upstreams")
    }

    /// The nginx binary in use.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The main server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of a backend added with [`TestNginxBuilder::backend`]. Panics if unknown.
    pub fn backend_port(&self, name: &str) -> u16 {
        self.backends
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no backend named {name:?}"))
    }

    /// All backends as `(name, port)`.
    pub fn backends(&self) -> &[(String, u16)] {
        &self.backends
    }

    /// `[nginx, -p, DIR, -c, DIR/conf/nginx.conf, -e, stderr]`: the common part of every command.
    pub fn base_cmd(&self) -> Vec<String> {
        vec![
            self.binary.display().to_string(),
            "-p".into(),
            self.prefix().display().to_string(),
            "-c".into(),
            self.conf_path().display().to_string(),
            "-e".into(),
            "stderr".into(),
        ]
    }

    /// The test command (`... -t`), for `CommandNginx::new`.
    ///
    /// `nginx -t` resolves the host names of `server` lines. So that a test with an unresolvable
    /// name never sends a DNS query off this machine, the command runs in a fresh network
    /// namespace (`unshare -n`, loopback only) where the kernel allows it (root); elsewhere it
    /// runs as is.
    pub fn test_cmd(&self) -> Vec<String> {
        let mut v = Vec::new();
        if network_isolation_available() {
            v.extend(["unshare".to_string(), "-n".to_string()]);
        }
        v.extend(self.base_cmd());
        v.push("-t".into());
        v
    }

    /// The reload command (`... -s reload`), for `CommandNginx::new`.
    pub fn reload_cmd(&self) -> Vec<String> {
        let mut v = self.base_cmd();
        v.extend(["-s".into(), "reload".into()]);
        v
    }

    /// The request path that proxies to the upstream `name`: `/u/<name>/`.
    pub fn upstream_path(name: &str) -> String {
        format!("/u/{name}/")
    }

    /// `GET path` on the main port; returns `(status, body)`. Panics on a connection error.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.try_get(path)
            .unwrap_or_else(|e| panic!("GET http://127.0.0.1:{}{path}: {e}", self.port))
    }

    /// `GET path` on the main port; returns `(status, body)`.
    pub fn try_get(&self, path: &str) -> io::Result<(u16, String)> {
        http_get(self.port, path)
    }

    /// Polls `GET path` until `pred(status, body)` holds (reloads take effect asynchronously).
    /// Returns the last answer, or an error naming it when `timeout` passed.
    pub fn wait_until(
        &self,
        path: &str,
        timeout: Duration,
        mut pred: impl FnMut(u16, &str) -> bool,
    ) -> Result<(u16, String), String> {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            last = self.try_get(path).map_err(|e| e.to_string());
            if let Ok((status, body)) = &last {
                if pred(*status, body) {
                    return Ok((*status, body.clone()));
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "GET {path}: condition not met within {timeout:?}; last answer: {last:?}"
                ));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Polls `GET path` until it answers `200 expected_body`, then waits until the worker that
    /// served before the last reload has gone ([`TestNginx::wait_settled`]) and checks again, so
    /// that later requests see the same configuration.
    pub fn wait_for_body(
        &self,
        path: &str,
        expected_body: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        self.wait_until(path, timeout, |s, b| s == 200 && b == expected_body)?;
        self.wait_settled(timeout)?;
        self.wait_until(path, timeout, |s, b| s == 200 && b == expected_body)
            .map(|_| ())
    }

    /// Pids of the master's children (the workers), with their command lines.
    pub fn workers(&self) -> Vec<(u32, String)> {
        let Some(master) = self.master_pid() else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(master) {
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .trim()
                    .to_string();
                out.push((pid, cmdline));
            }
        }
        out
    }

    /// Waits until exactly the configured number of workers runs and none is shutting down:
    /// after a reload, old workers keep accepting for a moment; this waits them out. (It cannot
    /// know about a reload signal the master has not handled yet: first wait for a sign of the
    /// new configuration.)
    pub fn wait_settled(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let workers = self.workers();
            // A child just forked still shows the master's title until it sets its own.
            if workers.len() == self.workers
                && workers
                    .iter()
                    .all(|w| w.1.contains("worker process") && !w.1.contains("shutting down"))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nginx workers did not settle within {timeout:?}: {workers:?}"
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The pid file (`pid` directive of the main config).
    pub fn pid_file(&self) -> PathBuf {
        self.prefix().join("logs/nginx.pid")
    }

    /// The error log file (`error_log` of the main config, level notice).
    pub fn error_log_path(&self) -> PathBuf {
        self.prefix().join("logs/error.log")
    }

    /// The contents of nginx's error log (notice level).
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.prefix().join("logs/error.log")).unwrap_or_default()
    }

    /// What the master wrote to stderr.
    pub fn stderr_log(&self) -> String {
        fs::read_to_string(self.prefix().join("logs/stderr.log")).unwrap_or_default()
    }

    /// How many reload signals (SIGHUP) the master has logged so far. Reloads are asynchronous:
    /// poll this when counting right after a reload command.
    pub fn reloads_seen(&self) -> usize {
        self.error_log()
            .lines()
            // nginx logs "signal 1 (SIGHUP) received from N, reconfiguring" and then "reconfiguring":
            // count the first line only, once per reload.
            .filter(|l| l.contains("(SIGHUP) received"))
            .count()
    }

    /// The master's pid.
    pub fn master_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the master is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn pid_file_written(&self) -> bool {
        fs::read_to_string(self.prefix().join("logs/nginx.pid"))
            .map(|s| !s.trim().is_empty())
            .unwrap_or(false)
    }

    /// Stops nginx (fast shutdown, then SIGKILL after 5 s) and waits for it. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        // Signal through a minimal config that only names the pid file, so a broken nginx.conf
        // (tests write those on purpose) cannot prevent the shutdown.
        let _ = Command::new(&self.binary)
            .arg("-p")
            .arg(self.prefix())
            .arg("-c")
            .arg(self.conf_dir().join("stop.conf"))
            .args(["-e", "stderr", "-s", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for TestNginx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A small tmpfs mounted over a folder (for full-disk tests); unmounted on drop (lazily if still
/// busy). Needs root (or CAP_SYS_ADMIN).
#[derive(Debug)]
pub struct TmpfsMount {
    dir: PathBuf,
}

impl TmpfsMount {
    /// Mounts a tmpfs of `size_bytes` on `dir` (which must exist; what it held is hidden until
    /// unmount). The error says why when the kernel refuses (not root, in a container...).
    pub fn mount(dir: &Path, size_bytes: u64) -> Result<TmpfsMount, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size_bytes},mode=0755"))
            .arg("tributary-test")
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs on {} failed: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(TmpfsMount {
            dir: dir.to_path_buf(),
        })
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the mount's top folder immutable (`chattr +i`: no file in it can be created,
    /// renamed or removed, even by root) or mutable again. Open files stay writable.
    pub fn set_immutable(&self, on: bool) -> Result<(), String> {
        let flag = if on { "+i" } else { "-i" };
        let out = Command::new("chattr")
            .arg(flag)
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running chattr (Debian package e2fsprogs): {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "chattr {flag} {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Writes a filler file in the mount until the file system is full (`ENOSPC`); returns
    /// its path.
    pub fn fill(&self, file_name: &str) -> PathBuf {
        let path = self.dir.join(file_name);
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        let block = vec![0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Smaller writes take the last partial page.
        for _ in 0..4096 {
            if f.write(&[0u8]).is_err() {
                break;
            }
        }
        path
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = self.set_immutable(false);
        let ok = Command::new("umount")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Minimal HTTP/1.0 `GET` to `127.0.0.1:port`; returns `(status, body)`.
pub fn http_get(port: u16, path: &str) -> io::Result<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no end of headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad status line: {head:?}"),
            )
        })?;
    Ok((status, body.to_string()))
}
