//! Client traffic through the front nginx: keep-alive clients (many requests per connection),
//! new-connection clients (one request each) and long-lived requests (a 25 s stream each). Every
//! failed request is kept with what is needed to explain it afterwards: when it started and
//! ended, at which stage it broke, which worker served its connection (the `X-Worker` header of
//! an earlier answer on it, or of its own header) and that worker's state at that moment.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::{self, Stage};
use crate::stack::{self, BINDINGS, SLOW_BYTES};

/// Client kinds.
pub const KEEPALIVE: &str = "keep-alive";
pub const NEWCONN: &str = "new-connection";
pub const LONG: &str = "long-lived";

/// One failed request.
#[derive(Debug, Clone)]
pub struct ClientError {
    pub kind: &'static str,
    pub path: String,
    /// Seconds since the soak started.
    pub start_s: f64,
    pub end_s: f64,
    /// `None`: the request got an answer, which was wrong (`status`).
    pub stage: Option<Stage>,
    pub status: Option<u16>,
    pub error: String,
    pub bytes: u64,
    /// The connection was closed or reset by the peer (not a timeout, not refused).
    pub closed: bool,
    /// The worker that served the connection (from an earlier answer on it or its own header).
    pub worker: Option<u32>,
    /// Its state when the request failed: `running`, `shutting down` or `gone`.
    pub worker_state: &'static str,
    /// The request was sent on a connection that had carried answers before.
    pub reused: bool,
}

/// What the clients share with the driver.
pub struct Shared {
    pub t0: Instant,
    pub end_at: Instant,
    pub stop: AtomicBool,
    pub port: u16,
    pub errors: Mutex<Vec<ClientError>>,
    pub ok: [AtomicU64; 3],
    /// Keep-alive requests sent again on a new connection after their reused connection closed
    /// before any answer byte (what HTTP clients do for an idempotent request).
    pub retried: AtomicU64,
}

impl Shared {
    pub fn secs(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.t0).as_secs_f64()
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }
}

fn worker_state(pid: Option<u32>) -> &'static str {
    let Some(pid) = pid else {
        return "unknown";
    };
    let cmd = stack::cmdline(pid);
    if cmd.is_empty() {
        "gone"
    } else if cmd.contains("shutting down") {
        "shutting down"
    } else {
        "running"
    }
}

struct Req<'a> {
    shared: &'a Shared,
    kind: &'static str,
    path: String,
    start: Instant,
}

impl Req<'_> {
    fn fail(
        &self,
        f: Option<&client::Failure>,
        status: Option<u16>,
        worker: Option<u32>,
        reused: bool,
    ) {
        let e = ClientError {
            kind: self.kind,
            path: self.path.clone(),
            start_s: self.shared.secs(self.start),
            end_s: self.shared.secs(Instant::now()),
            stage: f.map(|f| f.stage),
            status,
            error: f.map_or_else(
                || format!("HTTP {}", status.unwrap_or(0)),
                |f| f.error.clone(),
            ),
            bytes: f.map_or(0, |f| f.bytes),
            closed: f.is_some_and(|f| f.closed),
            worker,
            worker_state: worker_state(worker),
            reused,
        };
        self.shared.errors.lock().unwrap().push(e);
    }
}

fn pick_path(rng: &mut fastrand::Rng, tail: &str) -> String {
    let (name, _) = BINDINGS[rng.usize(..BINDINGS.len())];
    format!("/u/{name}/{tail}")
}

/// The answer of a backend: `b<N>`.
fn good(a: &client::Answer) -> bool {
    a.status == 200 && a.body.first() == Some(&b'b')
}

