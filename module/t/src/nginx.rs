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
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::procfs::{self, Sig};
use crate::{
    check_prerequisites, dead_port, free_ports, http_get, http_request, module_path, nginx_bin,
    CaseResult, Failed, KeepAlive, Response, TempDir, PORTS,
};

/// Markers of error-log lines that fail a case unless it declared them.
pub const BAD_LOG_MARKERS: [&str; 4] = ["[alert]", "[crit]", "[emerg]", "exited on signal"];

/// Default number of worker processes.
pub const DEFAULT_WORKERS: usize = 2;

/// How nginx is started: process model, extra main-context lines, expected bad log lines, ports,
/// a wrapper command (valgrind) and time limits. `Options::new()` is production-like:
/// `master_process on`, [`DEFAULT_WORKERS`] workers.
#[derive(Debug, Clone)]
pub struct Options {
    main_extra: String,
    master: bool,
    workers: usize,
    expected: Vec<String>,
    ports: Option<Vec<u16>>,
    wrapper: Vec<String>,
    start_timeout: Duration,
    stop_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            main_extra: String::new(),
            master: true,
            workers: DEFAULT_WORKERS,
            expected: Vec::new(),
            ports: None,
            wrapper: Vec::new(),
            start_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

impl Options {
    /// `master_process on`, [`DEFAULT_WORKERS`] workers, no extra lines.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds main-context lines (e.g. `load_module ...;`, `env NAME;`). Not `master_process` or
    /// `worker_processes`: use [`Options::workers`] / [`Options::single_process`].
    pub fn main(mut self, lines: &str) -> Self {
        self.main_extra.push_str(lines);
        self.main_extra.push('\n');
        self
    }

    /// Number of worker processes (with the master process).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// `master_process off`: one process that serves requests itself. Only for cases that need
    /// it; the call site says why.
    pub fn single_process(mut self) -> Self {
        self.master = false;
        self.workers = 1;
        self
    }

    /// Declares that error-log lines containing `needle` are expected (they do not fail the case
    /// even when they are `[alert]`, `[crit]`, `[emerg]` or "exited on signal").
    pub fn expect_log(mut self, needle: &str) -> Self {
        self.expected.push(needle.to_string());
        self
    }

    /// Uses these ports for `{P0}`…`{P9}` (several instances can then share one port table). No
    /// retry when one is taken.
    pub fn ports(mut self, ports: &[u16]) -> Self {
        self.ports = Some(ports.to_vec());
        self
    }

    /// Runs nginx under a wrapper command, e.g. `["valgrind", "--log-file=..."]`.
    pub fn wrapper(mut self, argv: &[&str]) -> Self {
        self.wrapper = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Time limits for startup (listening and workers up) and for the master to exit after
    /// `SIGQUIT` (also used for a reload's new workers). Defaults 10 s and 10 s.
    pub fn timeouts(mut self, start: Duration, stop: Duration) -> Self {
        self.start_timeout = start;
        self.stop_timeout = stop;
        self
    }

    /// Starts nginx with this `http {}` body and waits until every port written as
    /// `listen 127.0.0.1:{Pn}` (one space after `listen`) accepts connections and, with the master
    /// process, every worker runs. Without [`Options::ports`], a start that fails (a port taken
    /// meanwhile) is retried twice with new ports.
    pub fn start(&self, http: &str) -> Result<Nginx, Failed> {
        check_prerequisites()?;
        if let Some(ports) = &self.ports {
            return Ok(Nginx::try_start(self.clone(), http, ports.clone())?);
        }
        let mut last_err = String::new();
        for _ in 0..3 {
            match Nginx::try_start(self.clone(), http, free_ports(PORTS)) {
                Ok(n) => return Ok(n),
                Err(e) => last_err = e,
            }
        }
        Err(last_err.into())
    }
}

/// The whole `nginx.conf` around an `http {}` body.
pub(crate) fn full_config(opts: &Options, http: &str, prefix: &Path) -> String {
    let so = module_path();
    let p = prefix.display();
    let master = if opts.master { "on" } else { "off" };
    format!(
        "load_module {so};\n\
         daemon off;\n\
         master_process {master};\n\
         worker_processes {workers};\n\
         error_log {p}/logs/error.log info;\n\
         pid {p}/logs/nginx.pid;\n\
         {main_extra}\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
         access_log off;\n\
         client_body_temp_path {p}/tmp/body;\n\
         proxy_temp_path {p}/tmp/proxy;\n\
         fastcgi_temp_path {p}/tmp/fastcgi;\n\
         uwsgi_temp_path {p}/tmp/uwsgi;\n\
         scgi_temp_path {p}/tmp/scgi;\n\
         {http}\n\
         }}\n",
        so = so.display(),
        workers = opts.workers,
        main_extra = opts.main_extra,
    )
}

/// Writes `conf/nginx.conf` into `dir` with the placeholders of both parts filled.
pub(crate) fn write_config(
    dir: &Path,
    opts: &Options,
    http: &str,
    ports: &[u16],
    dead: u16,
) -> Result<PathBuf, String> {
    let conf = dir.join("conf/nginx.conf");
    let mut filled = opts.clone();
    filled.main_extra = crate::fill(&opts.main_extra, ports, dead, dir);
    let http = crate::fill(http, ports, dead, dir);
    fs::write(&conf, full_config(&filled, &http, dir))
        .map_err(|e| format!("write {}: {e}", conf.display()))?;
    Ok(conf)
}

