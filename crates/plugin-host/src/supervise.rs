//! Process supervision: each plugin's slot (its process once started, crash and timeout counts,
//! stderr log, secrets), the start after the restart back-off, the kill after too many calls in a
//! row without an answer, and the shutdown. The process itself is `conn`.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tributary_base::lock;

use crate::conn::Conn;
use crate::error::fmt_duration;
use crate::{HostOptions, PluginHost, PluginInfo, Redactor, ResolveError};

/// Bounded, redacted stderr of one plugin (kept across restarts).
#[derive(Debug)]
pub(crate) struct StderrLog {
    pub(crate) lines: std::collections::VecDeque<String>,
    pub(crate) cap: usize,
}

impl StderrLog {
    pub(crate) fn push(&mut self, line: String) {
        if self.cap == 0 {
            return;
        }
        while self.lines.len() >= self.cap {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// Restart bookkeeping of one plugin.
#[derive(Default)]
pub(crate) struct SlotState {
    pub(crate) conn: Option<Arc<Conn>>,
    pub(crate) consecutive_crashes: u32,
    /// Calls in a row that got no answer in time from the current process.
    pub(crate) consecutive_timeouts: u32,
    pub(crate) not_before: Option<Instant>,
}

/// One plugin: its manifest and, once started, its process.
pub(crate) struct Slot {
    pub(crate) info: PluginInfo,
    pub(crate) exe: PathBuf,
    /// The whole environment of the process: the clean base and the manifest's variables.
    pub(crate) env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The private `HOME` (created at each start when missing).
    pub(crate) home: PathBuf,
    /// Places for calls in flight ([`HostOptions::max_concurrent`]).
    pub(crate) calls: tokio::sync::Semaphore,
    pub(crate) state: Mutex<SlotState>,
    /// Every config value ever sent to this plugin: redacted from its stderr.
    pub(crate) secrets: Mutex<Redactor>,
    pub(crate) stderr: Mutex<StderrLog>,
}

impl Slot {
    pub(crate) fn note(&self, text: String) {
        let text = lock(&self.secrets).redact(&text);
        tracing::debug!(plugin = %self.info.name, "{text}");
        lock(&self.stderr).push(format!("[tributary] {text}"));
    }
}

impl PluginHost {
    /// A valid answer: the plugin works, so the next crash starts the back-off afresh.
    pub(crate) fn answered(&self, slot: &Slot) {
        let mut st = lock(&slot.state);
        st.consecutive_crashes = 0;
        st.consecutive_timeouts = 0;
    }

    /// A call to `conn` got no answer in time: after [`HostOptions::max_timeouts`] in a row the
    /// process is killed (and restarted after the back-off by a later call).
    pub(crate) fn timed_out(&self, slot: &Arc<Slot>, conn: &Arc<Conn>) {
        let kill = {
            let mut st = lock(&slot.state);
            let current = st.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn));
            if !current {
                return;
            }
            st.consecutive_timeouts = st.consecutive_timeouts.saturating_add(1);
            st.consecutive_timeouts >= self.opts.max_timeouts.max(1)
        };
        if kill {
            conn.kill(
                slot,
                &self.opts,
                &format!(
                    "{} calls in a row got no answer within {}",
                    self.opts.max_timeouts.max(1),
                    fmt_duration(self.opts.timeout)
                ),
            );
        }
    }

    /// The running connection of `slot`, starting the process when there is none (after the
    /// restart back-off, if that ends before `deadline`).
    pub(crate) async fn connection(
        &self,
        slot: &Arc<Slot>,
        deadline: Instant,
    ) -> Result<Arc<Conn>, ResolveError> {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(ResolveError::Spawn("the plugin host is shut down".into()));
            }
            let wait_until = {
                let mut st = lock(&slot.state);
                if let Some(c) = &st.conn {
                    if c.alive() {
                        return Ok(c.clone());
                    }
                    st.conn = None;
                }
                match st.not_before {
                    Some(t) if t > Instant::now() => t,
                    _ => {
                        let conn = Conn::spawn(slot, &self.opts)?;
                        st.conn = Some(conn.clone());
                        return Ok(conn);
                    }
                }
            };
            if wait_until > deadline {
                let left = wait_until.saturating_duration_since(Instant::now());
                return Err(ResolveError::Crashed(format!(
                    "the plugin exited and is restarted in {}",
                    fmt_duration(Duration::from_millis(left.as_millis() as u64))
                )));
            }
            tokio::time::sleep_until(wait_until).await;
        }
    }

    /// Stops every plugin: closes its stdin, waits up to [`HostOptions::shutdown_grace`], then kills
    /// it. Later calls fail with [`ResolveError::Spawn`].
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for s in self.slots.values() {
            s.calls.close();
        }
        let conns: Vec<Arc<Conn>> = self
            .slots
            .values()
            .filter_map(|s| lock(&s.state).conn.take())
            .collect();
        let grace = self.opts.shutdown_grace;
        let mut stops = tokio::task::JoinSet::new();
        for c in conns {
            stops.spawn(async move { c.stop(grace).await });
        }
        while stops.join_next().await.is_some() {}
    }
}

/// Creates `home` (and the folders above it) with mode 0700, and forces `home` and its parent
/// (the home root) back to 0700.
pub(crate) fn private_home(home: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    for dir in [home.parent(), Some(home)].into_iter().flatten() {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Back-off before start number `crashes + 1`.
pub(crate) fn backoff(opts: &HostOptions, crashes: u32) -> Duration {
    let factor = 2u32.saturating_pow(crashes.saturating_sub(1).min(20));
    opts.restart_backoff
        .saturating_mul(factor)
        .min(opts.restart_backoff_max)
}

/// Keeps the names used in the stderr notes short and stable.
pub(crate) fn describe_exit(status: Option<std::process::ExitStatus>) -> String {
    match status {
        Some(s) => format!("the plugin exited ({s})"),
        None => "the plugin closed its stdout and was killed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let o = HostOptions {
            restart_backoff: Duration::from_millis(100),
            restart_backoff_max: Duration::from_millis(500),
            ..HostOptions::default()
        };
        let got: Vec<u128> = (1..=5).map(|n| backoff(&o, n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }
}