/// Requests on one connection after another; a connection is replaced when the server closes it.
pub fn keepalive_client(shared: Arc<Shared>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut conn: Option<(std::io::BufReader<std::net::TcpStream>, Option<u32>, u32)> = None;
    let mut retry_path: Option<String> = None;
    while shared.running() {
        let path = retry_path
            .take()
            .unwrap_or_else(|| pick_path(&mut rng, "ka"));
        let req = Req {
            shared: &shared,
            kind: KEEPALIVE,
            path: path.clone(),
            start: Instant::now(),
        };
        if conn.is_none() {
            match client::connect(shared.port, Duration::from_secs(10)) {
                Ok(c) => conn = Some((c, None, 0)),
                Err(f) => {
                    req.fail(Some(&f), None, None, false);
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
        }
        let (c, worker, used) = conn.as_mut().expect("connected");
        let reused = *used > 0;
        match client::request(c, "GET", &path, "", "", |_, _| {}) {
            Ok(a) => {
                if good(&a) {
                    shared.ok[0].fetch_add(1, Ordering::Relaxed);
                } else {
                    req.fail(None, Some(a.status), a.worker.or(*worker), reused);
                }
                *worker = a.worker.or(*worker);
                *used += 1;
                if a.close {
                    conn = None;
                }
            }
            Err(f) => {
                let w = *worker;
                req.fail(Some(&f), None, w, reused);
                conn = None;
                if reused
                    && f.closed
                    && f.bytes == 0
                    && matches!(f.stage, Stage::Send | Stage::Head)
                {
                    shared.retried.fetch_add(1, Ordering::Relaxed);
                    retry_path = Some(path);
                    continue;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.u64(2..=10)));
    }
}

/// One request per connection (`Connection: close`).
pub fn newconn_client(shared: Arc<Shared>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while shared.running() {
        let path = pick_path(&mut rng, "new");
        let req = Req {
            shared: &shared,
            kind: NEWCONN,
            path: path.clone(),
            start: Instant::now(),
        };
        match client::connect(shared.port, Duration::from_secs(10)) {
            Err(f) => req.fail(Some(&f), None, None, false),
            Ok(mut c) => {
                let mut worker = None;
                match client::request(&mut c, "GET", &path, "Connection: close\r\n", "", |_, w| {
                    worker = w
                }) {
                    Ok(a) if good(&a) => {
                        shared.ok[1].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(a) => req.fail(None, Some(a.status), a.worker, false),
                    Err(f) => req.fail(Some(&f), None, worker, false),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.u64(5..=20)));
    }
}

/// Long-lived requests: a 25 s stream each, one after another, none started that could not end
/// before the soak does.
pub fn long_client(shared: Arc<Shared>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    // Spread the clients' phases.
    std::thread::sleep(Duration::from_millis(rng.u64(0..5000)));
    while shared.running() && Instant::now() + Duration::from_secs(40) < shared.end_at {
        let path = pick_path(&mut rng, "slow");
        let req = Req {
            shared: &shared,
            kind: LONG,
            path: path.clone(),
            start: Instant::now(),
        };
        match client::connect(shared.port, Duration::from_secs(15)) {
            Err(f) => req.fail(Some(&f), None, None, false),
            Ok(mut c) => {
                let mut worker = None;
                match client::request(&mut c, "GET", &path, "Connection: close\r\n", "", |_, w| {
                    worker = w
                }) {
                    Ok(a) if a.status == 200 && a.body.len() == SLOW_BYTES => {
                        shared.ok[2].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(a) => req.fail(None, Some(a.status), a.worker, false),
                    Err(f) => req.fail(Some(&f), None, worker, false),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.u64(100..1000)));
    }
}

/// Asks the daemon to resolve a random binding every 0.1–0.6 s: (requests, not answered).
pub fn refresh_loop(shared: &Shared, port: u16, token: &str, seed: u64) -> (u64, u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut n, mut failed) = (0, 0);
    while !shared.stop.load(Ordering::Relaxed) {
        let (name, _) = BINDINGS[rng.usize(..BINDINGS.len())];
        n += 1;
        let r = client::tcp_once(
            port,
            "POST",
            &format!("/api/v1/bindings/{name}/refresh"),
            Some(token),
            "",
            Duration::from_secs(60),
        );
        if !matches!(r, Ok((200, _))) {
            failed += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.u64(100..=600)));
    }
    (n, failed)
}
