//! What a test does with a running [`Nginx`]: requests (on the main port, on `{Pn}`, over a
//! keep-alive connection), reloads (by `SIGHUP` with a new `http {}` body, or by the commands the
//! daemon's `CommandNginx` runs) and waiting for them to settle, and the fixture's backends and
//! named ports.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::client::{self, http_request, KeepAlive, Response};
use crate::options::write_config;
use crate::procfs::{self, Sig};
use crate::{http_get, network_isolation_available, CaseResult, Failed, Nginx};

impl Nginx {
    /// `GET path` on the main port; returns `(status, body)`. Panics on a connection error.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.try_get(path)
            .unwrap_or_else(|e| panic!("GET http://127.0.0.1:{}{path}: {e}", self.port()))
    }

    /// `GET path` on the main port; returns `(status, body)`.
    pub fn try_get(&self, path: &str) -> io::Result<(u16, String)> {
        http_get(self.port(), path)
    }

    /// `GET path` on port `{Pi}` (a new connection: any worker may serve it).
    pub fn get_on(&self, i: usize, path: &str) -> Result<Response, Failed> {
        client::http_get(self.ports[i], path, &[])
    }

    /// `GET path` on port `{Pi}` with extra request headers.
    pub fn get_with(
        &self,
        i: usize,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response, Failed> {
        client::http_get(self.ports[i], path, headers)
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
        http_request(self.ports[i], method, path, headers, body)
    }

    /// A keep-alive connection to port `{Pi}`: every request on it is served by one worker, so a
    /// case can observe that worker's state (round-robin cursors, blacklists, failed peers).
    pub fn keep_alive(&self, i: usize) -> Result<KeepAlive, Failed> {
        KeepAlive::open(self.ports[i])
    }

    /// Writes a new `conf/nginx.conf` with this `http {}` body (same ports) without signalling
    /// the master: for a case that reloads by other means (`nginx -s reload`) or not at all.
    /// [`Nginx::http`] still names the running configuration.
    pub fn write_config(&self, http: &str) -> CaseResult {
        write_config(self.prefix(), &self.opts, http, &self.ports, self.dead)?;
        Ok(())
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
        write_config(self.prefix(), &self.opts, http, &self.ports, self.dead)?;
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
            thread::sleep(Duration::from_millis(10));
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
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The `--live-api` address of the API a builder's [`crate::NginxBuilder::live_api`] set up.
    pub fn live_api_address(&self) -> String {
        format!("unix:{}/logs/api.sock:/api/", self.prefix().display())
    }

    /// The port of a backend added with [`crate::NginxBuilder::backend`]. Panics if unknown.
    pub fn backend_port(&self, name: &str) -> u16 {
        self.fixture
            .backends
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no backend named {name:?}"))
    }

    /// A port reserved with [`crate::NginxBuilder::named_port`]. Panics if unknown.
    pub fn named_port(&self, name: &str) -> u16 {
        self.fixture
            .named_ports
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| panic!("no port named {name:?}"))
    }

    /// All backends as `(name, port)`.
    pub fn backends(&self) -> &[(String, u16)] {
        &self.fixture.backends
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

    /// The fixture's request path that proxies to the upstream `name`: `/u/<name>/`.
    pub fn upstream_path(name: &str) -> String {
        format!("/u/{name}/")
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
    /// served before the last reload has gone ([`Nginx::wait_settled`]) and checks again, so
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

    /// Waits until exactly the configured number of workers runs and none is shutting down:
    /// after a reload, old workers keep accepting for a moment; this waits them out. (It cannot
    /// know about a reload signal the master has not handled yet: first wait for a sign of the
    /// new configuration.)
    pub fn wait_settled(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let titles: Vec<(u32, String)> = self
                .workers()
                .into_iter()
                .map(|pid| (pid, procfs::title(pid)))
                .collect();
            // A child just forked still shows the master's title until it sets its own.
            if titles.len() == self.opts.workers
                && titles
                    .iter()
                    .all(|w| w.1.contains("worker process") && !w.1.contains("shutting down"))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nginx workers did not settle within {timeout:?}: {titles:?}"
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
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
}
