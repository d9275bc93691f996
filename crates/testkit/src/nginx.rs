//! [`Nginx`]: the one nginx runner of the test stack. A real nginx as production runs it
//! (`master_process on`, the workers [`Options::workers`] / [`NginxBuilder::workers`] ask for), in
//! its own temporary prefix, started from either
//! - [`Options`] with an `http {}` body whose `{Pn}` placeholders become free ports (the module
//!   tests and benches), or
//! - [`NginxBuilder`] (the daemon's and plugins' fixture: backends, snippets, an `upstreams/`
//!   include folder, optionally the module's live API; described in [`crate::NginxBuilder`]).
//!
//! It is stopped with `SIGQUIT` (graceful shutdown: workers finish their requests) and a bounded
//! wait for the master, then `SIGKILL` of what is left, which is reported. The error log is then
//! checked: a line with one of [`LOG_MARKERS`](crate::LOG_MARKERS) (`[error]`, `[crit]`,
//! `[alert]`, `[emerg]`, a worker that "exited on signal") that the test did not declare
//! ([`Nginx::expect_log`], [`Options::expect_log`], [`NginxBuilder::expect_log`]) fails the test.
//! The check runs when the test calls [`Nginx::stop`] (an error naming every problem), else when
//! the [`Nginx`] is dropped (a panic, which `libtest-mimic` and libtest report as a failure;
//! skipped when the test is already panicking, and for an nginx that never started).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::thread;

use crate::errlog::{lines_with_markers, LOG_MARKERS};
use crate::options::{nginx_bin, nginx_command, temp_prefix, write_config};
use crate::procfs::{self, Sig, Stopped};
use crate::ready::{listening, wait_ready, NotReady};
use crate::{dead_port, CaseResult, Failed, Options};

#[cfg(doc)]
use crate::NginxBuilder;

/// A running nginx; stopped, its error log checked and its prefix removed on drop (see the
/// module docs).
#[derive(Debug)]
pub struct Nginx {
    pub(crate) child: Option<Child>,
    pub(crate) dir: tempfile::TempDir,
    /// `{P0}`…`{P9}` ([`Options`]); the main port alone for the fixture.
    pub(crate) ports: Vec<u16>,
    pub(crate) dead: u16,
    pub(crate) opts: Options,
    pub(crate) http: String,
    pub(crate) binary: PathBuf,
    pub(crate) fixture: Fixture,
    /// Needles of the error-log lines the test causes on purpose (behind a lock so that a test
    /// holding `&Nginx`, or sharing it with threads, can still declare one).
    pub(crate) expected: Mutex<Vec<String>>,
    /// What a [`Nginx::halt`] found (reported on drop).
    pub(crate) stop_problems: Vec<String>,
    /// The error log was checked ([`Nginx::stop`]) or must not be (a start that failed).
    pub(crate) checked: bool,
}

/// The fixture's named ports ([`NginxBuilder`]); empty for an nginx started from [`Options`].
#[derive(Debug, Default)]
pub(crate) struct Fixture {
    pub(crate) backends: Vec<(String, u16)>,
    pub(crate) named_ports: Vec<(String, u16)>,
}

/// Why a start failed: a port taken meanwhile (worth a new attempt with new ports) or anything
/// else (nginx's own output).
pub(crate) enum StartError {
    PortTaken(String),
    Other(String),
}

impl StartError {
    pub(crate) fn into_message(self) -> String {
        match self {
            StartError::PortTaken(m) | StartError::Other(m) => m,
        }
    }
}

impl Nginx {
    /// Starts nginx with the default [`Options`] (master process, 2 workers); see
    /// [`Options::start`].
    pub fn start(http: &str) -> Result<Nginx, Failed> {
        Options::new().start(http)
    }

    /// [`Nginx::start`] with extra main-context lines.
    pub fn start_with(main_extra: &str, http: &str) -> Result<Nginx, Failed> {
        Options::new().main(main_extra).start(http)
    }

    /// Starts nginx with ports chosen by the caller (several instances can then share one
    /// port table, e.g. backends in their own nginx so a case can stop one of them). No retry.
    pub fn start_on(http: &str, ports: &[u16]) -> Result<Nginx, Failed> {
        Options::new().ports(ports).start(http)
    }

    /// The default [`Options`], to change before [`Options::start`].
    pub fn options() -> Options {
        Options::new()
    }

    /// The fixture's builder: backends, snippets and pre-created files.
    pub fn builder() -> crate::NginxBuilder {
        crate::NginxBuilder::new()
    }

