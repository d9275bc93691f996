//! Graceful removal: in live mode, a binding with `drain_secs` > 0 does not remove a
//! target that left discovery at once. The file keeps it as `    server ADDR weight=W down;` (the
//! live apply PUTs such a server with `"drain": true`: no new requests, the ones in flight
//! finish; a reload meanwhile reads nginx's own `down`, so it cannot come back into rotation), and
//! it is left out of the file — removed — once its `drain_secs` have passed or the live API shows
//! it drained with no request in flight (`active` 0), whichever comes first. A target that comes
//! back meanwhile is written as a plain server again: undrained.
//!
//! [`Draining`] is the per-binding state (in its slot), pure: it turns the file a resolution
//! rendered into the file to write. [`watch`] is the task that, while servers drain, reads their
//! `active` from the API and wakes the binding (a refresh) when one can go.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_core::{Server, Target, UpstreamFile};

use super::{lock, Inner, Slot};
use crate::live_state::UpstreamState;

/// How often the API is asked whether drained servers are idle.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// A binding's drained servers and the servers of its last applied file.
#[derive(Debug, Default)]
pub(crate) struct Draining {
    /// Servers of the last file applied, drained ones left out. `None` until the first apply (or
    /// the file on disk) says.
    applied: Option<Vec<Target>>,
    /// Drained servers: `ADDR:PORT` → (the server, removed at the latest then).
    drained: BTreeMap<String, (Target, Instant)>,
    /// Drained servers the API showed idle (drained, `active` 0): removed by the next file.
    idle: BTreeSet<String>,
    /// A [`watch`] task runs for the binding.
    pub(crate) watching: bool,
}

/// The servers of a file (none for a text not in the rendered form).
fn servers(file: &str) -> Vec<Server> {
    UpstreamFile::parse(file)
        .map(|f| f.servers)
        .unwrap_or_default()
}

impl Draining {
    /// Whether this state knows no applied file yet (then [`Self::start_from`] the file on disk).
    pub(crate) fn is_new(&self) -> bool {
        self.applied.is_none()
    }

    /// Takes the servers of the file nginx has now, when this state knows none yet (after a
    /// start): its plain servers as applied, its `down` ones as drained from `now`.
    pub(crate) fn start_from(&mut self, file: Option<&str>, drain: Duration, now: Instant) {
        if self.applied.is_some() {
            return;
        }
        let Some(file) = file else { return };
        let mut applied = Vec::new();
        for s in servers(file) {
            if s.down {
                self.drained.insert(s.host_port(), (s.target, now + drain));
            } else {
                applied.push(s.target);
            }
        }
        self.applied = Some(applied);
    }

    /// The file to write for `rendered`: servers of the last applied file missing from it are
    /// added as `down` servers after its own (drained until `now + drain`), servers back in it
    /// are no longer drained, drained servers whose time is up or that were seen idle are left
    /// out. With `drain` 0 the rendered file is the file, and nothing is kept.
    pub(crate) fn file(&mut self, rendered: &str, drain: Duration, now: Instant) -> String {
        if drain.is_zero() {
            self.drained.clear();
            self.idle.clear();
            return rendered.to_string();
        }
        let Ok(mut file) = UpstreamFile::parse(rendered) else {
            return rendered.to_string();
        };
        let in_file: BTreeSet<String> = file.servers.iter().map(Server::host_port).collect();
        // Back in discovery: undrained.
        self.drained.retain(|a, _| !in_file.contains(a));
        // Left discovery since the last applied file: drained from now.
        for t in self.applied.iter().flatten() {
            let addr = t.host_port();
            if !in_file.contains(&addr) && !self.drained.contains_key(&addr) {
                self.drained.insert(addr, (t.clone(), now + drain));
            }
        }
        // Done: time up, or drained with nothing in flight.
        let idle = std::mem::take(&mut self.idle);
        self.drained
            .retain(|a, (_, until)| *until > now && !idle.contains(a));
        if self.drained.is_empty() {
            return rendered.to_string();
        }
        file.servers
            .extend(self.drained.values().map(|(t, _)| Server {
                target: t.clone(),
                down: true,
            }));
        file.render()
    }

    /// The file `written` was applied: its plain servers are the ones a later resolution can
    /// drain.
    pub(crate) fn applied(&mut self, written: &str) {
        self.applied = Some(
            servers(written)
                .into_iter()
                .filter(|s| !s.down)
                .map(|s| s.target)
                .collect(),
        );
    }

    /// The drained servers and when each goes at the latest.
    pub(crate) fn drained(&self) -> Vec<(String, Instant)> {
        self.drained
            .iter()
            .map(|(a, (_, until))| (a.clone(), *until))
            .collect()
    }

    /// The API showed these drained servers idle.
    pub(crate) fn saw_idle(&mut self, idle: impl IntoIterator<Item = String>) {
        self.idle.extend(idle);
    }
}

