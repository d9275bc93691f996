//! A running nginx with the module loaded, as production runs it: `master_process on` and 2 worker
//! processes by default ([`Options`] changes that), stopped with `SIGQUIT` (graceful shutdown) and a
//! bounded wait for the master to exit. A case fails when nginx's error log holds an `[alert]`,
//! `[crit]` or `[emerg]` line, or a worker that "exited on signal", that the case did not declare
//! with [`Options::expect_log`] / [`Nginx::expect_log`].
//!
//! The check runs when the case calls [`Nginx::stop`], else when the [`Nginx`] is dropped: a
//! problem found on drop panics, which `libtest-mimic` reports as a failed case (the drop of a
//! case that already panicked only stops nginx).

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::client::{http_get, http_request, KeepAlive, Response};
use crate::errlog::unexpected_log_lines;
use crate::procfs::{self, Sig, Stopped};
use crate::ready::{listening, wait_ready, NotReady};
use crate::runner_conf::{nginx_bin, nginx_command, temp_prefix, write_config, Options, PORTS};
use crate::{dead_port, CaseResult, Failed};

/// A running nginx; stopped with `SIGQUIT` (see the module docs) and its prefix removed on drop.
pub struct Nginx {
    child: Option<Child>,
    ports: Vec<u16>,
    dead: u16,
    opts: Options,
    http: String,
    dir: tempfile::TempDir,
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

