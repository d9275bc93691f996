//! [`TestNginxBuilder`]: what a [`TestNginx`] serves, its configuration, and starting it (a new
//! port when the one picked was taken meanwhile).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::ready::{listening, wait_ready, NotReady};
use crate::{
    combined_upstreams_module, free_port, running_as_root, try_nginx_binary, TestNginx,
    STARTUP_TIMEOUT,
};

/// Builder for a [`TestNginx`] with backends, extra `http`-level config and pre-created files.
#[derive(Debug, Clone)]
pub struct TestNginxBuilder {
    backends: Vec<String>,
    /// Ports picked at each start attempt and written into the snippets as `{port:NAME}`.
    named_ports: Vec<String>,
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
    /// Error-log lines the test causes on purpose ([`TestNginx::expect_log`]).
    expected: Vec<String>,
    /// Drop checks the error log (off: [`TestNginxBuilder::own_log_check`]).
    check_log: bool,
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
            named_ports: Vec::new(),
            http_snippets: Vec::new(),
            files: Vec::new(),
            upstreams_glob: true,
            workers: 1,
            live_api: None,
            live_api_write: true,
            expected: Vec::new(),
            check_log: true,
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

    /// Declares error-log lines containing `needle` as caused by the test on purpose, from the
    /// start ([`TestNginx::expect_log`]).
    pub fn expect_log(mut self, needle: &str) -> Self {
        self.expected.push(needle.to_string());
        self
    }

    /// For a caller that checks the error log itself, more precisely than needles can (the chaos
    /// soak explains a worker's `exited on signal 9` by the pids it killed, and reports every other
    /// line): drop then does not check it.
    pub fn own_log_check(mut self) -> Self {
        self.check_log = false;
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

    /// Reserves a port for the test's own `server` blocks: `{port:NAME}` in an
    /// [`Self::http_snippet`] becomes a port picked at each start attempt (so a port taken by
    /// another process meanwhile means a new attempt, as for the main port), and
    /// [`TestNginx::named_port`] tells it. nginx holds the port from its start across reloads,
    /// which a port picked by the test and listened on only at a later reload is not: another
    /// test's nginx can take it in between, and the requests then reach that one.
    pub fn named_port(mut self, name: &str) -> Self {
        assert!(
            !self.named_ports.iter().any(|n| n == name),
            "port {name:?} reserved twice"
        );
        self.named_ports.push(name.to_string());
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
        let named_ports: Vec<(String, u16)> = self
            .named_ports
            .iter()
            .map(|n| (n.clone(), free_port()))
            .collect();
        let config = self.render_config(&prefix, port, &backends, &named_ports);
        fs::write(prefix.join("conf/nginx.conf"), config).map_err(|e| other("write conf", e))?;
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
            named_ports,
            child: Some(child),
            binary: binary.to_path_buf(),
            workers: self.workers,
            expected: std::sync::Mutex::new(
                std::iter::once(crate::nginx::FIXTURE_EXPECTED.to_string())
                    .chain(self.expected.iter().cloned())
                    .collect(),
            ),
            check_log: self.check_log,
        };
        let mut ports = vec![port];
        ports.extend(nginx.backends.iter().map(|(_, p)| *p));
        ports.extend(nginx.named_ports.iter().map(|(_, p)| *p));
        let pid_file = nginx.pid_file();
        let child = nginx.child.as_mut().expect("just spawned");
        let ready = wait_ready(child, STARTUP_TIMEOUT, || {
            ports.iter().all(|p| listening(*p))
                && fs::read_to_string(&pid_file).is_ok_and(|s| !s.trim().is_empty())
        });
        let Err(why) = ready else {
            return Ok(nginx);
        };
        // Its error log holds the start's own failure (returned here), not a test's.
        nginx.check_log = false;
        let output = format!(
            "nginx on {ports:?} {why} at start-up; stderr: {}; error.log: {}",
            nginx.stderr_log().trim(),
            nginx.error_log().trim()
        );
        if matches!(why, NotReady::Exited(_)) {
            nginx.child = None;
            if output.contains("Address already in use") {
                return Err(StartError::PortTaken(output));
            }
        }
        Err(StartError::Other(output))
    }

    fn render_config(
        &self,
        prefix: &Path,
        port: u16,
        backends: &[(String, u16)],
        named_ports: &[(String, u16)],
    ) -> String {
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
            let mut s = s.clone();
            for (name, p) in named_ports {
                s = s.replace(&format!("{{port:{name}}}"), &p.to_string());
            }
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

pub(crate) enum StartError {
    PortTaken(String),
    Other(String),
}