    /// One attempt: a new prefix, its files and `nginx.conf`, nginx spawned and waited for (its
    /// workers, the pid file, and the ports it listens on: `listen 127.0.0.1:{Pn}` in `http`,
    /// or every port of the fixture).
    pub(crate) fn launch(
        opts: Options,
        http: &str,
        ports: Vec<u16>,
        fixture: Option<Fixture>,
    ) -> Result<Nginx, StartError> {
        let other = StartError::Other;
        let dir = temp_prefix("tributary-nginx-").map_err(other)?;
        for (rel, contents) in &opts.files {
            let path = dir.path().join("conf").join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)
                    .map_err(|e| other(format!("create {}: {e}", parent.display())))?;
            }
            fs::write(&path, contents)
                .map_err(|e| other(format!("write {}: {e}", path.display())))?;
        }
        let dead = dead_port();
        let conf = write_config(dir.path(), &opts, http, &ports, dead).map_err(other)?;
        let stderr_path = dir.path().join("logs/stderr.log");
        let stderr = fs::File::create(&stderr_path)
            .map_err(|e| other(format!("create {}: {e}", stderr_path.display())))?;
        let binary = nginx_bin();
        let child = nginx_command(dir.path(), &conf, &opts.wrapper)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| other(format!("start {}: {e}", binary.display())))?;
        let listen: Vec<u16> = match &fixture {
            Some(f) => ports
                .iter()
                .copied()
                .chain(f.backends.iter().map(|(_, p)| *p))
                .chain(f.named_ports.iter().map(|(_, p)| *p))
                .collect(),
            None => (0..ports.len())
                .filter(|i| http.contains(&format!("listen 127.0.0.1:{{P{i}}}")))
                .map(|i| ports[i])
                .collect(),
        };
        let expected = Mutex::new(opts.expected.clone());
        let mut n = Nginx {
            child: Some(child),
            dir,
            ports,
            dead,
            opts,
            http: http.to_string(),
            binary,
            fixture: fixture.unwrap_or_default(),
            expected,
            stop_problems: Vec::new(),
            checked: false,
        };
        let (master, workers) = (n.opts.master, n.opts.workers);
        let pid_file = n.pid_file();
        let child = n.child.as_mut().expect("just spawned");
        let pid = child.id();
        let ready = wait_ready(child, n.opts.start_timeout, || {
            (!master || procfs::children(pid).len() >= workers)
                && listen.iter().all(|p| listening(*p))
                && fs::read_to_string(&pid_file).is_ok_and(|s| !s.trim().is_empty())
        });
        let Err(why) = ready else {
            return Ok(n);
        };
        // Its error log holds the start's own failure (returned here), not a test's.
        n.checked = true;
        if matches!(why, NotReady::Exited(_)) {
            n.child = None;
        } else {
            n.shutdown();
        }
        let output = format!(
            "nginx on {listen:?} {why} at start-up; stderr: {}\nerror.log:\n{}",
            n.stderr_log().trim(),
            n.error_log().trim()
        );
        if output.contains("Address already in use") {
            Err(StartError::PortTaken(output))
        } else {
            Err(StartError::Other(output))
        }
    }

    /// The main port: `{P0}`, or the fixture's main server.
    pub fn port(&self) -> u16 {
        self.ports[0]
    }

    /// The ports that replaced `{P0}`…`{P9}`, in order (the fixture: its main port).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The port that replaced `{DEAD}` (nothing listens there).
    pub fn dead_port(&self) -> u16 {
        self.dead
    }

    /// The `http {}` body of the running configuration (placeholders not filled).
    pub fn http(&self) -> &str {
        &self.http
    }

    /// The prefix directory (`-p`).
    pub fn prefix(&self) -> &Path {
        self.dir.path()
    }

    /// The conf dir: the folder of `nginx.conf`; relative includes resolve against it.
    pub fn conf_dir(&self) -> PathBuf {
        self.prefix().join("conf")
    }

    /// The main config file.
    pub fn conf_path(&self) -> PathBuf {
        self.conf_dir().join("nginx.conf")
    }

    /// `conf_dir()/upstreams` (created empty).
    pub fn upstreams_dir(&self) -> PathBuf {
        self.conf_dir().join("upstreams")
    }

    /// The nginx binary in use.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The pid file (`pid` directive of the main config).
    pub fn pid_file(&self) -> PathBuf {
        self.prefix().join("logs/nginx.pid")
    }

    /// The error log file (`error_log` of the main config).
    pub fn error_log_path(&self) -> PathBuf {
        self.prefix().join("logs/error.log")
    }

    /// Contents of `logs/error.log` so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.error_log_path()).unwrap_or_default()
    }

    /// What the master wrote to stderr.
    pub fn stderr_log(&self) -> String {
        fs::read_to_string(self.prefix().join("logs/stderr.log")).unwrap_or_default()
    }

    /// Declares error-log lines containing `needle` as caused by the test on purpose: they do not
    /// fail it. Name the message, not only its level (`"no live upstreams"`, not `"[error]"`).
    pub fn expect_log(&self, needle: &str) {
        self.expected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(needle.to_string());
    }

    /// Error-log lines so far that would fail the test ([`LOG_MARKERS`], less the declared ones).
    pub fn log_problems(&self) -> Vec<String> {
        let expected = self.expected.lock().unwrap_or_else(|p| p.into_inner());
        lines_with_markers(&LOG_MARKERS, &self.error_log(), &expected)
    }

    /// Process id of the master (or of the single process); `None` once stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the master is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Live worker processes (children of the master), in ascending pid order; with
    /// `master_process off`, the single process.
    pub fn workers(&self) -> Vec<u32> {
        match self.pid() {
            Some(pid) if self.opts.master => procfs::children(pid),
            Some(pid) => vec![pid],
            None => Vec::new(),
        }
    }

    /// Stops nginx gracefully (see the module docs) and checks the error log; the error names
    /// every problem.
    pub fn stop(self) -> CaseResult {
        self.stop_then(|_| ())
    }

    /// Stops nginx like [`Nginx::stop`], then gives `f` the prefix directory (the logs are
    /// complete: every process has exited) before it is removed; `f`'s result is returned when
    /// the stop found no problem.
    pub fn stop_then<T>(mut self, f: impl FnOnce(&Path) -> T) -> Result<T, Failed> {
        let mut problems = std::mem::take(&mut self.stop_problems);
        problems.extend(self.shutdown());
        self.checked = true;
        let out = f(self.dir.path());
        if self.opts.check_log {
            problems.extend(
                self.log_problems()
                    .into_iter()
                    .map(|l| format!("unexpected error-log line: {l}")),
            );
        }
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems.join("\n").into())
        }
    }

    /// Stops nginx now, as [`Nginx::stop`] does, and keeps the value (its prefix, ports and
    /// commands) for a test that goes on without a running nginx; the error log is still checked
    /// on drop. Idempotent.
    pub fn halt(&mut self) {
        let problems = self.shutdown();
        self.stop_problems.extend(problems);
    }

    /// `SIGQUIT` to the master (graceful shutdown: workers finish their requests and exit, then
    /// the master), then waits for the master to exit. After the stop timeout the master and its
    /// children are killed and the problem returned. No-op when already stopped.
    pub(crate) fn shutdown(&mut self) -> Vec<String> {
        let Some(mut child) = self.child.take() else {
            return Vec::new();
        };
        let pid = child.id();
        let mut problems = Vec::new();
        if matches!(child.try_wait(), Ok(Some(_))) {
            problems.push(format!("nginx {pid} had exited before it was stopped"));
            return problems;
        }
        match procfs::stop_master(&mut child, Sig::Quit, self.opts.stop_timeout) {
            Stopped::Exited(status) if !status.success() => {
                problems.push(format!("nginx {pid} exited with {status} after SIGQUIT"));
            }
            Stopped::Exited(_) => {}
            Stopped::Killed { workers } => problems.push(format!(
                "nginx master {pid} did not exit within {:?} after SIGQUIT (workers left: {workers:?}); killed",
                self.opts.stop_timeout
            )),
        }
        problems
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let mut problems = std::mem::take(&mut self.stop_problems);
        problems.extend(self.shutdown());
        if self.checked || !self.opts.check_log || thread::panicking() {
            return;
        }
        problems.extend(
            self.log_problems()
                .into_iter()
                .map(|l| format!("unexpected error-log line: {l}")),
        );
        if !problems.is_empty() {
            panic!(
                "nginx in {}: unexpected error-log lines or a stop that went wrong (a test declares \
                 the lines it causes with expect_log):\n{}\n--- http {{}} ---\n{}",
                self.prefix().display(),
                problems.join("\n"),
                self.http
            );
        }
    }
}
