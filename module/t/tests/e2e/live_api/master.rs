//! The live API cases' view of testkit's nginx runner: [`Master`], a [`Nginx`] (master process,
//! 2 workers or [`Master::start_workers`]'s count, in its own prefix, the error log checked on
//! drop) with the worker PIDs seen at start or at the last reload and the API requests the cases
//! send; and a test-owned slow backend.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ngx_harness::{check, check_eq, http_request, CaseResult, Failed, Nginx, Options, Response};

use super::helpers::json;

/// A running nginx ([`Nginx`]: master process and 2 workers, or [`Master::start_workers`]'s
/// count) with the workers seen at start or at the last reload. Stopped (QUIT, bounded wait, then
/// KILL), its error log checked and its prefix removed on drop.
pub struct Master {
    pub nginx: Nginx,
    /// The prefix directory.
    pub dir: PathBuf,
    /// The ports of `{P0}`…`{P9}`.
    pub ports: Vec<u16>,
    /// The port of `{DEAD}`.
    pub dead: u16,
    /// The `http {}` body running (placeholders not filled).
    pub http: String,
    pub seen_workers: BTreeSet<u32>,
}

pub fn temp_dir() -> Result<PathBuf, String> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "cu-live-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    for sub in ["conf", "logs", "tmp"] {
        fs::create_dir_all(dir.join(sub)).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    }
    Ok(dir)
}

impl Master {
    /// Starts nginx (retried with new ports when one was taken meanwhile).
    pub fn start(http: &str) -> Result<Master, Failed> {
        Self::start_workers(http, 2)
    }

    /// [`Master::start`] with `n` workers.
    pub fn start_workers(http: &str, n: usize) -> Result<Master, Failed> {
        Self::start_with(Options::new().workers(n), http)
    }

    /// [`Master::start`] with these options (expected log lines, main-context lines...).
    pub fn start_with(opts: Options, http: &str) -> Result<Master, Failed> {
        let nginx = opts
            .timeouts(Duration::from_secs(10), Duration::from_secs(15))
            .start(http)?;
        let seen_workers = nginx.workers().into_iter().collect();
        Ok(Master {
            dir: nginx.prefix().to_path_buf(),
            ports: nginx.ports().to_vec(),
            dead: nginx.dead_port(),
            http: http.to_string(),
            seen_workers,
            nginx,
        })
    }

    /// Writes `conf/nginx.conf` with a new `http {}` body without reloading.
    pub fn write_config(&self, http: &str) -> CaseResult {
        self.nginx.write_config(http)
    }

    pub fn master_pid(&self) -> u32 {
        self.nginx.pid().unwrap_or(0)
    }

    /// PIDs of the master's live worker processes (from /proc).
    pub fn workers(&self) -> BTreeSet<u32> {
        self.nginx.workers().into_iter().collect()
    }

    pub fn error_log(&self) -> String {
        self.nginx.error_log()
    }

    /// Declares error-log lines containing `needle` as expected (see [`Nginx::expect_log`]).
    pub fn expect_log(&self, needle: &str) {
        self.nginx.expect_log(needle);
    }

    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// Reloads with a new `http {}` body; waits until only new workers run.
    pub fn reload(&mut self, http: &str) -> CaseResult {
        let old = self.nginx.reload(http)?;
        self.http = http.to_string();
        self.nginx.wait_exited(&old, Duration::from_secs(15))?;
        self.seen_workers = self.workers();
        Ok(())
    }

    pub fn api(&self, method: &str, path: &str, body: &str) -> Result<Response, Failed> {
        http_request(
            self.port(0),
            method,
            &format!("/api{path}"),
            &[],
            body.as_bytes(),
        )
    }

    pub fn get_json(&self, path: &str) -> Result<serde_json::Value, Failed> {
        let r = self.api("GET", path, "")?;
        check_eq(
            r.status,
            200,
            &format!("GET /api{path} status ({})", r.text()),
        )?;
        json(&r)
    }

    pub fn put(&self, name: &str, body: &str) -> Result<Response, Failed> {
        self.api("PUT", &format!("/{name}"), body)
    }

    /// `GET /` on the front server: (worker pid, body).
    pub fn front(&self) -> Result<(u32, String), Failed> {
        let r = http_request(self.port(0), "GET", "/", &[], b"")?;
        let w = r
            .header("X-Worker")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Ok((w, r.text().trim().to_string()))
    }

    /// Checks that the workers are still the ones seen at start or at the last reload (a crash
    /// makes the master start a new one) and that no worker died on a signal.
    pub fn check_workers_unchanged(&self) -> CaseResult {
        check_eq(self.workers(), self.seen_workers.clone(), "worker PIDs")?;
        let log = self.error_log();
        check(!log.contains("exited on signal"), || {
            format!("a worker crashed:\n{log}")
        })
    }
}

/// A backend on a test-owned socket that holds each answer until released.
pub struct SlowBackend {
    pub port: u16,
    pub release: Arc<AtomicBool>,
    pub accepted: mpsc::Receiver<()>,
    pub _thread: std::thread::JoinHandle<()>,
}

impl SlowBackend {
    pub fn start() -> Result<SlowBackend, Failed> {
        Self::start_mode(false)
    }

    /// `fail`: on release, close the connection without an answer (nginx then tries the next
    /// server).
    pub fn start_mode(fail: bool) -> Result<SlowBackend, Failed> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        let release = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let rel = release.clone();
        let t = std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let _ = tx.send(());
                let mut buf = [0u8; 4096];
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = s.read(&mut buf);
                let deadline = Instant::now() + Duration::from_secs(30);
                while !rel.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if !fail {
                    let _ = s.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nslow\n",
                    );
                }
                drop(s);
                if rel.load(Ordering::SeqCst) {
                    return;
                }
            }
        });
        Ok(SlowBackend {
            port,
            release,
            accepted: rx,
            _thread: t,
        })
    }
}
