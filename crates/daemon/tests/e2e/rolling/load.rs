//! The backends and the keep-alive client load of `rolling.rs`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tributary_testkit::Nginx;

/// Keep-alive client connections of the load.
pub const CLIENTS: usize = 12;

const SERVING: u8 = 0;
const SILENT: u8 = 1;
const CLOSED: u8 = 2;

/// A test backend: 503 until `warm_until`, then 200; `SILENT` accepts and reads but never
/// answers; `CLOSED` has no listener. Counts probes and proxied requests (answered 503 or not).
pub struct Backend {
    pub port: u16,
    mode: Arc<AtomicU8>,
    pub proxied: Arc<AtomicUsize>,
    pub proxied_503: Arc<AtomicUsize>,
    pub probes: Arc<AtomicUsize>,
}

impl Backend {
    pub fn start(warm: Duration) -> Backend {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let warm_until = Instant::now() + warm;
        let b = Backend {
            port,
            mode: Arc::new(AtomicU8::new(SERVING)),
            proxied: Arc::default(),
            proxied_503: Arc::default(),
            probes: Arc::default(),
        };
        let (mode, proxied, proxied_503, probes) = (
            b.mode.clone(),
            b.proxied.clone(),
            b.proxied_503.clone(),
            b.probes.clone(),
        );
        std::thread::spawn(move || {
            for s in l.incoming() {
                if mode.load(Ordering::SeqCst) == CLOSED {
                    return; // drops the listener: connections are refused from now on
                }
                let Ok(s) = s else { continue };
                let (mode, proxied, proxied_503, probes) = (
                    mode.clone(),
                    proxied.clone(),
                    proxied_503.clone(),
                    probes.clone(),
                );
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut probe = false;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        probe |= h
                            .to_ascii_lowercase()
                            .starts_with("user-agent: tributary-probe");
                    }
                    let warming = Instant::now() < warm_until;
                    if probe {
                        probes.fetch_add(1, Ordering::SeqCst);
                    } else {
                        proxied.fetch_add(1, Ordering::SeqCst);
                        if warming {
                            proxied_503.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    // Silent: hold the connection without a byte until the backend is closed.
                    while mode.load(Ordering::SeqCst) == SILENT {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    if mode.load(Ordering::SeqCst) == CLOSED {
                        return;
                    }
                    let answer: &[u8] = if warming {
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\nConnection: close\r\n\r\nwarming"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    };
                    let _ = w.write_all(answer);
                });
            }
        });
        b
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn go_silent(&self) {
        self.mode.store(SILENT, Ordering::SeqCst);
    }

    /// Stops listening (wakes the accept loop so it drops the listener) and ends held connections.
    pub fn close(&self) {
        if self.mode.swap(CLOSED, Ordering::SeqCst) != CLOSED {
            // A bare connect (no HTTP) that only wakes the accept loop.
            let _ = TcpStream::connect(("127.0.0.1", self.port));
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.close();
    }
}

/// What the clients saw.
#[derive(Default, Debug)]
pub struct Tally {
    pub ok: usize,
    /// Non-2xx answers by status.
    pub bad: BTreeMap<u16, usize>,
    /// Requests that got no answer (connection error, unparsable answer).
    pub errors: usize,
}

impl Tally {
    pub fn total(&self) -> usize {
        self.ok + self.failed()
    }
    pub fn failed(&self) -> usize {
        self.bad.values().sum::<usize>() + self.errors
    }
}

// Raw on purpose, not testkit's `KeepAlive`: held-open load that must see `Connection: close`,
// reopen, and count each I/O error as a failed client request instead of failing the test.
/// One keep-alive request on `conn` (opened if `None`): the status, or an error (the connection
/// is then dropped). Keeps the connection unless nginx closes it.
fn request(conn: &mut Option<BufReader<TcpStream>>, port: u16, path: &str) -> std::io::Result<u16> {
    if conn.is_none() {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_nodelay(true)?;
        *conn = Some(BufReader::new(s));
    }
    let r = conn.as_mut().unwrap();
    let result = (|| {
        write!(
            r.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n"
        )?;
        let mut line = String::new();
        r.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("status line {line:?}")))?;
        let (mut length, mut close) = (None, false);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Err(std::io::Error::other("eof in the header"));
            }
            if h == "\r\n" {
                break;
            }
            let h = h.to_ascii_lowercase();
            if let Some(v) = h.strip_prefix("content-length:") {
                length = v.trim().parse::<usize>().ok();
            }
            close |= h.starts_with("connection: close");
        }
        let length = length.ok_or_else(|| std::io::Error::other("no content-length"))?;
        let mut body = vec![0; length];
        r.read_exact(&mut body)?;
        Ok((status, close))
    })();
    match result {
        Ok((status, close)) => {
            if close {
                *conn = None;
            }
            Ok(status)
        }
        Err(e) => {
            *conn = None;
            Err(e)
        }
    }
}

/// [`CLIENTS`] threads sending requests on keep-alive connections until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    tally: Arc<Mutex<Tally>>,
    started: Instant,
}

impl Load {
    pub fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let path = Nginx::upstream_path("web");
        let threads = (0..CLIENTS)
            .map(|_| {
                let (stop, tally, path) = (stop.clone(), tally.clone(), path.clone());
                std::thread::spawn(move || {
                    let mut conn = None;
                    let mut mine = Tally::default();
                    while !stop.load(Ordering::SeqCst) {
                        match request(&mut conn, port, &path) {
                            Ok(s) if (200..300).contains(&s) => mine.ok += 1,
                            Ok(s) => *mine.bad.entry(s).or_default() += 1,
                            Err(_) => mine.errors += 1,
                        }
                    }
                    let mut t = tally.lock().unwrap();
                    t.ok += mine.ok;
                    t.errors += mine.errors;
                    for (s, n) in mine.bad {
                        *t.bad.entry(s).or_default() += n;
                    }
                })
            })
            .collect();
        Load {
            stop,
            threads,
            tally,
            started: Instant::now(),
        }
    }

    /// Stops the clients: what they saw and for how long.
    pub fn finish(self) -> (Tally, Duration) {
        self.stop.store(true, Ordering::SeqCst);
        let took = self.started.elapsed();
        for t in self.threads {
            t.join().unwrap();
        }
        let t = std::mem::take(&mut *self.tally.lock().unwrap());
        (t, took)
    }
}
