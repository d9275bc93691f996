//! The JSON of the Plus API's answers, from the live state the native API reads
//! ([`UpstreamView`]) and from nginx's own counters. Field names and types are Plus's
//! (`docs/plus-api.md` says field by field what is real and what is left out, and why): a value
//! this module does not know is left out, never written as a made-up number.

use std::collections::BTreeMap;

use serde::Serialize;

use super::time::{iso8601_ms, seconds_text};
use crate::live::probe::Health;
use crate::live::render::{ServerView, UpstreamView};
use crate::live::stats::{HealthChecks, Responses};

/// Plus's peer `state` of a server: `down` (its configured `down`), `draining` (`drain`),
/// `checking` (not yet passed its first probe under `probe ... mandatory`), `unhealthy` (failed
/// its probes), `unavail` (passive failures reached `max_fails` within `fail_timeout`), else
/// `up`. The first that holds wins.
pub fn peer_state(s: &ServerView) -> &'static str {
    let health = s.health.as_ref().map(|h| h.health);
    if s.down {
        "down"
    } else if s.drain {
        "draining"
    } else if health == Some(Health::Checking) {
        "checking"
    } else if health == Some(Health::Unhealthy) {
        "unhealthy"
    } else if s.max_fails > 0 && s.fails >= s.max_fails {
        "unavail"
    } else {
        "up"
    }
}

/// One peer of `GET .../http/upstreams[/NAME]`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PeerView {
    pub id: u64,
    pub server: String,
    pub name: String,
    pub backup: bool,
    pub weight: u64,
    pub state: &'static str,
    pub active: u64,
    pub max_conns: u64,
    pub requests: u64,
    pub responses: Responses,
    pub sent: u64,
    pub received: u64,
    pub fails: u64,
    pub unavail: u64,
    pub health_checks: HealthChecks,
    pub downtime: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downstart: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_time: Option<u64>,
}

impl PeerView {
    /// The peer of `s`.
    pub fn of(s: &ServerView) -> PeerView {
        // This module always writes `id` and `stats` (`None` only in an older module's answer).
        let st = s.stats.unwrap_or_default();
        let answered = st.responses.total > 0;
        PeerView {
            id: s.id.unwrap_or(0),
            server: s.address.clone(),
            name: s.address.clone(),
            backup: s.backup,
            weight: s.weight,
            state: peer_state(s),
            active: s.active,
            max_conns: s.max_conns,
            requests: st.requests,
            responses: st.responses,
            sent: st.sent,
            received: st.received,
            fails: st.fails,
            unavail: st.unavail,
            // Without a probe no check was made: the zeros are true.
            health_checks: st.health_checks.unwrap_or_default(),
            downtime: st.downtime,
            downstart: (st.downstart_ms != 0).then(|| iso8601_ms(st.downstart_ms)),
            selected: (st.selected_ms != 0).then(|| iso8601_ms(st.selected_ms)),
            header_time: answered.then_some(st.header_time),
            response_time: answered.then_some(st.response_time),
        }
    }
}

/// `GET .../http/upstreams/NAME` (and each entry of `GET .../http/upstreams`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UpstreamPlus {
    /// The servers, primary first, then backup.
    pub peers: Vec<PeerView>,
    /// Removed servers still processing requests (the native API's `retiring`).
    pub zombies: u64,
    /// The upstream's zone.
    pub zone: String,
}

impl UpstreamPlus {
    /// The Plus view of a live upstream's view.
    pub fn of(v: &UpstreamView, zone: &str) -> UpstreamPlus {
        UpstreamPlus {
            peers: v.servers.iter().map(PeerView::of).collect(),
            zombies: v.retiring,
            zone: zone.to_string(),
        }
    }
}

/// One server of `GET .../servers` (Plus's configuration view of a server).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ConfServer {
    pub id: u64,
    pub server: String,
    pub weight: u64,
    pub max_conns: u64,
    pub max_fails: u64,
    pub fail_timeout: String,
    /// Always `0s`: there is no per-server slow start here.
    pub slow_start: String,
    /// Always empty: there are no sticky routes here.
    pub route: String,
    pub backup: bool,
    pub down: bool,
    pub drain: bool,
}

