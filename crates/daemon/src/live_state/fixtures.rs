//! `GET <loc>/NAME` answers for the tests of what shows the live state (CLI, UI, metrics).

/// `GET <loc>/NAME` of a module with `probe ... slow_start=...` and drain, field names as in
/// CONTRACT.md §2 (issue 21), plus fields this daemon does not know (`max_conns`, `retiring`,
/// the upstream's `probe`, a made-up `future_field`): they are ignored.
pub const PROBED_JSON: &str = r#"{"generation": 12, "retiring": 0, "rebalanced": 0,
  "probe": {"type": "http", "interval_ms": 1000, "uri": "/healthz"},
  "servers": [
    {"address": "10.0.0.1:80", "weight": 2, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "active": 3, "fails": 0, "drain": false,
     "health": "healthy", "probe_fails": 0, "probe_passes": 4, "last_probe_ms_ago": 250,
     "last_status": 200, "slow_start_remaining_ms": 0, "future_field": [1, 2]},
    {"address": "10.0.0.2:80", "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "active": 0, "fails": 1, "drain": false,
     "health": "unhealthy", "probe_fails": 3, "probe_passes": 0, "last_probe_ms_ago": 900,
     "last_error": "connect: connection refused", "slow_start_remaining_ms": 0},
    {"address": "10.0.0.3:80", "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "active": 0, "fails": 0, "drain": false,
     "health": "checking", "probe_fails": 0, "probe_passes": 0, "slow_start_remaining_ms": 0},
    {"address": "10.0.0.4:80", "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "active": 7, "fails": 0, "drain": true,
     "health": "healthy", "probe_fails": 0, "probe_passes": 9, "last_probe_ms_ago": 100,
     "last_status": 204, "slow_start_remaining_ms": 0},
    {"address": "10.0.0.5:80", "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": true, "down": false, "active": 0, "fails": 0, "drain": false,
     "health": "healthy", "probe_fails": 0, "probe_passes": 2, "last_probe_ms_ago": 400,
     "last_status": 200, "slow_start_remaining_ms": 12500}
  ]}"#;

/// `GET <loc>/NAME` of a module before issue 21: no `drain`, no probe fields.
pub const OLD_JSON: &str = r#"{"generation": 3, "rebalanced": 0,
  "servers": [
    {"address": "10.0.0.1:80", "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "active": 3, "fails": 2},
    {"address": "10.0.0.2:80", "weight": 5, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": true, "active": 0, "fails": 0}
  ],
  "retiring": 1, "retired": [{"address": "10.0.0.9:80", "active": 2, "age_ms": 61000}]}"#;

/// `GET <loc>/NAME` of a module with per-server ids and statistics (issue 24, CONTRACT.md §2 of
/// session 9): `id` and `stats` in each server, `health_checks` in `stats` only for a probed
/// upstream. Three servers: one that served 12 requests (one 5xx), one that failed every try and
/// became unavailable, and one that saw nothing (zeros).
pub const STATS_JSON: &str = r#"{"generation": 7, "retiring": 0, "rebalanced": 0,
  "probe": {"type": "http", "interval_ms": 1000, "uri": "/healthz"},
  "servers": [
    {"address": "10.0.0.1:80", "id": 0, "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "drain": false, "active": 1, "fails": 0,
     "health": "healthy", "probe_fails": 0, "probe_passes": 5, "last_probe_ms_ago": 300,
     "last_status": 200,
     "stats": {"requests": 12,
               "responses": {"1xx": 0, "2xx": 10, "3xx": 1, "4xx": 0, "5xx": 1, "total": 12},
               "sent": 1800, "received": 5400, "fails": 0, "unavail": 0, "downtime": 0,
               "downstart_ms": 0, "selected_ms": 1764435540000, "header_time": 3,
               "response_time": 25,
               "health_checks": {"checks": 5, "fails": 0, "unhealthy": 0, "last_passed": true}}},
    {"address": "10.0.0.2:80", "id": 3, "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "drain": false, "active": 0, "fails": 1,
     "health": "unhealthy", "probe_fails": 2, "probe_passes": 0, "last_probe_ms_ago": 700,
     "last_error": "connect: connection refused",
     "stats": {"requests": 4,
               "responses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "total": 0},
               "sent": 0, "received": 0, "fails": 4, "unavail": 2, "downtime": 20000,
               "downstart_ms": 1764435530000, "selected_ms": 1764435529000,
               "header_time": 0, "response_time": 0, "new_counter": 9,
               "health_checks": {"checks": 6, "fails": 6, "unhealthy": 1, "last_passed": false}}},
    {"address": "10.0.0.3:80", "id": 4, "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": true, "down": false, "drain": false, "active": 0, "fails": 0,
     "health": "checking", "probe_fails": 0, "probe_passes": 0,
     "stats": {"requests": 0,
               "responses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "total": 0},
               "sent": 0, "received": 0, "fails": 0, "unavail": 0, "downtime": 0,
               "downstart_ms": 0, "selected_ms": 0, "header_time": 0, "response_time": 0,
               "health_checks": {"checks": 0, "fails": 0, "unhealthy": 0}}}
  ]}"#;
