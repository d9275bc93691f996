//! Cases for `upstrand`, `$upstrand_NAME`, the status variables and `dynamic_upstrand`
//! against Debian's nginx with the module loaded. Every row is a named test; run directly it ends
//! with `N passed, N failed`.
//!
//! Layout of the configurations: the front server listens on `{P0}`; backends are `server {}`
//! blocks of the same nginx on `{P1}`…`{P8}`; `{P9}` is a free port nobody listens on (a
//! connection there is refused: an nginx-generated 502). Some cases add a "black hole" (a
//! listening socket of the test that never answers: an nginx-generated 504 after
//! `proxy_read_timeout`). Paths walked are read from an access log with `$upstrand_path`.
//! Order, blacklisting and the cursor (per-worker state): `upstrand_order.rs`.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Stdio};

use crate::case::Case;
use ngx_harness::{check, check_eq, expect_ok, CaseResult, Failed, KeepAlive, Nginx};

use crate::upstrand_common::*;

mod failover;
mod intercept;
mod vars;
use failover::*;
use intercept::*;
use vars::*;

// ---- 1. parsing ---------------------------------------------------------------------------

const U: &str = "upstream u01 { server 127.0.0.1:{P1}; } upstream u02 { server 127.0.0.1:{P2}; } ";

fn emerg_cases() -> Vec<Case> {
    let cases: &[(&str, &'static str, &'static str)] = &[
        (
            "conf_bad_inner_directive",
            "upstrand us1 { upstream u01; foo bar; }",
            "bad upstrand directive \"foo\"",
        ),
        (
            "conf_duplicate_order",
            "upstrand us1 { upstream u01; order per_request; order start_random; }",
            "duplicate upstrand directive \"order\"",
        ),
        (
            "conf_duplicate_timeout",
            "upstrand us1 { upstream u01; next_upstream_timeout 1s; next_upstream_timeout 2s; }",
            "duplicate upstrand directive \"next_upstream_timeout\"",
        ),
        (
            "conf_status_600",
            "upstrand us1 { upstream u01; next_upstream_statuses 5xx 600; }",
            "invalid status \"600\"",
        ),
        (
            "conf_status_99",
            "upstrand us1 { upstream u01; next_upstream_statuses 99; }",
            "invalid status \"99\"",
        ),
        (
            "conf_status_word",
            "upstrand us1 { upstream u01; next_upstream_statuses errors; }",
            "invalid status \"errors\"",
        ),
        (
            "conf_intercept_status",
            "upstrand us1 { upstream u01; intercept_statuses 6xx /f; }",
            "invalid status \"6xx\"",
        ),
        (
            "conf_intercept_non_idempotent",
            "upstrand us1 { upstream u01; intercept_statuses non_idempotent /f; }",
            "invalid status \"non_idempotent\"",
        ),
        (
            "conf_intercept_without_uri",
            "upstrand us1 { upstream u01; intercept_statuses /f; }",
            "invalid number of arguments in \"intercept_statuses\" directive",
        ),
        (
            "conf_bad_timeout",
            "upstrand us1 { upstream u01; next_upstream_timeout 10x; }",
            "bad timeout value: \"10x\"",
        ),
        (
            "conf_bad_blacklist_interval",
            "upstrand us1 { upstream u01 blacklist_interval=abc; }",
            "bad blacklist interval: \"abc\"",
        ),
        (
            "conf_unknown_upstream",
            "upstrand us1 { upstream nope; }",
            "upstream \"nope\" is not found",
        ),
        (
            "conf_upstream_defined_after_block",
            "upstrand us1 { upstream u03; } upstream u03 { server 127.0.0.1:{P3}; }",
            "upstream \"u03\" is not found",
        ),
        (
            "conf_regex_defined_after_block",
            "upstrand us1 { upstream ~^z; } upstream z1 { server 127.0.0.1:{P3}; }",
            "no upstream registered in upstrand \"us1\"",
        ),
        (
            "conf_empty_block",
            "upstrand us1 { order per_request; }",
            "no upstream registered in upstrand \"us1\"",
        ),
        (
            "conf_duplicate_upstrand",
            "upstrand us1 { upstream u01; } upstrand us1 { upstream u02; }",
            "duplicate upstrand \"us1\"",
        ),
        ("conf_bad_regex", "upstrand us1 { upstream ~^(u0; }", "pcre"),
        (
            "conf_invalid_upstream_parameter",
            "upstrand us1 { upstream u01 backupx; }",
            "invalid parameter \"backupx\"",
        ),
        (
            "conf_bad_order",
            "upstrand us1 { upstream u01; order random; }",
            "invalid parameter \"random\"",
        ),
        (
            "conf_reserved_name",
            "upstrand addr { upstream u01; }",
            "invalid upstrand name \"addr\"",
        ),
        (
            "conf_upstrand_in_server",
            "server { listen 127.0.0.1:{P0}; upstrand us1 { upstream u01; } }",
            "\"upstrand\" directive is not allowed here",
        ),
        (
            "conf_dynamic_bad_result",
            "server { listen 127.0.0.1:{P0}; dynamic_upstrand dus $arg_a; }",
            "invalid variable name \"dus\"",
        ),
        (
            "conf_dynamic_no_candidate",
            "server { listen 127.0.0.1:{P0}; dynamic_upstrand $dus us1; }",
            "invalid number of arguments in \"dynamic_upstrand\" directive",
        ),
        (
            "conf_dynamic_in_http",
            "dynamic_upstrand $dus $arg_a;",
            "\"dynamic_upstrand\" directive is not allowed here",
        ),
    ];
    cases
        .iter()
        .map(|(name, body, want)| {
            let http: &'static str = Box::leak(format!("{U}{body}").into_boxed_str());
            Case::emerg(*name, http, want)
        })
        .collect()
}

