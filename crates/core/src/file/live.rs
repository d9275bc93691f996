//! The live decision: from the file nginx runs and the file wanted, the set to `PUT` through the
//! module's live API, or why the change needs a reload.

use super::{NeedsReload, ReloadReason, Server, UpstreamFile};

/// What [`live_plan`] found: the servers to `PUT` and the ones they replace (put back if the
/// change is undone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePlan {
    pub set: Vec<Server>,
    pub before: Vec<Server>,
}

/// The change from `live` (the file nginx runs; `None` for a new upstream, or one whose file is
/// not confirmed live) to `wanted` goes live when only its servers differ, the upstream has a
/// zone, and every server is an address. Otherwise the reason, in this order: a new upstream; a
/// changed zone; other changed directives (or name); no zone; host names.
pub fn live_plan(
    live: Option<&UpstreamFile>,
    wanted: &UpstreamFile,
) -> Result<LivePlan, NeedsReload> {
    let Some(live) = live else {
        return Err(NeedsReload::new(
            ReloadReason::NewUpstream,
            "new upstream (or its file is not confirmed live yet): needs a reload",
        ));
    };
    if live.zone_text() != wanted.zone_text() {
        return Err(NeedsReload::new(
            ReloadReason::ZoneResized,
            format!(
                "the zone line changes ({} servers): needs a reload",
                wanted.servers.len()
            ),
        ));
    }
    if live.name != wanted.name || live.directives != wanted.directives {
        return Err(NeedsReload::new(
            ReloadReason::DirectivesChanged,
            "the upstream's directives changed: needs a reload",
        ));
    }
    if !live.has_zone() {
        return Err(NeedsReload::new(
            ReloadReason::NoZone,
            "the running upstream has no zone: needs a reload",
        ));
    }
    if let Some(s) = wanted.servers.iter().find(|s| s.is_host_name()) {
        return Err(NeedsReload::new(
            ReloadReason::HostNames,
            format!(
                "host-name target {}: live changes take addresses only, needs a reload",
                s.host_port()
            ),
        ));
    }
    Ok(LivePlan {
        set: wanted.servers.clone(),
        before: live.servers.clone(),
    })
}
