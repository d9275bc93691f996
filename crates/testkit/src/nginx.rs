//! [`TestNginx`]: a running nginx, its prefix and commands, requests to it, waiting for a reload
//! to settle, its workers and logs; stopped on drop, which then checks its error log: a line
//! with one of [`FIXTURE_LOG_MARKERS`] (`[emerg]`, `[alert]`, `[crit]`, `[error]`, a worker that
//! "exited on signal") that the test did not declare ([`TestNginx::expect_log`],
//! [`TestNginxBuilder::expect_log`]) fails the test (a panic in `drop`; skipped when the test is
//! already panicking, and for an nginx that never started). One line is the fixture's own and
//! always expected ([`FIXTURE_EXPECTED`]): its answer for an upstream that does not exist.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::errlog::{lines_with_markers, FIXTURE_LOG_MARKERS};
use crate::procfs::{self, Sig};
use crate::{http_get, network_isolation_available, TestNginxBuilder};

/// The error-log line of the fixture's `/u/<name>/` route for an upstream that does not exist
/// (`proxy_pass http://$tk_upstream` with no resolver: a 502 and `[error] no resolver defined to
/// resolve <name>`). Tests poll that route until an upstream they apply exists, so this line is
/// how the fixture answers "not there yet", not a fault of the code under test.
pub const FIXTURE_EXPECTED: &str = "no resolver defined to resolve ";

/// A running nginx with its own temporary prefix on a free 127.0.0.1 port. Stopped on drop,
/// which then checks the error log (see the module docs).
#[derive(Debug)]
pub struct TestNginx {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) port: u16,
    pub(crate) backends: Vec<(String, u16)>,
    pub(crate) named_ports: Vec<(String, u16)>,
    pub(crate) child: Option<Child>,
    pub(crate) binary: PathBuf,
    pub(crate) workers: usize,
    /// Needles of the error-log lines the test causes on purpose (behind a lock so that a test
    /// holding `&TestNginx`, or sharing it with threads, can still declare one).
    pub(crate) expected: Mutex<Vec<String>>,
    /// Whether drop checks the error log: off for an nginx that failed to start (its
    /// `bind() failed` is the start's error, already returned).
    pub(crate) check_log: bool,
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

    /// A port reserved with [`TestNginxBuilder::named_port`]. Panics if unknown.
    pub fn named_port(&self, name: &str) -> u16 {
        self.named_ports
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no port named {name:?}"))
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

    /// Pids of the master's children (the workers), with their command lines ([`procfs`]).
    pub fn workers(&self) -> Vec<(u32, String)> {
        let Some(master) = self.master_pid() else {
            return Vec::new();
        };
        procfs::children(master)
            .into_iter()
            .map(|pid| (pid, procfs::title(pid)))
            .collect()
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

    /// Declares error-log lines containing `needle` as caused by the test on purpose: they do not
    /// fail it when nginx is dropped. Name the message, not only its level (`"no live upstreams"`,
    /// not `"[error]"`).
    pub fn expect_log(&self, needle: &str) {
        self.expected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(needle.to_string());
    }

    /// Error-log lines so far that would fail the test on drop ([`FIXTURE_LOG_MARKERS`], less the
    /// declared ones).
    pub fn log_problems(&self) -> Vec<String> {
        let expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        lines_with_markers(&FIXTURE_LOG_MARKERS, &self.error_log(), &expected)
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

    /// Stops nginx (fast shutdown, then SIGKILL of the master and its workers after 5 s) and
    /// waits for it. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SIGTERM (what `nginx -s stop` sends) straight to the master: no configuration is
        // read, so a broken nginx.conf (tests write those on purpose) cannot prevent the shutdown.
        // Workers left after the time limit are killed with the master.
        procfs::stop_master(&mut child, Sig::Term, Duration::from_secs(5));
    }
}

impl Drop for TestNginx {
    fn drop(&mut self) {
        self.stop();
        if !self.check_log || thread::panicking() {
            return;
        }
        let problems = self.log_problems();
        if !problems.is_empty() {
            panic!(
                "nginx in {}: unexpected error-log lines (a test declares the ones it causes with \
                 expect_log):\n{}",
                self.prefix().display(),
                problems.join("\n")
            );
        }
    }
}
