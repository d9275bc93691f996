//! The nginx runner of the live API tests: a master with 2 workers in its own prefix (PIDs from
//! `/proc`, reloads, stop on drop), and a test-owned slow backend.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ngx_harness::{
    check, check_eq, dead_port, fill, free_ports, http_request, module_path, nginx_bin, CaseResult,
    Failed, Response,
};

use super::helpers::json;

/// A running nginx with a master process and 2 workers (or [`Master::start_workers`]'s count), in
/// its own prefix; stopped (QUIT, then
/// KILL of master and workers) and its prefix removed on drop.
pub struct Master {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub ports: Vec<u16>,
    pub dead: u16,
    pub http: String,
    pub seen_workers: BTreeSet<u32>,
    /// `worker_processes`.
    pub worker_count: usize,
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
    /// Starts nginx; retried twice, since a port picked as free can be taken by another process
    /// before nginx binds it.
    pub fn start(http: &str) -> Result<Master, Failed> {
        Self::start_workers(http, 2)
    }

    /// [`Master::start`] with `n` workers.
    pub fn start_workers(http: &str, n: usize) -> Result<Master, Failed> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(http, n) {
                Ok(m) => return Ok(m),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| "nginx did not start".into()))
    }

    pub fn try_start(http: &str, worker_count: usize) -> Result<Master, Failed> {
        let so = module_path();
        check(so.is_file(), || {
            format!(
                "module not found at {} (cargo build --release -p ngx-combined-upstreams)",
                so.display()
            )
        })?;
        let mut m = Master {
            child: None,
            dir: temp_dir()?,
            ports: free_ports(ngx_harness::PORTS),
            dead: dead_port(),
            http: http.to_string(),
            seen_workers: BTreeSet::new(),
            worker_count,
        };
        m.write_config(http)?;
        let stderr = fs::File::create(m.dir.join("logs/stderr.log")).map_err(|e| e.to_string())?;
        let child = Command::new(nginx_bin())
            .arg("-p")
            .arg(&m.dir)
            .arg("-e")
            .arg(m.dir.join("logs/error.log"))
            .arg("-c")
            .arg(m.dir.join("conf/nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("start nginx: {e}"))?;
        m.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = m.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    m.child = None;
                    return Err(format!(
                        "nginx exited ({st}): {}{}",
                        fs::read_to_string(m.dir.join("logs/stderr.log")).unwrap_or_default(),
                        m.error_log()
                    )
                    .into());
                }
            }
            if TcpStream::connect(("127.0.0.1", m.ports[0])).is_ok()
                && m.workers().len() == worker_count
            {
                break;
            }
            check(Instant::now() < deadline, || {
                format!("nginx did not start: {}", m.error_log())
            })?;
            std::thread::sleep(Duration::from_millis(20));
        }
        m.seen_workers = m.workers();
        Ok(m)
    }

    pub fn write_config(&self, http: &str) -> Result<(), String> {
        let d = self.dir.display();
        let http = fill(http, &self.ports, self.dead, &self.dir);
        let conf = format!(
            "load_module {so};\ndaemon off;\nmaster_process on;\nworker_processes {n};\n\
             error_log {d}/logs/error.log info;\npid {d}/logs/nginx.pid;\n\
             events {{ worker_connections 1024; }}\nhttp {{\naccess_log off;\n\
             client_body_temp_path {d}/tmp/body;\nproxy_temp_path {d}/tmp/proxy;\n\
             fastcgi_temp_path {d}/tmp/fastcgi;\nuwsgi_temp_path {d}/tmp/uwsgi;\nscgi_temp_path {d}/tmp/scgi;\n{http}\n}}\n",
            so = module_path().display(),
            n = self.worker_count
        );
        fs::write(self.dir.join("conf/nginx.conf"), conf).map_err(|e| e.to_string())
    }

    pub fn master_pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// PIDs of the master's live worker processes (from /proc).
    pub fn workers(&self) -> BTreeSet<u32> {
        let master = self.master_pid();
        let mut out = BTreeSet::new();
        let Ok(rd) = fs::read_dir("/proc") else {
            return out;
        };
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...
            let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
            let f: Vec<&str> = after.split_whitespace().collect();
            if f.len() > 1 && f[1].parse::<u32>().ok() == Some(master) && f[0] != "Z" {
                out.insert(pid);
            }
        }
        out
    }

    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// `nginx -s reload` with a new `http {}` body; waits until only new workers run.
    pub fn reload(&mut self, http: &str) -> CaseResult {
        self.write_config(http)?;
        self.http = http.to_string();
        let old = self.workers();
        let out = Command::new(nginx_bin())
            .arg("-p")
            .arg(&self.dir)
            .arg("-e")
            .arg(self.dir.join("logs/error.log"))
            .arg("-c")
            .arg(self.dir.join("conf/nginx.conf"))
            .args(["-s", "reload"])
            .output()
            .map_err(|e| format!("nginx -s reload: {e}"))?;
        check(out.status.success(), || {
            format!("reload failed: {}", String::from_utf8_lossy(&out.stderr))
        })?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = self.workers();
            if now.len() == self.worker_count && now.is_disjoint(&old) {
                self.seen_workers = now;
                return Ok(());
            }
            check(Instant::now() < deadline, || {
                format!(
                    "reload did not replace workers {old:?}: {now:?}\n{}",
                    self.error_log()
                )
            })?;
            std::thread::sleep(Duration::from_millis(20));
        }
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

impl Drop for Master {
    fn drop(&mut self) {
        let workers = self.workers();
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-QUIT")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for w in workers {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(w.to_string())
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.dir);
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
