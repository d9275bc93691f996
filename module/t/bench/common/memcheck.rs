//! What the valgrind memcheck benches share: the valgrind wrapper for `ngx_harness`'s
//! `Options::wrapper` (every nginx process under memcheck, one log per process), the `ERROR SUMMARY`
//! of each log, misbehaving backends (slow, silent, closing without an answer) served by threads of
//! the bench process, and loaders that send requests until told to stop.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ngx_harness::http_get;

use super::Res;

/// `valgrind --tool=memcheck … --trace-children=yes --log-file=DIR/valgrind.%p.log` with `extra`
/// options, as the argv of `Options::wrapper`.
pub fn valgrind_argv(log_dir: &Path, extra: &[String]) -> Vec<String> {
    let mut v: Vec<String> = vec!["valgrind".into(), "--tool=memcheck".into()];
    v.extend(extra.iter().cloned());
    v.extend(
        [
            "--num-callers=40",
            "--error-limit=no",
            "--trace-children=yes",
        ]
        .map(String::from),
    );
    v.push(format!(
        "--log-file={}",
        log_dir.join("valgrind.%p.log").display()
    ));
    v
}

/// Every `valgrind.*.log` in `dir` with its last `ERROR SUMMARY` (without the `==PID==` prefix),
/// sorted by name.
pub fn summaries(dir: &Path) -> Res<Vec<(String, Option<String>)>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("valgrind.") && name.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let summary = text
            .lines()
            .rfind(|l| l.contains("ERROR SUMMARY"))
            .map(|l| match l.split_once("== ") {
                Some((pid, rest)) if pid.starts_with("==") => rest.to_string(),
                _ => l.to_string(),
            });
        out.push((name, summary));
    }
    out.sort();
    Ok(out)
}

/// Prints `bench: FILE: SUMMARY` per log; true when every log says `ERROR SUMMARY: 0 errors`.
pub fn report_summaries(bench: &str, dir: &Path) -> Res<bool> {
    let all = summaries(dir)?;
    if all.is_empty() {
        println!("{bench}: no valgrind log in {}", dir.display());
        return Ok(false);
    }
    let mut ok = true;
    for (file, s) in &all {
        let s = s
            .clone()
            .unwrap_or_else(|| "no summary (process still running?)".into());
        println!("{bench}: {file}: {s}");
        ok &= s.contains("ERROR SUMMARY: 0 errors");
    }
    Ok(ok)
}

/// How a backend of [`backend`] treats each connection.
#[derive(Clone, Copy)]
pub enum Behaviour {
    /// Reads the request, waits, answers 200 `slow`.
    SlowOk(Duration),
    /// Reads the request, waits, closes without an answer.
    SlowClose(Duration),
    /// Accepts and never answers; holds the last `n` connections open.
    Silent(usize),
}

/// A backend on 127.0.0.1:`port` served by threads of this process until it exits.
pub fn backend(port: u16, how: Behaviour) -> Res<()> {
    let l = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("bind backend 127.0.0.1:{port}: {e}"))?;
    std::thread::spawn(move || {
        let mut held = std::collections::VecDeque::new();
        for c in l.incoming().flatten() {
            match how {
                Behaviour::Silent(n) => {
                    held.push_back(c);
                    if held.len() > n {
                        held.pop_front();
                    }
                }
                Behaviour::SlowOk(d) | Behaviour::SlowClose(d) => {
                    std::thread::spawn(move || {
                        let mut c = c;
                        let mut buf = [0u8; 4096];
                        let _ = c.read(&mut buf);
                        std::thread::sleep(d);
                        if matches!(how, Behaviour::SlowOk(_)) {
                            let _ = c.write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nslow\n",
                            );
                        }
                    });
                }
            }
        }
    });
    Ok(())
}

/// Threads sending `GET`s of `paths` in turn (a new connection each) to 127.0.0.1:`port` until
/// [`Loaders::stop`]; answers and failures are not judged here (the access log is).
pub struct Loaders {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Loaders {
    /// Starts `n` loader threads.
    pub fn start(n: usize, port: u16, paths: &[&str]) -> Loaders {
        let stop = Arc::new(AtomicBool::new(false));
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let threads = (0..n)
            .map(|_| {
                let (stop, paths) = (stop.clone(), paths.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        for p in &paths {
                            let _ = http_get(port, p, &[]);
                        }
                    }
                })
            })
            .collect();
        Loaders { stop, threads }
    }

    /// Stops the loaders and waits for their last requests.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// `PUT /api/UPSTREAM` with `{"servers":[SET]}`: the final status (0 when no answer) and how many
/// times it was sent again after the API's 503 "reloading, retry" (a worker of the configuration a
/// reload replaces answered; the API says a new connection reaches a new worker: up to 50 tries,
/// 100 ms apart).
pub fn put_set(port: u16, upstream: &str, set: &str) -> (u16, u32) {
    let body = format!(r#"{{"servers":[{set}]}}"#);
    let path = format!("/api/{upstream}");
    let mut retries = 0;
    loop {
        let r = ngx_harness::http_request(port, "PUT", &path, &[], body.as_bytes());
        match r {
            Ok(r) if r.status == 503 && r.text().contains("reloading, retry") && retries < 50 => {
                retries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(r) => return (r.status, retries),
            Err(_) => return (0, retries),
        }
    }
}
