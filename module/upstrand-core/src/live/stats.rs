//! Per-server statistics of a live upstream, as `GET <loc>/NAME` shows them (`"stats"` of each
//! server) and as the NGINX Plus-compatible API reports them per peer.
//!
//! The module keeps the counters in the zone (every worker adds to them with atomics); this is
//! the plain copy read out of it. The field names are the ones NGINX Plus uses for a peer of
//! `/api/N/http/upstreams/NAME`, so the two views map one to one. Times are milliseconds;
//! instants are milliseconds since the Unix epoch (0: never).

use serde::{Deserialize, Serialize};

/// Responses by status class.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Responses {
    #[serde(rename = "1xx")]
    pub c1xx: u64,
    #[serde(rename = "2xx")]
    pub c2xx: u64,
    #[serde(rename = "3xx")]
    pub c3xx: u64,
    #[serde(rename = "4xx")]
    pub c4xx: u64,
    #[serde(rename = "5xx")]
    pub c5xx: u64,
    /// Every response received from the server (the five classes summed).
    pub total: u64,
}

/// The probe's counters (only for an upstream with a `probe`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HealthChecks {
    /// Probes made.
    pub checks: u64,
    /// Probes that failed.
    pub fails: u64,
    /// Times the server went from healthy to unhealthy.
    pub unhealthy: u64,
    /// Whether the last probe passed (absent before the first probe).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_passed: Option<bool>,
}

/// One server's statistics since it joined the set (or since the zone was made: a reload starts
/// them at 0, as NGINX Plus does).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests sent to the server (each try counts once).
    pub requests: u64,
    /// Responses received, by class.
    pub responses: Responses,
    /// Bytes sent to the server.
    pub sent: u64,
    /// Bytes received from the server.
    pub received: u64,
    /// Unsuccessful tries (what nginx counts toward `max_fails`), since it joined.
    pub fails: u64,
    /// Times the server became unavailable because `fails` reached `max_fails`.
    pub unavail: u64,
    /// Milliseconds the server spent unavailable or unhealthy (not counting a current spell).
    pub downtime: u64,
    /// When the current spell of unavailability began (epoch ms; 0: not down now).
    pub downstart_ms: u64,
    /// When the server was last chosen for a request (epoch ms; 0: never).
    pub selected_ms: u64,
    /// Average time to the response header, in milliseconds (see `docs/plus-api.md`).
    pub header_time: u64,
    /// Average time to the whole response, in milliseconds.
    pub response_time: u64,
    /// The probe's counters (absent without a `probe`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub health_checks: Option<HealthChecks>,
}
