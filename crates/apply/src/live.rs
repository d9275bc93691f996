//! Confirming that a reload made the new configuration live.
//!
//! `nginx -s reload` only sends SIGHUP to the master and exits 0. The master then reads the
//! configuration again; when it fails (a port it cannot bind, a host name that no longer
//! resolves, limits) it logs `[emerg]` and keeps the old workers serving the old configuration.
//! When it succeeds it starts new workers and asks the old ones to shut down gracefully; an old
//! worker renames itself `nginx: worker process is shutting down` and closes its listening
//! sockets right away.
//!
//! So a reload is confirmed when the master (pid from its pid file) has at least one worker that
//! did not exist before the signal and every worker that is not shutting down is such a new one:
//! from then on only new workers accept connections. Processes are read from `/proc`: the
//! children of the master (`/proc/<pid>/stat`, field 4) and their titles (`/proc/<pid>/cmdline`,
//! which nginx overwrites with `nginx: worker process` …). A worker is identified by pid and
//! start time, so a reused pid is not mistaken for an old worker.
//!
//! A reload is rejected when nginx's error log gained an `[emerg]` line after the signal and no new
//! worker appeared once the log has been quiet for [`LOG_QUIET`] (nginx retries a busy port
//! every 500 ms, five times, logging each try). Without a verdict by the deadline the reload is
//! not confirmed either way; both are failures for the apply transaction.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

/// Default time a reload has to be confirmed.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the error log must stay quiet after an `[emerg]` before a reload without new workers
/// counts as rejected (longer than nginx's 500 ms pause between bind retries).
pub const LOG_QUIET: Duration = Duration::from_millis(700);

/// At most this much of the error log written after the signal is read.
const MAX_LOG_READ: u64 = 256 * 1024;

/// How to confirm reloads: where the running master's pid file and error log are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadConfirm {
    /// The pid file of the running master (nginx's `pid` directive).
    pub pid_file: PathBuf,
    /// nginx's main error log (the `error_log` of the main context), for the `[emerg]` text of a
    /// rejected reload. `None`, or a file that cannot be read: the verdict rests on the workers
    /// alone and a rejection is only known at the deadline.
    pub error_log: Option<PathBuf>,
    /// How long the master has to start new workers (default 5 s).
    pub timeout: Duration,
}

impl ReloadConfirm {
    /// Confirmation with the default timeout.
    pub fn new(pid_file: impl Into<PathBuf>, error_log: Option<PathBuf>) -> ReloadConfirm {
        ReloadConfirm {
            pid_file: pid_file.into(),
            error_log,
            timeout: DEFAULT_CONFIRM_TIMEOUT,
        }
    }
}

/// Why a reload is not confirmed. `Display` gives the text for the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotLive {
    /// The state before the signal could not be read, so the reload was not sent.
    CannotConfirm(String),
    /// The master logged `[emerg]` and started no new workers: it kept the old configuration.
    Rejected { emerg: String },
    /// No verdict within the timeout.
    Timeout {
        waited: Duration,
        detail: String,
        emerg: Option<String>,
    },
    /// The master exited after the signal.
    MasterGone { pid: u32, emerg: Option<String> },
}

impl std::error::Error for NotLive {}

