//! Why a change is made live by a reload rather than through the module's live API: a closed set
//! of kinds ([`ReloadReason`], stored as a tag next to the outcome's `applied_reason` text, shown
//! by the API, counted by `/metrics`), and the kind with its text ([`NeedsReload`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a change took the reload path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadReason {
    /// `--apply reload`: every change reloads.
    ApplyMode,
    /// No `--live-api` configured.
    NoLiveApi,
    /// The upstream is new, or its file is not confirmed live in nginx yet.
    NewUpstream,
    /// The running file is not in the form the daemon renders (edited by hand, or a directive
    /// adds servers of its own).
    NotRendered,
    /// The binding's directives (or the upstream's name) changed.
    DirectivesChanged,
    /// The `zone` line changes (a new size: the server count crossed a power of two, or the
    /// module asked for more room).
    ZoneResized,
    /// The running upstream has no zone, so the live API cannot change it.
    NoZone,
    /// A target is a host name: live changes take addresses only.
    HostNames,
    /// The live API did not answer (unreachable, timeout, or its list could not be read).
    ApiDown,
    /// The live API does not list the upstream (no zone, a balancer that cannot change live) or
    /// its location is read-only.
    NotListed,
    /// The module refused the set for want of room in the zone (507).
    ZoneFull,
    /// The `PUT` or its read-back failed otherwise (refused, a generation race, a different set).
    LiveFailed,
}

impl ReloadReason {
    /// Every kind, in a stable order (metrics list them all, also at zero).
    pub const ALL: [ReloadReason; 12] = [
        ReloadReason::ApplyMode,
        ReloadReason::NoLiveApi,
        ReloadReason::NewUpstream,
        ReloadReason::NotRendered,
        ReloadReason::DirectivesChanged,
        ReloadReason::ZoneResized,
        ReloadReason::NoZone,
        ReloadReason::HostNames,
        ReloadReason::ApiDown,
        ReloadReason::NotListed,
        ReloadReason::ZoneFull,
        ReloadReason::LiveFailed,
    ];

    /// The tag, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadReason::ApplyMode => "apply_mode",
            ReloadReason::NoLiveApi => "no_live_api",
            ReloadReason::NewUpstream => "new_upstream",
            ReloadReason::NotRendered => "not_rendered",
            ReloadReason::DirectivesChanged => "directives_changed",
            ReloadReason::ZoneResized => "zone_resized",
            ReloadReason::NoZone => "no_zone",
            ReloadReason::HostNames => "host_names",
            ReloadReason::ApiDown => "api_down",
            ReloadReason::NotListed => "not_listed",
            ReloadReason::ZoneFull => "zone_full",
            ReloadReason::LiveFailed => "live_failed",
        }
    }

    /// The kind of a tag; `None` for an unknown one.
    pub fn parse(tag: &str) -> Option<ReloadReason> {
        ReloadReason::ALL.into_iter().find(|r| r.as_str() == tag)
    }
}

impl fmt::Display for ReloadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change that needs a reload: the kind, and the text for the person (what the outcome's
/// `applied_reason` says).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text}")]
pub struct NeedsReload {
    pub reason: ReloadReason,
    pub text: String,
}

impl NeedsReload {
    pub fn new(reason: ReloadReason, text: impl Into<String>) -> NeedsReload {
        NeedsReload {
            reason,
            text: text.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_match_serde() {
        for r in ReloadReason::ALL {
            assert_eq!(ReloadReason::parse(r.as_str()), Some(r));
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::Value::String(r.as_str().into())
            );
        }
        assert_eq!(ReloadReason::parse("reload"), None);
    }
}
