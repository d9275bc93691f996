//! Cases for the live upstream API (`upstreams_api;`) against Debian's nginx with the
//! module loaded, run with `master_process on` and 2 workers so every change must reach both
//! workers through the zone. Every row is a named test; run directly it ends with
//! `N passed, N failed`.
//!
//! Layout: the front server listens on `{P0}` (`reuseport`, so both workers accept) and
//! answers with `X-Worker: <pid>` and the backend's body; the API is `/api/` on `{P0}`;
//! backends `b1`…`b5` are `server {}` blocks of the same nginx on `{P1}`…`{P5}`; `{DEAD}` is a
//! port where nothing listens. `Master` (`live_api/master.rs`) is the harness's `Nginx` plus the
//! worker PIDs seen at start or at the last reload, which these cases compare (`live_api/helpers.rs`:
//! configurations, bodies, shared checks).

mod access;
mod apply;
mod apply_tries;
mod churn;
mod drain;
mod edges;
mod health;
pub(crate) mod helpers;
mod liveness;
pub(crate) mod master;
mod plus;
mod plus_writes;
mod reload_race;
mod retired;
mod scale;
mod stats;
mod sticky;
mod zone_memory;
mod zone_size;

use crate::case::Case;

/// `(major, minor, patch)` of the nginx under test (`nginx -v`).
fn nginx_version() -> Result<(u32, u32, u32), String> {
    let out = std::process::Command::new(ngx_harness::nginx_bin())
        .arg("-v")
        .output()
        .map_err(|e| format!("nginx -v: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = text
        .split("nginx/")
        .nth(1)
        .map(|v| v.split_whitespace().next().unwrap_or(""))
        .ok_or_else(|| format!("nginx -v said {text:?}"))?;
    let n: Vec<u32> = v.split('.').filter_map(|x| x.parse().ok()).collect();
    match n[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => Err(format!("nginx -v said {text:?}")),
    }
}

/// The cases of this area, named without the area (`main.rs` adds it).
pub fn cases() -> Vec<Case> {
    let mut trials = vec![
        Case::emerg(
            "directive_takes_only_write_and_host",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api on; } }",
            "invalid parameter \"on\" in \"upstreams_api\" directive: the parameters are write=on|off, host=NAME and retired_warn=TIME|off",
        ),
        Case::emerg(
            "directive_retired_warn_takes_a_time_or_off",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api retired_warn=1d; } }",
            "invalid parameter \"retired_warn=1d\" in \"upstreams_api\" directive: retired_warn takes a time",
        ),
        Case::emerg(
            "directive_write_takes_on_or_off",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api write=yes; } }",
            "invalid parameter \"write=yes\" in \"upstreams_api\" directive: write takes on or off",
        ),
        Case::emerg(
            "directive_host_takes_no_port",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api write=on host=api:80; } }",
            "invalid parameter \"host=api:80\" in \"upstreams_api\" directive: host takes a host name",
        ),
        Case::emerg(
            "directive_once_per_location",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api; upstreams_api write=on; } }",
            "\"upstreams_api\" directive is duplicate",
        ),
        Case::emerg(
            "directive_only_in_a_location",
            "server { listen 127.0.0.1:{P0}; upstreams_api; }",
            "\"upstreams_api\" directive is not allowed here",
        ),
        Case::test(
            "lists_upstreams_and_names_balancers",
            apply::case_lists_upstreams_and_names_balancers,
        ),
        Case::test(
            "put_reaches_every_worker_without_reload",
            apply::case_put_reaches_every_worker_without_reload,
        ),
        Case::test("identical_set_is_a_no_op", apply::case_identical_set_is_a_no_op),
        Case::test(
            "servers_that_stay_keep_their_state",
            apply::case_servers_that_stay_keep_their_state,
        ),
        Case::test(
            "busy_server_is_retired_then_freed",
            apply_tries::case_busy_server_is_retired_then_freed,
        ),
        Case::test("compare_and_set_conflict", edges::case_compare_and_set_conflict),
        Case::test(
            "request_keeps_its_tries_when_the_set_shrinks_to_one",
            apply_tries::case_request_keeps_its_tries_when_the_set_shrinks_to_one,
        ),
        Case::test(
            "round_robin_position_is_kept",
            apply::case_round_robin_position_is_kept,
        ),
        Case::test(
            "workers_killed_under_traffic_and_puts",
            apply::case_workers_killed_under_traffic_and_puts,
        ),
        Case::test(
            "concurrent_compare_and_set_has_one_winner",
            apply::case_concurrent_compare_and_set_has_one_winner,
        ),
        Case::test(
            "large_set_from_a_body_in_a_temp_file",
            apply_tries::case_large_set_from_a_body_in_a_temp_file,
        ),
        Case::test(
            "request_gets_the_tries_of_a_grown_set",
            apply_tries::case_request_gets_the_tries_of_a_grown_set,
        ),
        Case::test(
            "request_between_tries_continues_in_a_grown_set",
            apply_tries::case_request_between_tries_continues_in_a_grown_set,
        ),
        Case::test("bad_inputs_change_nothing", edges::case_bad_inputs_change_nothing),
        Case::test(
            "reload_restores_the_configured_set",
            edges::case_reload_restores_the_configured_set,
        ),
        Case::test("zone_memory_does_not_grow", zone_memory::case_zone_memory_does_not_grow),
        Case::test(
            "servers_from_the_api_take_the_memory_of_configured_ones",
            zone_memory::case_servers_from_the_api_take_the_memory_of_configured_ones,
        ),
        Case::test(
            "least_conn_and_keepalive_take_live_changes",
            edges::case_least_conn_and_keepalive_take_live_changes,
        ),
        Case::ignorable_test(
            "resolve_servers_are_refused",
            edges::case_resolve_servers_are_refused,
        ),
        Case::test(
            "set_changes_under_traffic_with_retries",
            edges::case_set_changes_under_traffic_with_retries,
        ),
        Case::test(
            "retries_stay_bounded_while_sets_keep_changing",
            liveness::case_retries_stay_bounded_while_sets_keep_changing,
        ),
        Case::test(
            "worker_killed_holding_the_gate_leaves_puts_busy_not_stuck",
            liveness::case_worker_killed_holding_the_gate_leaves_puts_busy_not_stuck,
        ),
        Case::test(
            "no_request_fails_while_sets_change_every_10ms",
            liveness::case_no_request_fails_while_sets_change_every_10ms,
        ),
        Case::test(
            "a_long_request_on_a_removed_server_costs_other_requests_nothing",
            liveness::case_a_long_request_on_a_removed_server_costs_other_requests_nothing,
        ),
        Case::test(
            "a_retired_server_whose_worker_died_shows_its_age_until_a_reload",
            retired::case_a_retired_server_whose_worker_died_shows_its_age_until_a_reload,
        ),
        Case::test(
            "a_retired_server_whose_worker_died_is_named_once_in_a_warn_line",
            retired::case_a_retired_server_whose_worker_died_is_named_once_in_a_warn_line,
        ),
    ];
    trials.extend(access::trials());
    trials.extend(health::trials());
    trials.extend(zone_size::trials());
    trials.extend(reload_race::trials());
    trials.push(Case::ignorable_test(
        "sticky_upstreams_are_refused_and_keep_learning",
        sticky::case_sticky_upstreams_are_refused_and_keep_learning,
    ));
    trials.extend(scale::trials());
    trials.extend(drain::trials());
    trials.extend(stats::trials());
    trials.extend(plus::trials());
    trials
}