fn conf_seed_example_accepted() -> CaseResult {
    expect_ok(
        "upstream u01 { server 127.0.0.1:{P1}; } upstream u02 { server 127.0.0.1:{P2}; }
         upstream b01 { server 127.0.0.1:{P3}; }
         upstrand us1 {
             upstream ~^u0 blacklist_interval=60s;
             upstream b01 backup;
             order start_random;
             next_upstream_statuses error timeout non_idempotent 204 5xx;
             next_upstream_timeout 60s;
             intercept_statuses 5xx /Internal/failover;
         }
         server { listen 127.0.0.1:{P0}; location /us1 { proxy_pass http://$upstrand_us1; } }",
    )?;
    Ok(())
}

/// Regex members over upstreams made by `combine_server_singlets` (definition order).
fn conf_regex_members_include_singlets() -> CaseResult {
    let n = Nginx::start(&config(
        &[],
        "upstream u1 { server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; \
         combine_server_singlets _single_ nobackup; }
         upstrand us1 { upstream ~^u1_single_; order per_request; next_upstream_statuses 5xx; }",
        "location / { proxy_pass http://$upstrand_us1; }",
        &[(1, "s1", 503), (2, "s2", 200)],
    ))?;
    check_answer(&n.get_on(0, "/")?, 200, "s2 200\n")?;
    check_path(&n, 0, "u1_single_1 -> u1_single_2", "path")
}

/// The cases of this area, named without the area (`main.rs` adds it).
pub fn cases() -> Vec<Case> {
    let mut trials = emerg_cases();
    trials.extend(cases![
        conf_seed_example_accepted,
        conf_regex_members_include_singlets,
        failover_normal_then_backup_cycle,
        failover_last_answer_is_delivered,
        failover_first_unlisted_answer_stops,
        failover_4xx_and_exact_codes,
        failover_through_gzip_and_chunked,
        failover_with_proxy_buffering_off,
        failover_one_mebibyte_bodies,
        failover_head_request,
        failover_error_and_timeout_against_backend_codes,
        failover_non_idempotent_post,
        walk_longer_than_subrequest_limit,
        subrequest_upstrand_walk_inside_ssi_include,
        next_upstream_timeout_returns_last_answer,
        intercept_after_timeout,
        intercept_with_try_files_and_error_page,
        intercept_first_matching_directive_wins,
        redirect_error_page_does_not_break_walk,
        redirect_x_accel_redirect_is_ignored,
        subrequest_ssi_inside_upstrand_request,
        two_upstrands_in_one_request_give_500,
        status_variables_format,
        status_variables_outside_upstrand_are_not_found,
        dynamic_upstrand_seed_example,
    ]);
    trials
}