impl ConfServer {
    /// The configuration view of `s`.
    pub fn of(s: &ServerView) -> ConfServer {
        ConfServer {
            id: s.id.unwrap_or(0),
            server: s.address.clone(),
            weight: s.weight,
            max_conns: s.max_conns,
            max_fails: s.max_fails,
            fail_timeout: seconds_text(s.fail_timeout_ms / 1000),
            slow_start: seconds_text(0),
            route: String::new(),
            backup: s.backup,
            down: s.down,
            drain: s.drain,
        }
    }

    /// The servers of `v`.
    pub fn all(v: &UpstreamView) -> Vec<ConfServer> {
        v.servers.iter().map(ConfServer::of).collect()
    }
}

/// `GET .../nginx`. `build`, `generation` and `load_timestamp` are left out when unknown.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NginxInfo {
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_timestamp: Option<String>,
    pub timestamp: String,
    pub pid: u64,
    pub ppid: u64,
}

/// nginx's connection and request counters (the stub status module's `ngx_stat_*`), read at
/// once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StubCounters {
    pub accepted: u64,
    pub handled: u64,
    pub active: u64,
    pub reading: u64,
    pub writing: u64,
    pub waiting: u64,
    pub requests: u64,
}

/// `GET .../connections`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Connections {
    /// Accepted client connections.
    pub accepted: u64,
    /// Accepted but not handled (nginx's `accepts - handled`: the connection limit was hit).
    pub dropped: u64,
    /// Connections reading a request or writing a response (Plus counts idle ones apart).
    pub active: u64,
    /// Idle keep-alive connections (stub status's `Waiting`).
    pub idle: u64,
}

/// `GET .../http/requests`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct HttpRequests {
    /// Client requests so far.
    pub total: u64,
    /// Requests being read or processed now.
    pub current: u64,
}

impl StubCounters {
    /// The `connections` answer.
    pub fn connections(&self) -> Connections {
        Connections {
            accepted: self.accepted,
            dropped: self.accepted.saturating_sub(self.handled),
            active: self.reading + self.writing,
            idle: self.waiting,
        }
    }

    /// The `http/requests` answer.
    pub fn requests(&self) -> HttpRequests {
        HttpRequests {
            total: self.requests,
            current: self.reading + self.writing,
        }
    }
}

/// One size class of a zone's slab allocator (`ngx_slab_stat_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotFigures {
    /// Chunk size in bytes.
    pub size: u64,
    /// Chunks in pages handed to the class.
    pub total: u64,
    /// Chunks in use.
    pub used: u64,
    /// Allocations asked.
    pub reqs: u64,
    /// Allocations that failed.
    pub fails: u64,
}

/// A zone's slab allocator, read under its mutex.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlabFigures {
    /// Pages the allocator manages.
    pub pages_total: u64,
    /// Pages not handed out.
    pub pages_free: u64,
    /// The size classes, smallest first.
    pub slots: Vec<SlotFigures>,
}

/// `{"used": N, "free": N}` of pages.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Pages {
    pub used: u64,
    pub free: u64,
}

/// One slot of `GET .../slabs/ZONE`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Slot {
    pub used: u64,
    pub free: u64,
    pub reqs: u64,
    pub fails: u64,
}

/// `GET .../slabs/ZONE`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SlabZone {
    pub pages: Pages,
    /// By chunk size (JSON keys `"8"`, `"16"`, ...).
    pub slots: BTreeMap<u64, Slot>,
}

impl SlabZone {
    /// The Plus view of a zone's figures.
    pub fn of(f: &SlabFigures) -> SlabZone {
        SlabZone {
            pages: Pages {
                used: f.pages_total.saturating_sub(f.pages_free),
                free: f.pages_free,
            },
            slots: f
                .slots
                .iter()
                .map(|s| {
                    (
                        s.size,
                        Slot {
                            used: s.used,
                            free: s.total.saturating_sub(s.used),
                            reqs: s.reqs,
                            fails: s.fails,
                        },
                    )
                })
                .collect(),
        }
    }
}

/// Any answer as JSON.
pub fn to_json<T: Serialize + ?Sized>(v: &T) -> String {
    // These plain structs and maps with string or integer keys always serialize.
    serde_json::to_string(v).unwrap_or_else(|_| "{}".to_string())
}

#[cfg(test)]
#[path = "view_tests.rs"]
pub(crate) mod tests;