impl fmt::Display for NotLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotLive::CannotConfirm(why) => write!(
                f,
                "cannot confirm a reload, so none was sent: {why} (set --nginx-pid-file, or \
                 --no-reload-confirm to trust the reload command's exit status)"
            ),
            NotLive::Rejected { emerg } => write!(
                f,
                "nginx rejected the new configuration and kept the old one:\n{emerg}"
            ),
            NotLive::Timeout {
                waited,
                detail,
                emerg,
            } => {
                write!(
                    f,
                    "nginx did not confirm the reload within {} ms: {detail}",
                    waited.as_millis()
                )?;
                match emerg {
                    Some(e) => write!(f, "\n{e}"),
                    None => Ok(()),
                }
            }
            NotLive::MasterGone { pid, emerg } => {
                write!(
                    f,
                    "the nginx master (pid {pid}) exited after the reload signal"
                )?;
                match emerg {
                    Some(e) => write!(f, ":\n{e}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A process: pid and start time (clock ticks since boot), which together never repeat.
type ProcId = (u32, u64);

/// What was true before the signal.
#[derive(Debug)]
pub(crate) struct Before {
    master: u32,
    workers: HashSet<ProcId>,
    log: Option<LogMark>,
}

#[derive(Debug, Clone, Copy)]
struct LogMark {
    ino: u64,
    len: u64,
}

impl ReloadConfirm {
    /// Reads the master's pid and its current workers, and marks the end of the error log.
    pub(crate) fn before(&self) -> Result<Before, NotLive> {
        let text = fs::read_to_string(&self.pid_file).map_err(|e| {
            NotLive::CannotConfirm(format!(
                "reading the nginx pid file {}: {e}",
                self.pid_file.display()
            ))
        })?;
        let master: u32 = text.trim().parse().map_err(|_| {
            NotLive::CannotConfirm(format!(
                "the nginx pid file {} holds {:?}, not a pid",
                self.pid_file.display(),
                text.trim()
            ))
        })?;
        if stat_of(master).is_none() {
            return Err(NotLive::CannotConfirm(format!(
                "no process {master} (from {}) in /proc: nginx is not running, or runs in \
                 another pid namespace",
                self.pid_file.display()
            )));
        }
        let workers = children(master)
            .into_iter()
            .map(|c| c.id)
            .collect::<HashSet<_>>();
        let log = self.error_log.as_deref().and_then(|p| {
            fs::metadata(p).ok().map(|m| LogMark {
                ino: m.ino(),
                len: m.len(),
            })
        });
        Ok(Before {
            master,
            workers,
            log,
        })
    }

    /// Waits until the reload sent after [`Self::before`] is confirmed or known to have failed.
    pub(crate) fn wait(&self, before: &Before) -> Result<(), NotLive> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut log_len = 0usize;
        let mut log_changed = start;
        let mut pause = Duration::from_millis(5);
        loop {
            let kids = children(before.master);
            let serving: Vec<&Child> = kids.iter().filter(|c| c.serving()).collect();
            let new_any = kids
                .iter()
                .any(|c| c.is_worker() && !before.workers.contains(&c.id));
            if !serving.is_empty() && serving.iter().all(|c| !before.workers.contains(&c.id)) {
                return Ok(());
            }
            let tail = self.log_since(before);
            if tail.len() != log_len {
                log_len = tail.len();
                log_changed = Instant::now();
            }
            let emerg = emerg_lines(&tail);
            if stat_of(before.master).is_none() {
                return Err(NotLive::MasterGone {
                    pid: before.master,
                    emerg,
                });
            }
            if let Some(e) = &emerg {
                if !new_any && log_changed.elapsed() >= LOG_QUIET {
                    return Err(NotLive::Rejected { emerg: e.clone() });
                }
            }
            if Instant::now() >= deadline {
                let detail = describe(&kids, &before.workers);
                return Err(NotLive::Timeout {
                    waited: self.timeout,
                    detail,
                    emerg,
                });
            }
            thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(25));
        }
    }

    /// The error log written since the mark (from the start of a new file after a rotation).
    fn log_since(&self, before: &Before) -> String {
        let Some(path) = self.error_log.as_deref() else {
            return String::new();
        };
        read_log_since(path, before.log).unwrap_or_default()
    }
}

fn read_log_since(path: &Path, mark: Option<LogMark>) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let meta = f.metadata()?;
    let from = match mark {
        Some(m) if m.ino == meta.ino() && m.len <= meta.len() => m.len,
        _ => 0,
    };
    f.seek(SeekFrom::Start(from))?;
    let mut raw = Vec::new();
    f.take(MAX_LOG_READ).read_to_end(&mut raw)?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// The `[emerg]` lines of a log text, verbatim, without repeats; `None` when there is none.
pub(crate) fn emerg_lines(log: &str) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for line in log.lines().filter(|l| l.contains("[emerg]")) {
        let line = line.trim_end();
        // nginx repeats a failing bind() up to five times; keep one copy of each message text.
        let message = line.split_once("[emerg]").map_or(line, |(_, m)| m);
        if !seen
            .iter()
            .any(|s| s.split_once("[emerg]").map_or(*s, |(_, m)| m) == message)
        {
            seen.push(line);
        }
    }
    (!seen.is_empty()).then(|| seen.join("\n"))
}

