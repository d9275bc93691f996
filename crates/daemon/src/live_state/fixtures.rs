//! `GET <loc>/NAME` answers for the tests of what shows the live state (CLI, UI, metrics).

/// `GET <loc>/NAME` of a module with `probe ... slow_start=...` and drain, field names as in
/// CONTRACT.md §2, plus fields this daemon does not know (`max_conns`, `retiring`,
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

/// `GET <loc>/NAME` of a module before no `drain`, no probe fields.
pub const OLD_JSON: &str = r#"{"generation": 3, "rebalanced": 0,
  "servers": [
    {"address": "10.0.0.1:80", "weight": 1, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": false, "active": 3, "fails": 2},
    {"address": "10.0.0.2:80", "weight": 5, "max_fails": 1, "fail_timeout_ms": 10000,
     "max_conns": 0, "backup": false, "down": true, "active": 0, "fails": 0}
  ],
  "retiring": 1, "retired": [{"address": "10.0.0.9:80", "active": 2, "age_ms": 61000}]}"#;

/// `GET <loc>/NAME` of a module with per-server ids and statistics (CONTRACT.md §2 of
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

/// `GET <loc>/NAME` recorded from the real module (branch `stats`, nginx with 2 workers) in
/// `e2e/server_stats.rs` after 60 requests: a closed port (1 failed try, unavailable once), a
/// backend that answered 30 × 200 and one that answered 30 × 500 after 25 ms.
pub const RECORDED_JSON: &str = r#"{"generation": 1796400300441, "rebalanced": 0, "retiring": 0, "servers": [
    {"active": 0, "address": "127.0.0.1:33969", "backup": false, "down": false, "drain": false, "fail_timeout_ms": 10000, "fails": 1, "id": 0, "max_conns": 0, "max_fails": 1, "weight": 1,
     "stats": {"downstart_ms": 1796400300560, "downtime": 0, "fails": 1, "header_time": 0, "received": 0, "requests": 1, "response_time": 0, "responses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "total": 0}, "selected_ms": 1796400300559, "sent": 0, "unavail": 1}},
    {"active": 0, "address": "127.0.0.1:39549", "backup": false, "down": false, "drain": false, "fail_timeout_ms": 10000, "fails": 0, "id": 1, "max_conns": 0, "max_fails": 1, "weight": 1,
     "stats": {"downstart_ms": 0, "downtime": 0, "fails": 0, "header_time": 0, "received": 4290, "requests": 30, "response_time": 0, "responses": {"1xx": 0, "2xx": 30, "3xx": 0, "4xx": 0, "5xx": 0, "total": 30}, "selected_ms": 1796400301339, "sent": 1620, "unavail": 0}},
    {"active": 0, "address": "127.0.0.1:41159", "backup": false, "down": false, "drain": false, "fail_timeout_ms": 10000, "fails": 0, "id": 2, "max_conns": 0, "max_fails": 1, "weight": 1,
     "stats": {"downstart_ms": 0, "downtime": 0, "fails": 0, "header_time": 26, "received": 2460, "requests": 30, "response_time": 26, "responses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 30, "total": 30}, "selected_ms": 1796400301339, "sent": 1620, "unavail": 0}}
  ]}"#;

/// `GET <loc>/NAME` recorded from the real module in `e2e/live_state.rs`'s probed binding: one
/// healthy server, one refusing connections (`health_checks` in `stats`).
pub const RECORDED_PROBED_JSON: &str = r#"{"generation": 1796400308238, "probe": {"fails": 1, "interval_ms": 300, "mandatory": false, "owner_pid": 3896, "passes": 1, "probes": 2, "rounds": 1, "slow_start_ms": 0, "status": "200-399", "timeout_ms": 200, "type": "http", "uri": "/"}, "rebalanced": 0, "retiring": 0, "servers": [
    {"active": 0, "address": "127.0.0.1:34487", "backup": false, "down": false, "drain": false, "fail_timeout_ms": 10000, "fails": 0, "health": "healthy", "id": 0, "last_probe_ms_ago": 159, "last_status": 200, "max_conns": 0, "max_fails": 1, "probe_fails": 0, "probe_passes": 1, "weight": 1,
     "stats": {"downstart_ms": 0, "downtime": 0, "fails": 0, "header_time": 0, "health_checks": {"checks": 1, "fails": 0, "last_passed": true, "unhealthy": 0}, "received": 0, "requests": 0, "response_time": 0, "responses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "total": 0}, "selected_ms": 0, "sent": 0, "unavail": 0}},
    {"active": 0, "address": "127.0.0.1:44617", "backup": false, "down": false, "drain": false, "fail_timeout_ms": 10000, "fails": 0, "health": "unhealthy", "id": 1, "last_error": "connect: connection refused", "last_probe_ms_ago": 161, "max_conns": 0, "max_fails": 1, "probe_fails": 1, "probe_passes": 0, "weight": 1,
     "stats": {"downstart_ms": 1796400308248, "downtime": 0, "fails": 0, "header_time": 0, "health_checks": {"checks": 1, "fails": 1, "last_passed": false, "unhealthy": 1}, "received": 0, "requests": 0, "response_time": 0, "responses": {"1xx": 0, "2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, "total": 0}, "selected_ms": 0, "sent": 0, "unavail": 0}}
  ]}"#;