/// `nginx -p DIR -e DIR/logs/error.log -c CONF` (under the wrapper, if any) with stdin closed.
pub(crate) fn nginx_command(dir: &Path, conf: &Path, wrapper: &[String]) -> Command {
    let mut c = match wrapper.split_first() {
        Some((prog, args)) => {
            let mut c = Command::new(prog);
            c.args(args).arg(nginx_bin());
            c
        }
        None => Command::new(nginx_bin()),
    };
    c.arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("logs/error.log"))
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null());
    c
}

/// Error-log lines with a [`BAD_LOG_MARKERS`] marker that contain none of `expected`.
pub fn unexpected_log_lines(log: &str, expected: &[String]) -> Vec<String> {
    log.lines()
        .filter(|l| BAD_LOG_MARKERS.iter().any(|m| l.contains(m)))
        .filter(|l| !expected.iter().any(|e| l.contains(e.as_str())))
        .map(str::to_string)
        .collect()
}

/// A running nginx; stopped with `SIGQUIT` (see the module docs) and its prefix removed on drop.
pub struct Nginx {
    child: Option<Child>,
    ports: Vec<u16>,
    dead: u16,
    opts: Options,
    http: String,
    dir: TempDir,
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

    fn try_start(opts: Options, http: &str, ports: Vec<u16>) -> Result<Nginx, String> {
        let dir = TempDir::new()?;
        let dead = dead_port();
        let conf = write_config(&dir.0, &opts, http, &ports, dead)?;
        let stderr_path = dir.0.join("logs/stderr.log");
        let stderr = fs::File::create(&stderr_path)
            .map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
        let child = nginx_command(&dir.0, &conf, &opts.wrapper)
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
        let deadline = Instant::now() + n.opts.start_timeout;
        loop {
            if let Some(child) = n.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let err = fs::read_to_string(&stderr_path).unwrap_or_default();
                    n.child = None;
                    return Err(format!(
                        "nginx exited ({status}):\n{err}\n{}",
                        n.error_log()
                    ));
                }
            }
            let workers_up = !n.opts.master || n.workers().len() >= n.opts.workers;
            if workers_up
                && listen
                    .iter()
                    .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return Ok(n);
            }
            if Instant::now() > deadline {
                let log = n.error_log();
                n.shutdown();
                return Err(format!(
                    "nginx did not listen with its workers within {:?}:\n{log}",
                    n.opts.start_timeout
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port that replaced `{Pi}`.
    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// The port that replaced `{DEAD}` (nothing listens there).
    pub fn dead_port(&self) -> u16 {
        self.dead
    }

    /// The prefix directory.
    pub fn prefix(&self) -> &Path {
        &self.dir.0
    }

    /// Contents of `logs/error.log` so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.0.join("logs/error.log")).unwrap_or_default()
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
        write_config(&self.dir.0, &self.opts, http, &self.ports, self.dead)?;
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
        let out = f(&self.dir.0);
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
        procfs::signal(pid, Sig::Quit);
        let deadline = Instant::now() + self.opts.stop_timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        problems.push(format!("nginx {pid} exited with {status} after SIGQUIT"));
                    }
                    return problems;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => break,
            }
        }
        // Workers are children of the live master: their pids cannot have been reused yet.
        let left = procfs::children(pid);
        problems.push(format!(
            "nginx master {pid} did not exit within {:?} after SIGQUIT (workers left: {left:?}); killed",
            self.opts.stop_timeout
        ));
        for &w in &left {
            procfs::signal(w, Sig::Kill);
        }
        let _ = child.kill();
        let _ = child.wait();
        // A SIGKILLed worker dies when the kernel next schedules it (later on a loaded machine)
        // and is then reaped by whoever inherited it: return once none is alive, bounded.
        let deadline = Instant::now() + Duration::from_secs(3);
        while left.iter().any(|&w| procfs::alive(w)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
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
                self.dir.0.display(),
                problems.join("\n"),
                self.http
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unexpected_lines_are_bad_markers_not_declared() {
        let log = "2026/01/01 [notice] 1#1: start worker process 7\n\
                   2026/01/01 [alert] 1#1: worker process 7 exited on signal 11\n\
                   2026/01/01 [crit] 7#7: *1 open() failed\n\
                   2026/01/01 [emerg] 1#1: bind() failed\n\
                   2026/01/01 [error] 7#7: *2 connect() failed\n\
                   2026/01/01 [notice] 1#1: worker process 8 exited on signal 9\n";
        let all = unexpected_log_lines(log, &[]);
        assert_eq!(all.len(), 4, "{all:?}");
        assert!(all[0].contains("exited on signal 11"));
        assert!(all[3].contains("exited on signal 9"));
        let left = unexpected_log_lines(log, &["bind() failed".into(), "open()".into()]);
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.iter().all(|l| l.contains("exited on signal")));
    }

    #[test]
    fn default_config_runs_master_and_two_workers() {
        let c = full_config(&Options::new(), "", Path::new("/p"));
        assert!(
            c.contains("master_process on;\nworker_processes 2;\n"),
            "{c}"
        );
        let c = full_config(&Options::new().single_process(), "", Path::new("/p"));
        assert!(
            c.contains("master_process off;\nworker_processes 1;\n"),
            "{c}"
        );
        let c = full_config(
            &Options::new().workers(4).main("env X;"),
            "",
            Path::new("/p"),
        );
        assert!(
            c.contains("worker_processes 4;") && c.contains("env X;"),
            "{c}"
        );
    }
}