#[derive(Debug)]
struct Child {
    id: ProcId,
    title: String,
}

impl Child {
    fn is_worker(&self) -> bool {
        self.title.contains("worker process")
    }
    /// A worker that accepts connections: not `… is shutting down`.
    fn serving(&self) -> bool {
        self.is_worker() && !self.title.contains("shutting down")
    }
}

/// `(ppid, start time)` of a process, from `/proc/<pid>/stat`.
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ... starttime(22nd field)": comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, starttime field 22.
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

/// The children of `master` with their process titles.
fn children(master: u32) -> Vec<Child> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Some((ppid, start)) = stat_of(pid) else {
            continue;
        };
        if ppid != master {
            continue;
        }
        let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&raw)
            .replace('\0', " ")
            .trim()
            .to_string();
        out.push(Child {
            id: (pid, start),
            title,
        });
    }
    out
}

fn describe(kids: &[Child], old: &HashSet<ProcId>) -> String {
    let serving_old = kids
        .iter()
        .filter(|c| c.serving() && old.contains(&c.id))
        .count();
    let new = kids
        .iter()
        .filter(|c| c.is_worker() && !old.contains(&c.id))
        .count();
    format!("{new} new worker(s); {serving_old} worker(s) from before the signal still accepting")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emerg_lines_keep_nginx_text_once() {
        let log = "2026/12/01 07:08:11 [notice] 1#1: reconfiguring\n\
                   2026/12/01 07:08:11 [emerg] 1#1: bind() to 127.0.0.1:1 failed (98: Address already in use)\n\
                   2026/12/01 07:08:11 [notice] 1#1: try again to bind() after 500ms\n\
                   2026/12/01 07:08:12 [emerg] 1#1: bind() to 127.0.0.1:1 failed (98: Address already in use)\n\
                   2026/12/01 07:08:13 [emerg] 1#1: still could not bind()\n";
        assert_eq!(
            emerg_lines(log).unwrap(),
            "2026/12/01 07:08:11 [emerg] 1#1: bind() to 127.0.0.1:1 failed (98: Address already in use)\n\
             2026/12/01 07:08:13 [emerg] 1#1: still could not bind()"
        );
        assert_eq!(emerg_lines("[notice] fine\n"), None);
    }

    #[test]
    fn stat_parses_own_process() {
        let (ppid, start) = stat_of(std::process::id()).unwrap();
        assert_eq!(ppid, std::os::unix::process::parent_id());
        assert!(start > 0);
    }

    #[test]
    fn before_names_a_missing_pid_file() {
        let c = ReloadConfirm::new("/nonexistent/nginx.pid", None);
        let e = c.before().unwrap_err();
        assert!(
            matches!(&e, NotLive::CannotConfirm(m) if m.contains("/nonexistent/nginx.pid")),
            "{e}"
        );
        assert!(e.to_string().contains("--nginx-pid-file"), "{e}");
    }

    #[test]
    fn log_is_read_from_the_mark_or_from_the_start_after_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("error.log");
        fs::write(&p, "old [emerg] line\n").unwrap();
        let m = fs::metadata(&p).unwrap();
        let mark = Some(LogMark {
            ino: m.ino(),
            len: m.len(),
        });
        fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"new line\n"))
            .unwrap();
        assert_eq!(read_log_since(&p, mark).unwrap(), "new line\n");
        // Rotated: a new file (new inode) is read from its start.
        fs::rename(&p, dir.path().join("error.log.1")).unwrap();
        fs::write(&p, "fresh\n").unwrap();
        assert_eq!(read_log_since(&p, mark).unwrap(), "fresh\n");
    }
}
