//! What the soak asserts besides the clients' errors: the daemon's view against the module's live
//! set and the file after each recovery (settled), `nginx -t` of the live files, RSS samples, and
//! nginx's error log.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tributary_testkit::Nginx;

use crate::client;
use crate::stack::{self, DaemonProc, BINDINGS};
use crate::traffic::Shared;

/// How long after a recovery the daemon and nginx have to agree.
pub const SETTLE_BOUND: Duration = Duration::from_secs(30);

type Set = Vec<(String, u64)>;

/// One binding's check after a recovery.
#[derive(Debug, Clone)]
pub struct Settle {
    pub binding: &'static str,
    /// Seconds from the recovery to the first consistent snapshot; `None`: none within the bound.
    pub took_s: Option<f64>,
    /// The snapshot disagreed: daemon, file, module sets (and the module's generation).
    pub mismatch: Option<String>,
    /// The last reason a snapshot was not taken (when it never was).
    pub last_wait: String,
}

struct DaemonView {
    at_ms: i64,
    status: String,
    running: bool,
    set: Set,
}

fn daemon_view(d: &DaemonProc, name: &str) -> Result<DaemonView, String> {
    let (status, v) = d.api("GET", &format!("/api/v1/bindings/{name}"), None)?;
    if status != 200 {
        return Err(format!("daemon: HTTP {status} {v}"));
    }
    let b = &v["binding"];
    let mut set: Set = b["servers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        format!("{}:{}", s["address"].as_str().unwrap_or(""), s["port"]),
                        s["weight"].as_u64().unwrap_or(1).max(1),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    set.sort();
    Ok(DaemonView {
        at_ms: b["last_outcome"]["at_ms"].as_i64().unwrap_or(0),
        status: b["last_outcome"]["status"]
            .as_str()
            .unwrap_or("none")
            .to_string(),
        running: b["next_refresh_ms"].is_null(),
        set,
    })
}

fn module_view(sock: &Path, name: &str) -> Result<(u64, Set), String> {
    let (status, text) = client::unix_get(sock, &format!("/api/{name}"))?;
    if status != 200 {
        return Err(format!("module: HTTP {status} {text}"));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("module: {e}: {text}"))?;
    let mut set: Set = v["servers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["address"].as_str().unwrap_or("").to_string(),
                        s["weight"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    set.sort();
    Ok((v["generation"].as_u64().unwrap_or(0), set))
}

/// After a recovery at `since` (wall clock ms for the daemon's outcomes): for each binding, waits
/// (at most [`SETTLE_BOUND`]) for a *stable snapshot* — the daemon idle on that binding (no
/// resolution running) with an `ok`/`unchanged` outcome made after the recovery, and the same
/// outcome and the same module generation and set before and after reading the file — and checks
/// that the daemon's servers, the file's and the module's live set are the same. The first stable
/// snapshot is the verdict.
pub fn settle(d: &DaemonProc, front: &Nginx, since_ms: i64, started: Instant) -> Vec<Settle> {
    let sock = stack::api_socket(front);
    let mut out = Vec::new();
    for (name, _) in BINDINGS {
        let mut r = Settle {
            binding: name,
            took_s: None,
            mismatch: None,
            last_wait: String::new(),
        };
        let deadline = started + SETTLE_BOUND;
        while Instant::now() < deadline {
            match snapshot(d, &sock, front, name, since_ms) {
                Ok(None) => {
                    r.took_s = Some(started.elapsed().as_secs_f64());
                    break;
                }
                Ok(Some(m)) => {
                    r.took_s = Some(started.elapsed().as_secs_f64());
                    r.mismatch = Some(m);
                    break;
                }
                Err(why) => r.last_wait = why,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        out.push(r);
    }
    out
}

/// `Ok(None)`: stable and equal; `Ok(Some(why))`: stable and different; `Err`: not stable yet.
fn snapshot(
    d: &DaemonProc,
    sock: &Path,
    front: &Nginx,
    name: &str,
    since_ms: i64,
) -> Result<Option<String>, String> {
    let d1 = daemon_view(d, name)?;
    if d1.running {
        return Err("a resolution is running".into());
    }
    if d1.at_ms < since_ms || !(d1.status == "ok" || d1.status == "unchanged") {
        return Err(format!(
            "no ok outcome since the recovery yet (last: {} at {})",
            d1.status, d1.at_ms
        ));
    }
    let (g1, m1) = module_view(sock, name)?;
    let file = stack::file_set(&front.upstreams_dir().join(format!("{name}.conf")))?;
    let (g2, m2) = module_view(sock, name)?;
    let d2 = daemon_view(d, name)?;
    if d2.running || d2.at_ms != d1.at_ms || g1 != g2 || m1 != m2 || d1.set != d2.set {
        return Err("changed while read".into());
    }
    if d1.set == m1 && m1 == file {
        Ok(None)
    } else {
        Ok(Some(format!(
            "{name}: daemon [{}] file [{}] module [{}] generation {g1}",
            stack::set_text(&d1.set),
            stack::set_text(&file),
            stack::set_text(&m1)
        )))
    }
}

/// `nginx -t` of the front nginx's configuration with the live files, every 1–3 s until the
/// soak stops: (runs, failures with their output and time).
pub fn nginx_t_loop(shared: Arc<Shared>, cmd: Vec<String>, seed: u64) -> (u64, Vec<String>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut runs, mut failures) = (0u64, Vec::new());
    while !shared.stop.load(Ordering::Relaxed) {
        let out = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::null())
            .output();
        runs += 1;
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => failures.push(format!(
                "{:.1} s: {}",
                shared.secs(Instant::now()),
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => failures.push(format!(
                "{:.1} s: cannot run: {e}",
                shared.secs(Instant::now())
            )),
        }
        std::thread::sleep(Duration::from_millis(rng.u64(1000..=3000)));
    }
    (runs, failures)
}

/// RSS samples (KiB) once a second: `(seconds, daemon, nginx master + accepting workers)`; the
/// daemon's only once its process is 5 s old (start-up is not its steady state).
pub struct Rss {
    pub samples: Mutex<Vec<(f64, Option<u64>, u64)>>,
    /// (daemon pid, when it started), set by the driver at each start.
    pub daemon: Mutex<Option<(u32, Instant)>>,
}

pub fn rss_loop(shared: Arc<Shared>, rss: Arc<Rss>, front_master: u32, front: Arc<Nginx>) {
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let daemon = rss
            .daemon
            .lock()
            .unwrap()
            .filter(|(_, at)| now.duration_since(*at) >= Duration::from_secs(5))
            .map(|(pid, _)| stack::rss_kib(pid))
            .filter(|kib| *kib > 0);
        let nginx = stack::rss_kib(front_master)
            + stack::live_workers(&front)
                .iter()
                .map(|p| stack::rss_kib(*p))
                .sum::<u64>();
        rss.samples
            .lock()
            .unwrap()
            .push((shared.secs(now), daemon, nginx));
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Median of the first and of the last quarter of the samples of one column.
pub fn quarters(
    samples: &[(f64, Option<u64>, u64)],
    col: impl Fn(&(f64, Option<u64>, u64)) -> Option<u64>,
) -> (u64, u64) {
    let Some(last) = samples.last() else {
        return (0, 0);
    };
    let q = last.0 / 4.0;
    let median = |lo: f64, hi: f64| {
        let mut v: Vec<u64> = samples
            .iter()
            .filter(|s| s.0 >= lo && s.0 <= hi)
            .filter_map(&col)
            .collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    (median(0.0, q), median(last.0 - q, last.0))
}

/// The `[alert]`, `[crit]` and `[emerg]` lines of an error log, split into those the soak's own
/// worker kills explain (`worker process PID exited on signal 9`, `shared memory zone ... was
/// locked by PID`, PID one the soak killed) and the rest.
pub fn scan_log(text: &str, killed: &BTreeSet<u32>) -> (Vec<String>, Vec<String>) {
    let (mut explained, mut other) = (Vec::new(), Vec::new());
    for line in text.lines() {
        if !(line.contains("[alert]") || line.contains("[crit]") || line.contains("[emerg]")) {
            continue;
        }
        let pid_after = |marker: &str| {
            line.split_once(marker).and_then(|(_, r)| {
                r.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
        };
        let ours = (line.contains(" exited on signal 9")
            && pid_after("worker process ").is_some_and(|p| killed.contains(&p)))
            || (line.contains("shared memory zone")
                && pid_after("was locked by ").is_some_and(|p| killed.contains(&p)));
        if ours {
            explained.push(line.to_string());
        } else {
            other.push(line.to_string());
        }
    }
    (explained, other)
}

/// One line per check: each binding's settle time or what went wrong.
pub fn settle_text(s: &[Settle]) -> String {
    s.iter()
        .map(|x| match (&x.took_s, &x.mismatch) {
            (Some(t), None) => format!("{} {t:.2} s", x.binding),
            (Some(_), Some(m)) => format!("{} MISMATCH {m}", x.binding),
            (None, _) => format!("{} NOT SETTLED ({})", x.binding, x.last_wait),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
