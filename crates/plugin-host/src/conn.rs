//! One running plugin process: request registry, stdout reader, stderr capture.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tributary_protocol::{Id, Response};

use crate::error::fmt_duration;
use crate::lines::{read_line, scan_id, Line};
use tributary_base::lock;

use crate::supervise::{backoff, describe_exit, private_home, Slot};
use crate::{HostOptions, ResolveError};

/// Longest stderr line kept (bytes); longer ones are cut.
const STDERR_LINE_KEEP: usize = 4096;
/// Longest stderr line read whole before redaction.
const STDERR_LINE_READ: usize = 64 * 1024;

/// What the reader hands to a waiting request.
#[derive(Debug)]
pub(crate) enum Reply {
    Response(Response),
    Malformed(String),
    Exited(String),
}

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
    dead: bool,
}

pub(crate) struct Conn {
    child: Mutex<Child>,
    pid: Option<u32>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pending: Arc<Mutex<Pending>>,
    stopping: AtomicBool,
    /// Killed by the host ([`Conn::kill`]); the restart back-off is already in force.
    killed: AtomicBool,
    slot: Weak<Slot>,
    opts: HostOptions,
}

impl Conn {
    pub(crate) fn spawn(slot: &Arc<Slot>, opts: &HostOptions) -> Result<Arc<Conn>, ResolveError> {
        private_home(&slot.home).map_err(|e| {
            ResolveError::Spawn(format!(
                "cannot prepare the plugin's home folder {}: {e}",
                slot.home.display()
            ))
        })?;
        let mut child = Command::new(&slot.exe)
            .current_dir(&slot.info.dir)
            .env_clear()
            .envs(slot.env.iter().map(|(k, v)| (k, v)))
            .env("HOME", &slot.home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ResolveError::Spawn(format!("{}: {e}", slot.exe.display())))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return Err(ResolveError::Spawn("no stdio pipes".into()));
        };
        let pid = child.id();
        let conn = Arc::new(Conn {
            child: Mutex::new(child),
            pid,
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            pending: Arc::new(Mutex::new(Pending::default())),
            stopping: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            slot: Arc::downgrade(slot),
            opts: opts.clone(),
        });
        slot.note(format!(
            "started {} (pid {})",
            slot.exe.display(),
            pid.unwrap_or(0)
        ));
        tokio::spawn(read_stdout(
            stdout,
            Arc::downgrade(&conn),
            conn.pending.clone(),
            Arc::downgrade(slot),
            opts.clone(),
        ));
        tokio::spawn(read_stderr(stderr, Arc::downgrade(slot)));
        Ok(conn)
    }

    pub(crate) fn alive(&self) -> bool {
        !lock(&self.pending).dead
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub(crate) fn register(&self, id: u64) -> Result<oneshot::Receiver<Reply>, ResolveError> {
        let mut p = lock(&self.pending);
        if p.dead {
            return Err(ResolveError::Crashed(
                "the plugin exited before the request was sent".into(),
            ));
        }
        let (tx, rx) = oneshot::channel();
        p.waiting.insert(id, tx);
        Ok(rx)
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.pending).waiting.remove(&id);
    }

    /// Writes one whole request line. A line is never left half-written for the plugin to read
    /// on: when the write fails or the future is dropped (a timeout, a cancelled call) after part
    /// of the line went out, stdin is closed and the process killed ([`Conn::kill`]).
    pub(crate) async fn send(&self, line: &[u8]) -> Result<(), ResolveError> {
        let guard = self.stdin.lock().await;
        if guard.is_none() {
            return Err(ResolveError::Crashed("the plugin is being stopped".into()));
        }
        let mut sending = Sending {
            conn: self,
            stdin: guard,
            written: 0,
            done: false,
        };
        let res = sending.write(line).await;
        sending.done = res.is_ok() || sending.written == 0;
        drop(sending);
        res.map_err(|e| ResolveError::Crashed(format!("cannot write to the plugin: {e}")))
    }

    /// Kills the process now (it stopped answering, or a request line was cut): no request is
    /// sent to it any more, the requests in flight fail when its stdout closes, and the restart
    /// back-off counts it as a crash.
    pub(crate) fn kill(&self, slot: &Slot, opts: &HostOptions, why: &str) {
        if self.killed.swap(true, Ordering::SeqCst) {
            return;
        }
        lock(&self.pending).dead = true;
        let delay = {
            let mut st = lock(&slot.state);
            st.consecutive_crashes = st.consecutive_crashes.saturating_add(1);
            st.consecutive_timeouts = 0;
            let delay = backoff(opts, st.consecutive_crashes);
            st.not_before = Some(Instant::now() + delay);
            delay
        };
        let _ = lock(&self.child).start_kill();
        slot.note(format!(
            "killed the plugin (pid {}): {why}; next start not before {}",
            self.pid.unwrap_or(0),
            fmt_duration(delay)
        ));
    }

    /// Closes stdin, waits up to `grace` for the exit, then kills.
    pub(crate) async fn stop(&self, grace: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        drop(self.stdin.lock().await.take());
        self.wait_exit(grace).await;
    }

    /// Waits up to `grace` for the process to exit, then kills it and reaps it.
    async fn wait_exit(&self, grace: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + grace;
        let mut killed = false;
        loop {
            {
                let mut child = lock(&self.child);
                match child.try_wait() {
                    Ok(Some(status)) => return (!killed).then_some(status),
                    Ok(None) => {}
                    Err(_) => return None,
                }
                if !killed && Instant::now() >= until {
                    let _ = child.start_kill();
                    killed = true;
                }
            }
            if killed && Instant::now() >= until + Duration::from_secs(5) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// One request line being written, holding stdin. Dropped before the whole line went out (a
/// write error after some bytes, or the caller's future dropped), it closes stdin and kills the
/// process, so the rest of the line can never be glued to the next request.
struct Sending<'a> {
    conn: &'a Conn,
    stdin: tokio::sync::MutexGuard<'a, Option<ChildStdin>>,
    written: usize,
    done: bool,
}

impl Sending<'_> {
    async fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        while self.written < line.len() {
            let Some(stdin) = self.stdin.as_mut() else {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            };
            match stdin.write(&line[self.written..]).await? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                n => self.written += n,
            }
        }
        if let Some(stdin) = self.stdin.as_mut() {
            stdin.flush().await?;
        }
        Ok(())
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if self.done || self.written == 0 {
            return;
        }
        self.stdin.take();
        if let Some(slot) = self.conn.slot.upgrade() {
            let why = format!(
                "a request line was cut after {} bytes (the write timed out or was cancelled)",
                self.written
            );
            self.conn.kill(&slot, &self.conn.opts, &why);
        }
    }
}