/// While the binding has drained servers: every [`POLL`], reads from the live API which of them
/// are drained with no request in flight; wakes the binding's task (a refresh, which writes the
/// file without them) once one is idle or its time is up, then ends (the next apply starts
/// another when servers still drain).
pub(crate) fn watch(inner: &Inner, slot: &Arc<Slot>, name: String) {
    let Some(api) = inner.opts.live.api.clone() else {
        return;
    };
    {
        let mut st = lock(&slot.state);
        if st.draining.watching || st.draining.drained.is_empty() {
            return;
        }
        st.draining.watching = true;
    }
    let slot = slot.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            let drained = lock(&slot.state).draining.drained();
            if drained.is_empty() {
                break;
            }
            let now = Instant::now();
            let due = drained.iter().any(|(_, until)| *until <= now);
            // Drained and idle in the module: `drain` true, `active` 0 in `GET <loc>/NAME`.
            let idle: Vec<String> = match api.read_set::<UpstreamState>(&name).await {
                Ok(set) => drained
                    .iter()
                    .filter(|(a, _)| {
                        set.servers
                            .iter()
                            .any(|s| s.address == *a && s.drain == Some(true) && s.active == 0)
                    })
                    .map(|(a, _)| a.clone())
                    .collect(),
                Err(e) => {
                    tracing::debug!(binding = %name, error = %e, "drain: GET failed");
                    Vec::new()
                }
            };
            if due || !idle.is_empty() {
                tracing::info!(binding = %name, idle = ?idle, due, "drained servers can go");
                lock(&slot.state).draining.saw_idle(idle);
                break;
            }
        }
        lock(&slot.state).draining.watching = false;
        slot.wake.notify_one();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(servers: &[&str]) -> String {
        let lines: String = servers
            .iter()
            .map(|s| format!("    server {s};\n"))
            .collect();
        format!("# generated by tributary\nupstream api {{\n{lines}    keepalive 8;\n}}\n")
    }

    const D: Duration = Duration::from_secs(30);

    #[test]
    fn a_target_that_leaves_is_drained_then_removed_when_idle_or_when_time_is_up() {
        let t0 = Instant::now();
        let mut d = Draining::default();
        let both = file(&["10.0.0.1:80 weight=1", "10.0.0.2:80 weight=3"]);
        assert_eq!(d.file(&both, D, t0), both);
        d.applied(&both);
        let one = file(&["10.0.0.1:80 weight=1"]);
        let drained = d.file(&one, D, t0);
        assert_eq!(
            drained,
            file(&["10.0.0.1:80 weight=1", "10.0.0.2:80 weight=3 down"])
        );
        d.applied(&drained);
        // Another resolution while it drains: still drained, same deadline.
        assert_eq!(d.file(&one, D, t0 + Duration::from_secs(10)), drained);
        assert_eq!(d.drained(), [("10.0.0.2:80".to_string(), t0 + D)]);
        // Time up: removed.
        assert_eq!(d.file(&one, D, t0 + D), one);
        assert!(d.drained().is_empty());

        // Idle before the time: removed at once.
        let mut d = Draining::default();
        d.applied(&both);
        let f = d.file(&one, D, t0);
        d.applied(&f);
        d.saw_idle(["10.0.0.2:80".to_string()]);
        assert_eq!(d.file(&one, D, t0 + Duration::from_secs(1)), one);
    }

    #[test]
    fn a_target_that_comes_back_is_undrained() {
        let t0 = Instant::now();
        let mut d = Draining::default();
        let both = file(&["10.0.0.1:80 weight=1", "10.0.0.2:80 weight=1"]);
        d.applied(&both);
        let drained = d.file(&file(&["10.0.0.1:80 weight=1"]), D, t0);
        assert!(drained.contains("10.0.0.2:80 weight=1 down;"));
        d.applied(&drained);
        assert_eq!(d.file(&both, D, t0 + Duration::from_secs(1)), both);
        assert!(d.drained().is_empty());
    }

    #[test]
    fn no_drain_time_removes_at_once_and_a_restart_takes_the_file_on_disk() {
        let t0 = Instant::now();
        let mut d = Draining::default();
        let both = file(&["10.0.0.1:80 weight=1", "10.0.0.2:80 weight=1"]);
        d.applied(&both);
        let one = file(&["10.0.0.1:80 weight=1"]);
        assert_eq!(d.file(&one, Duration::ZERO, t0), one);

        let on_disk = file(&["10.0.0.1:80 weight=1", "10.0.0.3:80 weight=2 down"]);
        let mut d = Draining::default();
        d.start_from(Some(&on_disk), D, t0);
        assert_eq!(d.file(&one, D, t0), on_disk);
        assert_eq!(d.file(&one, D, t0 + D), one);
    }
}
