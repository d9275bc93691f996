//! [`NginxBuilder`]: the fixture of the daemon's and plugins' tests, an [`Nginx`] with backends,
//! an `upstreams/` include folder for the applier, and optionally the module's live API. It
//! renders an `http {}` body and [`Options`] and starts them like any other [`Nginx`] (a new port
//! when the one picked was taken meanwhile).
//!
//! Layout of the prefix `DIR`:
//! ```text
//! DIR/conf/nginx.conf        generated main config (see below)
//! DIR/conf/upstreams/        where tributary-apply writes `<name>.conf` (created empty)
//! DIR/logs/error.log         nginx's error log (level notice: reloads are visible)
//! DIR/logs/nginx.pid         pid file
//! DIR/logs/stderr.log        the master's stderr
//! ```
//! The `http {}` body has `include upstreams/*.conf;` (unless disabled with
//! [`NginxBuilder::without_upstreams_glob`]), the caller's snippets, one `server` per backend
//! (`return 200 "<name>"`), and the main server on [`Nginx::port`] with
//! - `GET /` → `200 tributary-testkit`
//! - `GET /u/<upstream>/...` → `proxy_pass http://<upstream>` (an upstream that does not exist
//!   gives 502 and the error-log line [`FIXTURE_EXPECTED`], always declared).
//!
//! One worker by default ([`NginxBuilder::workers`] for more); the module is loaded only for its
//! API ([`NginxBuilder::live_api`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use crate::nginx::{Fixture, StartError};
use crate::{
    combined_upstreams_module, free_port, running_as_root, try_nginx_binary, Nginx, Options,
};

/// The error-log line of the fixture's `/u/<name>/` route for an upstream that does not exist
/// (`proxy_pass http://$tk_upstream` with no resolver: a 502 and `[error] no resolver defined to
/// resolve <name>`). Tests poll that route until an upstream they apply exists, so this line is
/// how the fixture answers "not there yet", not a fault of the code under test.
pub const FIXTURE_EXPECTED: &str = "no resolver defined to resolve ";

/// Builder for an [`Nginx`] with backends, extra `http`-level config and pre-created files.
#[derive(Debug, Clone)]
pub struct NginxBuilder {
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
    /// The API location takes `PUT`s (`write=on`; [`NginxBuilder::live_api_read_only`] turns
    /// it off).
    live_api_write: bool,
    /// Error-log lines the test causes on purpose ([`Nginx::expect_log`]).
    expected: Vec<String>,
    /// Drop checks the error log (off: [`NginxBuilder::own_log_check`]).
    check_log: bool,
}

impl Default for NginxBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl NginxBuilder {
    /// No backends, no snippets, `include upstreams/*.conf;` on.
    pub fn new() -> Self {
        NginxBuilder {
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
    /// upstreams API on a unix socket in the prefix ([`Nginx::live_api_address`]), location
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
    /// start ([`Nginx::expect_log`]).
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
    /// [`Nginx::named_port`] tells it. nginx holds the port from its start across reloads,
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
    pub fn start(self) -> Nginx {
        self.try_start()
            .unwrap_or_else(|e| panic!("nginx failed to start: {e}"))
    }

    /// Starts nginx, returning the reason as text when it cannot. Retries with new ports when a
    /// chosen port was taken in the meantime.
    pub fn try_start(self) -> Result<Nginx, String> {
        try_nginx_binary()?;
        if self.live_api.is_some() {
            combined_upstreams_module()?;
        }
        let mut last = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            let fixture = Fixture {
                backends: self
                    .backends
                    .iter()
                    .map(|b| (b.clone(), free_port()))
                    .collect(),
                named_ports: self
                    .named_ports
                    .iter()
                    .map(|n| (n.clone(), free_port()))
                    .collect(),
            };
            let http = self.render_http(port, &fixture);
            match Nginx::launch(self.options(), &http, vec![port], Some(fixture)) {
                Ok(n) => return Ok(n),
                Err(StartError::PortTaken(msg)) => last = msg,
                Err(StartError::Other(msg)) => return Err(msg),
            }
        }
        Err(format!("ports kept being taken: {last}"))
    }

    /// The [`Options`] the fixture runs with: the module only for its API, the workers asked
    /// for, `notice` in the error log, the fixture's own expected line and the test's.
    fn options(&self) -> Options {
        let mut o = Options::new()
            .workers(self.workers)
            .timeouts(Duration::from_secs(15), Duration::from_secs(10));
        o.module = self.live_api.is_some();
        o.log_level = "notice";
        o.files = self.files.clone();
        o.check_log = self.check_log;
        if running_as_root() {
            // Workers keep the fixture's uid so they can use files the test made private.
            o = o.main("user root;");
        }
        o = o.expect_log(FIXTURE_EXPECTED);
        for e in &self.expected {
            o = o.expect_log(e);
        }
        o
    }

    /// The `http {}` body: the snippets, the API's server, one server per backend, the main one.
    fn render_http(&self, port: u16, fixture: &Fixture) -> String {
        let mut c = String::from("default_type text/plain;\n");
        if self.upstreams_glob {
            c.push_str("include upstreams/*.conf;\n");
        }
        for s in &self.http_snippets {
            let mut s = s.clone();
            for (name, p) in &fixture.named_ports {
                s = s.replace(&format!("{{port:{name}}}"), &p.to_string());
            }
            c.push_str(&s);
            c.push('\n');
        }
        if let Some(extra) = &self.live_api {
            let write = if self.live_api_write { " write=on" } else { "" };
            let _ = writeln!(
                c,
                "server {{\n    listen unix:{{PREFIX}}/logs/api.sock;\n    \
                 location /api/ {{ {extra} upstreams_api{write}; }}\n}}"
            );
        }
        for (name, bport) in &fixture.backends {
            let _ = writeln!(
                c,
                "server {{\n    listen 127.0.0.1:{bport};\n    \
                 location / {{ return 200 \"{name}\"; }}\n}}"
            );
        }
        let _ = write!(
            c,
            "server {{\n    listen 127.0.0.1:{port};\n\
             \x20   location = / {{ return 200 \"tributary-testkit\"; }}\n\
             \x20   location ~ ^/u/([A-Za-z0-9_.-]+)/ {{\n\
             \x20       set $tk_upstream $1;\n\
             \x20       proxy_connect_timeout 2s;\n\
             \x20       proxy_pass http://$tk_upstream;\n\
             \x20   }}\n}}\n"
        );
        c
    }
}