async fn read_stdout(
    stdout: ChildStdout,
    conn: Weak<Conn>,
    pending: Arc<Mutex<Pending>>,
    slot: Weak<Slot>,
    opts: HostOptions,
) {
    let mut r = BufReader::with_capacity(64 * 1024, stdout);
    loop {
        let line = match read_line(&mut r, opts.max_line).await {
            Ok(Line::Complete(l)) => l,
            Ok(Line::TooLong { prefix, len }) => {
                let why = format!(
                    "the answer line is {len} bytes, over the limit of {} bytes",
                    opts.max_line
                );
                attribute(&pending, &slot, scan_id(&prefix), why);
                continue;
            }
            Ok(Line::Eof) | Err(_) => break,
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Response>(&line) {
            Ok(resp) => {
                let id = match &resp.id {
                    Some(Id::Num(n)) => *n,
                    _ => {
                        note(&slot, "ignored a response without a numeric id".into());
                        continue;
                    }
                };
                let tx = lock(&pending).waiting.remove(&id);
                match tx {
                    Some(tx) => {
                        let _ = tx.send(Reply::Response(resp));
                    }
                    None => note(
                        &slot,
                        format!(
                            "ignored a response for id {id}, which is not in flight (timed out?)"
                        ),
                    ),
                }
            }
            Err(e) => match serde_json::from_slice::<Value>(&line) {
                Ok(v) => {
                    let why = format!("the answer is not a JSON-RPC 2.0 response: {e}");
                    attribute(&pending, &slot, v.get("id").and_then(Value::as_u64), why);
                }
                Err(_) => {
                    let why = "the answer line is not valid JSON".to_string();
                    attribute(&pending, &slot, scan_id(&line), why);
                }
            },
        }
    }
    // The plugin closed stdout: it exited (or will be killed). Record the crash (and its back-off)
    // before anything else, so no call starts a new process before the back-off is in force.
    let drained: Vec<oneshot::Sender<Reply>> = {
        let mut p = lock(&pending);
        p.dead = true;
        p.waiting.drain().map(|(_, tx)| tx).collect()
    };
    let conn = conn.upgrade();
    // Stopped or killed by the host: no crash to count (a kill counted its own).
    let killed = conn
        .as_ref()
        .is_some_and(|c| c.killed.load(Ordering::SeqCst));
    let stopping = conn
        .as_ref()
        .is_none_or(|c| c.stopping.load(Ordering::SeqCst) || c.killed.load(Ordering::SeqCst));
    let slot = slot.upgrade();
    let delay = match (&slot, stopping) {
        (Some(slot), false) => {
            let mut st = lock(&slot.state);
            st.consecutive_crashes = st.consecutive_crashes.saturating_add(1);
            let delay = backoff(&opts, st.consecutive_crashes);
            st.not_before = Some(Instant::now() + delay);
            Some(delay)
        }
        _ => None,
    };
    let status = match &conn {
        Some(c) => c.wait_exit(Duration::from_millis(500)).await,
        None => None,
    };
    drop(conn);
    let what = if killed {
        "the plugin was killed by the host".to_string()
    } else {
        describe_exit(status)
    };
    if let Some(slot) = slot {
        match (delay, killed) {
            (Some(d), _) => slot.note(format!("{what}; next start not before {}", fmt_duration(d))),
            (None, true) => slot.note(format!("{what}: it exited")),
            (None, false) => slot.note(format!("{what} (stopped by the host)")),
        }
    }
    let msg = format!("{what} while the request was in flight");
    for tx in drained {
        let _ = tx.send(Reply::Exited(msg.clone()));
    }
}

/// Fails the request a broken line answers: the one named by its id; when no id can be read, the
/// only request in flight (with several in flight, the line is ignored and noted).
fn attribute(pending: &Mutex<Pending>, slot: &Weak<Slot>, id: Option<u64>, why: String) {
    let tx = {
        let mut p = lock(pending);
        match id {
            // An id that is not in flight (timed out) must not fail another request.
            Some(id) => p.waiting.remove(&id),
            None if p.waiting.len() == 1 => {
                let only = *p.waiting.keys().next().unwrap_or(&0);
                p.waiting.remove(&only)
            }
            _ => None,
        }
    };
    match tx {
        Some(tx) => {
            let _ = tx.send(Reply::Malformed(why));
        }
        None => note(
            slot,
            format!("ignored a stdout line that answers no request: {why}"),
        ),
    }
}

fn note(slot: &Weak<Slot>, text: String) {
    if let Some(s) = slot.upgrade() {
        s.note(text);
    }
}

async fn read_stderr(stderr: ChildStderr, slot: Weak<Slot>) {
    let mut r = BufReader::new(stderr);
    loop {
        let raw = match read_line(&mut r, STDERR_LINE_READ).await {
            Ok(Line::Complete(l)) => l,
            Ok(Line::TooLong { prefix, .. }) => prefix,
            Ok(Line::Eof) | Err(_) => return,
        };
        let Some(slot) = slot.upgrade() else { return };
        let text = String::from_utf8_lossy(&raw);
        let mut line = lock(&slot.secrets).redact(text.trim_end_matches('\r'));
        if line.len() > STDERR_LINE_KEEP {
            let mut cut = STDERR_LINE_KEEP;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str(" [cut]");
        }
        tracing::debug!(plugin = %slot.info.name, "stderr: {line}");
        lock(&slot.stderr).push(line);
    }
}
