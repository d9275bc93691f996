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

/// The status class of an HTTP status: 0 for 1xx … 4 for 5xx; None outside 100–599 (no
/// response, or nginx's own codes).
pub fn status_class(status: u64) -> Option<usize> {
    match status {
        100..=599 => Some((status / 100 - 1) as usize),
        _ => None,
    }
}

/// One server's counters as the module keeps them in the zone (a plain copy of its atomics):
/// what [`ServerStats`] is computed from.
///
/// Averages: `header_ms` and `response_ms` are the sums over every response (a try that
/// received a response header from the server) of its time to the header and its time to the
/// end of the try (from nginx's start of the try, the connect included); the averages are those
/// sums divided by the number of responses, i.e. the mean over all responses since the server
/// joined the set (integer milliseconds, rounded down). Tries that got no response (refused,
/// timed out before a header) count in `requests` and `fails` but in no average.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawCounters {
    /// Tries sent to the server.
    pub requests: u64,
    /// Responses by class (1xx … 5xx).
    pub classes: [u64; 5],
    /// Bytes sent to the server.
    pub sent: u64,
    /// Bytes received from the server.
    pub received: u64,
    /// Failed tries.
    pub fails: u64,
    /// Times the server became unavailable (`fails` reached `max_fails`).
    pub unavail: u64,
    /// Milliseconds of ended down spells.
    pub downtime: u64,
    /// Start of the current down spell (epoch ms; 0: none).
    pub downstart_ms: u64,
    /// Last selection (epoch ms; 0: never).
    pub selected_ms: u64,
    /// Sum of the responses' times to the header (ms).
    pub header_ms: u64,
    /// Sum of the responses' times to their end (ms).
    pub response_ms: u64,
}

impl RawCounters {
    /// The statistics these counters give (`health_checks` left for the caller).
    pub fn to_stats(&self) -> ServerStats {
        let [c1xx, c2xx, c3xx, c4xx, c5xx] = self.classes;
        let total = self.classes.iter().fold(0u64, |a, c| a.saturating_add(*c));
        let mean = |sum: u64| sum.checked_div(total).unwrap_or(0);
        ServerStats {
            requests: self.requests,
            responses: Responses {
                c1xx,
                c2xx,
                c3xx,
                c4xx,
                c5xx,
                total,
            },
            sent: self.sent,
            received: self.received,
            fails: self.fails,
            unavail: self.unavail,
            downtime: self.downtime,
            downstart_ms: self.downstart_ms,
            selected_ms: self.selected_ms,
            header_time: mean(self.header_ms),
            response_time: mean(self.response_ms),
            health_checks: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_their_class_and_others_to_none() {
        assert_eq!(status_class(100), Some(0));
        assert_eq!(status_class(200), Some(1));
        assert_eq!(status_class(302), Some(2));
        assert_eq!(status_class(404), Some(3));
        assert_eq!(status_class(499), Some(3));
        assert_eq!(status_class(500), Some(4));
        assert_eq!(status_class(599), Some(4));
        assert_eq!(status_class(0), None);
        assert_eq!(status_class(99), None);
        assert_eq!(status_class(600), None);
        assert_eq!(status_class(1000), None);
    }

    #[test]
    fn averages_are_the_mean_over_the_responses() {
        let raw = RawCounters {
            requests: 5,
            classes: [0, 2, 0, 1, 1],
            fails: 1,
            header_ms: 10 + 20 + 31,
            response_ms: 15 + 25 + 41,
            ..Default::default()
        };
        let s = raw.to_stats();
        assert_eq!(s.responses.total, 4);
        assert_eq!(s.responses.c2xx, 2);
        assert_eq!(s.responses.c4xx, 1);
        assert_eq!(s.responses.c5xx, 1);
        // 61 / 4 and 81 / 4, rounded down.
        assert_eq!(s.header_time, 15);
        assert_eq!(s.response_time, 20);
        assert_eq!(s.requests, 5);
        assert_eq!(s.fails, 1);
        assert_eq!(s.health_checks, None);
    }

    #[test]
    fn no_response_means_zero_averages() {
        let raw = RawCounters {
            requests: 3,
            fails: 3,
            ..Default::default()
        };
        let s = raw.to_stats();
        assert_eq!(
            (s.header_time, s.response_time, s.responses.total),
            (0, 0, 0)
        );
    }

    #[test]
    fn stats_render_with_plus_names() {
        let s = RawCounters {
            classes: [1, 2, 3, 4, 5],
            ..Default::default()
        }
        .to_stats();
        let v = serde_json::to_value(s).unwrap();
        assert_eq!(v["responses"]["1xx"], 1);
        assert_eq!(v["responses"]["5xx"], 5);
        assert_eq!(v["responses"]["total"], 15);
        assert!(v.get("health_checks").is_none());
    }
}
