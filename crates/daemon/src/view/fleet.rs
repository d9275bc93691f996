//! The fleet as a whole (`GET /api/v1/fleet/hosts`, `tributary fleet hosts`, the metrics and the
//! UI's fleet card read the same numbers): per binding, the age of its published set and who
//! resolves it; per host, how many bindings it is behind. And the answer of
//! `DELETE /api/v1/fleet/hosts/{host}` (`tributary fleet forget-host`).

use serde::{Deserialize, Serialize};
use tributary_store::{FleetMember, HostState};

use super::{BindingFleet, BindingView};

/// `GET /api/v1/fleet/hosts`: every host this one knows of and every binding's fleet numbers,
/// as this host's copy of the store shows them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetHosts {
    /// This host's id.
    pub host_id: String,
    /// `sqlite` (one host, no fleet) or `etcd`.
    pub store: String,
    /// By host id.
    pub hosts: Vec<FleetHostSummary>,
    /// By binding name.
    pub bindings: Vec<FleetBindingSummary>,
}

/// One host of [`FleetHosts`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetHostSummary {
    pub host: String,
    /// Its heartbeat is live. A host that is not keeps its last outcomes until it is forgotten.
    pub alive: bool,
    /// Bindings with a published target set that this host does not serve: its state of the
    /// binding is not `applied` at the newest set's generation (it applied an older set, nginx
    /// refused the newest, it could not reach the store, or it has no state of the binding).
    pub behind_bindings: usize,
    /// The first of those bindings (at most [`BEHIND_LISTED`]), by name.
    pub behind: Vec<String>,
    /// Bindings whose resolver claim this host holds.
    pub resolves: usize,
}

/// One binding of [`FleetHosts`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetBindingSummary {
    pub name: String,
    /// The host holding the resolver claim (`null`: none now).
    pub resolver: Option<String>,
    /// The newest published set's generation (0: none).
    pub generation: i64,
    /// Seconds since the binding was last resolved for the fleet, as far as this host knows
    /// ([`BindingFleet::set_age_ms`]); `null`: never.
    pub set_age_seconds: Option<f64>,
    pub interval_secs: u64,
}

/// `DELETE /api/v1/fleet/hosts/{host}` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForgetHostResponse {
    pub host: String,
    /// Outcome keys and `unable` markers deleted.
    pub keys_deleted: usize,
    /// `force` ended the host's live session (its heartbeat and resolver claims are gone).
    pub session_ended: bool,
}

/// At most this many names in [`FleetHostSummary::behind`].
pub const BEHIND_LISTED: usize = 20;

impl BindingFleet {
    /// The newer of the published set's resolution time and this host's own last successful
    /// resolution (`None`: neither). A set equal to the published one is not published again
    /// (no write, no watch event), so only the host that resolves the binding knows it was
    /// resolved since: on that host this is the time since the fleet last resolved the binding;
    /// on the others, since the servers last changed. The fleet's answer is the **minimum over
    /// the hosts** (`docs/fleet.md`, "What to watch").
    pub fn last_resolved_ms(&self) -> Option<i64> {
        match (self.set_at_ms, self.resolved_here_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Milliseconds since [`BindingFleet::last_resolved_ms`] at `now`.
    pub fn set_age_ms(&self, now: i64) -> Option<i64> {
        self.last_resolved_ms().map(|t| (now - t).max(0))
    }

    /// Whether `host` does not serve the newest published set (see
    /// [`FleetHostSummary::behind_bindings`]); `false` when no set was published.
    pub fn is_behind(&self, host: &str) -> bool {
        if self.generation <= 0 {
            return false;
        }
        !self.hosts.iter().any(|h| {
            h.host == host && h.state == HostState::Applied && h.generation >= self.generation
        })
    }
}

/// The fleet numbers of `bindings` for the hosts of `members` (and any host with an outcome) at
/// `now`.
pub fn summarize(
    host_id: &str,
    store: &str,
    members: &[FleetMember],
    bindings: &[BindingView],
    now: i64,
) -> FleetHosts {
    let mut hosts: std::collections::BTreeMap<String, FleetHostSummary> = members
        .iter()
        .map(|m| {
            (
                m.host.clone(),
                FleetHostSummary {
                    host: m.host.clone(),
                    alive: m.alive,
                    behind_bindings: 0,
                    behind: Vec::new(),
                    resolves: 0,
                },
            )
        })
        .collect();
    for b in bindings {
        for h in &b.fleet.hosts {
            hosts
                .entry(h.host.clone())
                .or_insert_with(|| FleetHostSummary {
                    host: h.host.clone(),
                    alive: h.alive,
                    behind_bindings: 0,
                    behind: Vec::new(),
                    resolves: 0,
                });
        }
    }
    for b in bindings {
        for (id, h) in hosts.iter_mut() {
            if b.fleet.is_behind(id) {
                h.behind_bindings += 1;
                if h.behind.len() < BEHIND_LISTED {
                    h.behind.push(b.name.clone());
                }
            }
            if b.fleet.resolver.as_deref() == Some(id.as_str()) {
                h.resolves += 1;
            }
        }
    }
    FleetHosts {
        host_id: host_id.to_string(),
        store: store.to_string(),
        hosts: hosts.into_values().collect(),
        bindings: bindings
            .iter()
            .map(|b| FleetBindingSummary {
                name: b.name.clone(),
                resolver: b.fleet.resolver.clone(),
                generation: b.fleet.generation,
                set_age_seconds: b.fleet.set_age_ms(now).map(|ms| ms as f64 / 1000.0),
                interval_secs: b.interval_secs,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::FleetHostView;

    fn fleet(generation: i64, hosts: &[(&str, HostState, i64)]) -> BindingFleet {
        BindingFleet {
            resolver: Some("a".into()),
            generation,
            hosts: hosts
                .iter()
                .map(|(h, state, g)| FleetHostView {
                    host: h.to_string(),
                    state: *state,
                    alive: true,
                    at_ms: 0,
                    generation: *g,
                    servers: 1,
                    message: None,
                })
                .collect(),
            set_at_ms: Some(1_000),
            set_resolved_by: Some("a".into()),
            resolved_here_ms: None,
        }
    }

    #[test]
    fn a_host_is_behind_unless_it_applied_the_newest_set() {
        let f = fleet(
            5,
            &[
                ("a", HostState::Applied, 5),
                ("b", HostState::Applied, 4),
                ("c", HostState::Failed, 5),
                ("d", HostState::Stale, 5),
            ],
        );
        assert!(!f.is_behind("a"));
        assert!(f.is_behind("b"), "an older set");
        assert!(f.is_behind("c"), "nginx refused the newest");
        assert!(f.is_behind("d"), "store unreachable");
        assert!(f.is_behind("e"), "no state at all");
        assert!(!fleet(0, &[]).is_behind("e"), "nothing published");
    }

    #[test]
    fn the_set_age_counts_from_the_newer_of_the_set_and_this_hosts_own_resolution() {
        let mut f = fleet(1, &[]);
        assert_eq!(f.set_age_ms(4_000), Some(3_000));
        f.resolved_here_ms = Some(3_500);
        assert_eq!(f.set_age_ms(4_000), Some(500));
        f.set_at_ms = None;
        f.resolved_here_ms = None;
        assert_eq!(f.set_age_ms(4_000), None);
    }
}