    pub(crate) fn try_start(opts: Options, http: &str, ports: Vec<u16>) -> Result<Nginx, String> {
        let dir = temp_prefix("cu-nginx-")?;
        let dead = dead_port();
        let conf = write_config(dir.path(), &opts, http, &ports, dead)?;
        let stderr_path = dir.path().join("logs/stderr.log");
        let stderr = fs::File::create(&stderr_path)
            .map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
        let child = nginx_command(dir.path(), &conf, &opts.wrapper)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("start {}: {e}", nginx_bin().display()))?;
        let mut n = Nginx {
            child: Some(child),
            ports,
            dead,
            opts,
            http: http.to_string(),
            dir,
        };
        let listen: Vec<u16> = (0..PORTS)
            .filter(|i| http.contains(&format!("listen 127.0.0.1:{{P{i}}}")))
            .map(|i| n.ports[i])
            .collect();
        let (master, workers) = (n.opts.master, n.opts.workers);
        let child = n.child.as_mut().expect("just spawned");
        let pid = child.id();
        let ready = wait_ready(child, n.opts.start_timeout, || {
            (!master || procfs::children(pid).len() >= workers)
                && listen.iter().all(|p| listening(*p))
        });
        match ready {
            Ok(()) => Ok(n),
            Err(NotReady::Exited(status)) => {
                let err = fs::read_to_string(&stderr_path).unwrap_or_default();
                n.child = None;
                Err(format!(
                    "nginx exited ({status}):\n{err}\n{}",
                    n.error_log()
                ))
            }
            Err(why @ NotReady::TimedOut(_)) => {
                let log = n.error_log();
                n.shutdown();
                Err(format!(
                    "nginx with its workers and listening: {why}:\n{log}"
                ))
            }
        }
    }

    /// The port that replaced `{Pi}`.
    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// The ports that replaced `{P0}`…`{P9}`, in order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The `http {}` body of the running configuration (placeholders not filled).
    pub fn http(&self) -> &str {
        &self.http
    }

    /// Writes a new `conf/nginx.conf` with this `http {}` body (same ports) without signalling
    /// the master: for a case that reloads by other means (`nginx -s reload`) or not at all.
    /// [`Nginx::http`] still names the running configuration.
    pub fn write_config(&self, http: &str) -> CaseResult {
        write_config(self.dir.path(), &self.opts, http, &self.ports, self.dead)?;
        Ok(())
    }

    /// The port that replaced `{DEAD}` (nothing listens there).
    pub fn dead_port(&self) -> u16 {
        self.dead
    }

    /// The prefix directory.
    pub fn prefix(&self) -> &Path {
        self.dir.path()
    }

    /// Contents of `logs/error.log` so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("logs/error.log")).unwrap_or_default()
    }

    /// Declares error-log lines containing `needle` as expected (see [`Options::expect_log`]).
    pub fn expect_log(&mut self, needle: &str) {
        self.opts.expected.push(needle.to_string());
    }

    /// Error-log lines so far that would fail the case (see [`unexpected_log_lines`]).
    pub fn log_problems(&self) -> Vec<String> {
        unexpected_log_lines(&self.error_log(), &self.opts.expected)
    }

    /// Process id of the master (or of the single process); `None` once stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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

    /// `GET path` on port `{Pi}` (a new connection: any worker may serve it).
    pub fn get(&self, i: usize, path: &str) -> Result<Response, Failed> {
        http_get(self.port(i), path, &[])
    }

    /// Any request on port `{Pi}` (see [`http_request`]).
    pub fn request(
        &self,
        i: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, Failed> {
        http_request(self.port(i), method, path, headers, body)
    }

    /// `GET path` on port `{Pi}` with extra request headers.
    pub fn get_with(
        &self,
        i: usize,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response, Failed> {
        http_get(self.port(i), path, headers)
    }

    /// A keep-alive connection to port `{Pi}`: every request on it is served by one worker, so a
    /// case can observe that worker's state (round-robin cursors, blacklists, failed peers).
    pub fn keep_alive(&self, i: usize) -> Result<KeepAlive, Failed> {
        KeepAlive::open(self.port(i))
    }

    /// Reloads nginx (`SIGHUP` to the master) with a new `http {}` body on the same ports, and
    /// waits until the new generation of workers runs. Returns the workers of before the reload
    /// (they shut down gracefully; see [`Nginx::wait_exited`]). Fails when nginx rejects the
    /// configuration (an `[emerg]` after the signal) or the new workers do not start in time.
    pub fn reload(&mut self, http: &str) -> Result<Vec<u32>, Failed> {
        let pid = self.pid().ok_or("nginx is not running")?;
        if !self.opts.master {
            return Err("reload needs master_process on".into());
        }
        let old = self.workers();
        let log_len = self.error_log().len();
        write_config(self.dir.path(), &self.opts, http, &self.ports, self.dead)?;
        self.http = http.to_string();
        if !procfs::signal(pid, Sig::Hup) {
            return Err(format!("SIGHUP to nginx master {pid} failed").into());
        }
        let deadline = Instant::now() + self.opts.stop_timeout;
        loop {
            let new = self
                .workers()
                .into_iter()
                .filter(|w| !old.contains(w))
                .count();
            if new >= self.opts.workers {
                return Ok(old);
            }
            let log = self.error_log();
            let after = log.get(log_len..).unwrap_or("");
            if let Some(l) = after.lines().find(|l| l.contains("[emerg]")) {
                return Err(format!("reload rejected: {l}").into());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{new} of {} new workers after {:?} (reload); error log:\n{after}",
                    self.opts.workers, self.opts.stop_timeout
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until none of `pids` is a live worker any more; fails after `timeout`.
    pub fn wait_exited(&self, pids: &[u32], timeout: Duration) -> CaseResult {
        let deadline = Instant::now() + timeout;
        loop {
            let live = self.workers();
            let left: Vec<u32> = pids.iter().copied().filter(|p| live.contains(p)).collect();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let titles: Vec<String> = left.iter().map(|p| procfs::title(*p)).collect();
                return Err(format!(
                    "workers {left:?} still run {timeout:?} after being told to exit: {titles:?}"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops nginx gracefully (see `Nginx::shutdown`) and checks the error log; the error names
    /// every problem.
    pub fn stop(self) -> CaseResult {
        self.stop_then(|_| ())
    }

    /// Stops nginx like [`Nginx::stop`], then gives `f` the prefix directory (the logs are
    /// complete: every process has exited) before it is removed; `f`'s result is returned when
    /// the stop found no problem.
    pub fn stop_then<T>(mut self, f: impl FnOnce(&Path) -> T) -> Result<T, Failed> {
        let mut problems = self.shutdown();
        let out = f(self.dir.path());
        problems.extend(
            self.log_problems()
                .into_iter()
                .map(|l| format!("unexpected error-log line: {l}")),
        );
        if problems.is_empty() {
            Ok(out)
        } else {
            Err(problems.join("\n").into())
        }
    }

    /// `SIGQUIT` to the master (graceful shutdown: workers finish their requests and exit, then
    /// the master), then waits for the master to exit. After the stop timeout the master and its
    /// children are killed and the problem returned. No-op when already stopped.
    fn shutdown(&mut self) -> Vec<String> {
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
        if self.child.is_none() {
            return;
        }
        let mut problems = self.shutdown();
        if std::thread::panicking() {
            return;
        }
        problems.extend(
            self.log_problems()
                .into_iter()
                .map(|l| format!("unexpected error-log line: {l}")),
        );
        if !problems.is_empty() {
            panic!(
                "nginx in {} (configuration below):\n{}\n--- http {{}} ---\n{}",
                self.dir.path().display(),
                problems.join("\n"),
                self.http
            );
        }
    }
}
