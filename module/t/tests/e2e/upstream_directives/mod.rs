//! Cases for `add_upstream`, `combine_server_singlets` and `extend_single_peers` against a real
//! nginx with the module loaded. Every row is a named test; run directly it ends with
//! `N passed, N failed`.
//!
//! Backends are `server {}` blocks of the same nginx answering `return 200 "bN"` on `{P1}`…`{P4}`;
//! `{DEAD}` is a port nobody listens on (a dead server).
//!
//! nginx runs with its master process and 2 workers (the harness default). Round-robin state and
//! failed-peer accounting of an upstream without a `zone` are per worker, so cases that count
//! answers or follow a sequence send their requests over one keep-alive connection: one worker
//! serves them all, and the exact per-worker behaviour is asserted.

use std::collections::BTreeMap;

use crate::case::Case;
use ngx_harness::{check, check_eq, expect_emerg, expect_ok, CaseResult, Failed, KeepAlive, Nginx};

mod add_upstream;
mod singlets;
use add_upstream::*;
use singlets::*;

const BACKENDS: &str = r#"
server { listen 127.0.0.1:{P1}; return 200 "b1"; }
server { listen 127.0.0.1:{P2}; return 200 "b2"; }
server { listen 127.0.0.1:{P3}; return 200 "b3"; }
server { listen 127.0.0.1:{P4}; return 200 "b4"; }
"#;

/// `nginx -t` must fail with this `[emerg]` text.
const EMERG: &[(&str, &str, &str)] = &[
    (
        "add_upstream_unknown_name",
        "upstream c { add_upstream nope; }",
        "upstream \"nope\" not found",
    ),
    (
        "add_upstream_name_defined_later",
        "upstream c { add_upstream u1; } upstream u1 { server 127.0.0.1:{P1}; }",
        "upstream \"u1\" not found",
    ),
    (
        "add_upstream_self_reference",
        "upstream c { server 127.0.0.1:{P1}; add_upstream c; }",
        "upstream \"c\" makes recursion",
    ),
    (
        "add_upstream_backup_twice",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 backup backup; }",
        "parameter \"backup\" has been already declared",
    ),
    (
        "add_upstream_weight_twice",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 weight=2 weight=3; }",
        "parameter \"weight\" has been already declared",
    ),
    (
        "add_upstream_weight_zero",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 weight=0; }",
        "parameter \"weight\" must be a positive integer value",
    ),
    (
        "add_upstream_weight_not_a_number",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 weight=2x; }",
        "parameter \"weight\" must be a positive integer value",
    ),
    (
        "add_upstream_backup_prefix_is_not_backup",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 backupx; }",
        "invalid parameter \"backupx\"",
    ),
    (
        "add_upstream_too_many_arguments",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 backup weight=2 x; }",
        "invalid number of arguments in \"add_upstream\" directive",
    ),
    (
        "add_upstream_outside_upstream",
        "upstream u1 { server 127.0.0.1:{P1}; } server { listen 127.0.0.1:{P0}; add_upstream u1; }",
        "\"add_upstream\" directive is not allowed here",
    ),
    (
        "add_upstream_implicit_upstream_without_servers",
        "server { listen 127.0.0.1:{P0}; location / { proxy_pass http://localhost; } }
         upstream c { add_upstream localhost; }",
        "upstream \"localhost\" has no server list to copy",
    ),
    (
        "add_upstream_backup_into_balancer_without_backup",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { hash $uri; add_upstream u1 backup; }",
        "balancing method does not support parameter \"backup\"",
    ),
    (
        "add_upstream_weight_overflow",
        "upstream u1 { server 127.0.0.1:{P1} weight=100; }
         upstream c { add_upstream u1 weight=4294967296; }",
        "is too large in upstream \"u1\"",
    ),
    (
        "singlets_byname_with_width",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets byname 2; }",
        "setting field width is not permitted when using \"byname\" value",
    ),
    (
        "singlets_suffix_byname_with_width",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ byname 2; }",
        "setting field width is not permitted when using \"byname\" value",
    ),
    (
        "singlets_width_not_an_integer",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ two; }",
        "field width \"two\" must be an integer value",
    ),
    (
        "singlets_extra_parameter",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ 2 3; }",
        "invalid parameter \"3\"",
    ),
    (
        "singlets_too_many_arguments",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ 2 3 nobackup; }",
        "invalid number of arguments in \"combine_server_singlets\" directive",
    ),
    (
        "singlets_name_collides_with_earlier_upstream",
        "upstream u1 { server 127.0.0.1:{P2}; }
         upstream u { server 127.0.0.1:{P1}; combine_server_singlets; }",
        "duplicate upstream \"u1\"",
    ),
    (
        "singlets_name_collides_with_later_upstream",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _s_; }
         upstream u_s_1 { server 127.0.0.1:{P2}; }",
        "duplicate upstream \"u_s_1\"",
    ),
    (
        "singlets_byname_same_server_twice",
        "upstream u { server 127.0.0.1:{P1}; server 127.0.0.1:{P1}; combine_server_singlets byname; }",
        "duplicate upstream \"u127.0.0.1_",
    ),
    (
        "singlets_twice_in_one_upstream",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets; combine_server_singlets; }",
        "duplicate upstream \"u1\"",
    ),
    (
        "singlets_outside_upstream",
        "combine_server_singlets;",
        "\"combine_server_singlets\" directive is not allowed here",
    ),
    (
        "extend_single_peers_duplicate",
        "upstream u { server 127.0.0.1:{P1}; extend_single_peers; extend_single_peers; }",
        "\"extend_single_peers\" directive is duplicate",
    ),
    (
        "extend_single_peers_with_argument",
        "upstream u { server 127.0.0.1:{P1}; extend_single_peers on; }",
        "invalid number of arguments in \"extend_single_peers\" directive",
    ),
    (
        "extend_single_peers_outside_upstream",
        "server { listen 127.0.0.1:{P0}; extend_single_peers; }",
        "\"extend_single_peers\" directive is not allowed here",
    ),
];

/// Sends `n` requests to `path` over `conn` (one worker) and counts the bodies.
fn tally(conn: &mut KeepAlive, path: &str, n: usize) -> Result<BTreeMap<String, usize>, Failed> {
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let r = conn.get(path)?;
        check_eq(r.status, 200, &format!("status of {path}"))?;
        *m.entry(r.text()).or_insert(0) += 1;
    }
    Ok(m)
}

/// Bodies of `n` answers to `path` over `conn` (one worker), in order.
fn sequence(conn: &mut KeepAlive, path: &str, n: usize) -> Result<Vec<String>, Failed> {
    (0..n).map(|_| Ok(conn.get(path)?.text())).collect()
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn with_backends(http: &str) -> String {
    format!("{BACKENDS}\n{http}")
}

/// The module loads and an empty configuration with it passes `nginx -t`.
fn module_loads() -> CaseResult {
    expect_ok("").map(|_| ())
}

/// The cases of this area, named without the area (`main.rs` adds it).
pub fn cases() -> Vec<Case> {
    let mut trials: Vec<Case> = vec![
        Case::test("module_loads", module_loads),
        Case::test(
            "add_upstream_weights_like_hand_written",
            add_upstream_weights_like_hand_written,
        ),
        Case::test(
            "add_upstream_keeps_attributes",
            add_upstream_keeps_attributes,
        ),
        Case::test(
            "add_upstream_keeps_max_fails_and_fail_timeout",
            add_upstream_keeps_max_fails_and_fail_timeout,
        ),
        Case::test(
            "add_upstream_backup_only_when_primary_down",
            add_upstream_backup_only_when_primary_down,
        ),
        Case::test("add_upstream_chains", add_upstream_chains),
        Case::test("add_upstream_is_a_snapshot", add_upstream_is_a_snapshot),
        Case::test(
            "add_upstream_from_implicit_upstream",
            add_upstream_from_implicit_upstream,
        ),
        Case::test("singlets_all_name_forms", singlets_all_name_forms),
        Case::test("singlets_backup_and_nobackup", singlets_backup_and_nobackup),
        Case::test("singlets_sticky_sessions", singlets_sticky_sessions),
        Case::test(
            "extend_single_peers_marks_lone_peer_failed",
            extend_single_peers_marks_lone_peer_failed,
        ),
        Case::test(
            "extend_single_peers_keeps_live_traffic",
            extend_single_peers_keeps_live_traffic,
        ),
        Case::test(
            "extend_single_peers_warns_when_overridden",
            extend_single_peers_warns_when_overridden,
        ),
    ];
    trials.extend(
        EMERG
            .iter()
            .map(|(name, http, want)| Case::emerg(format!("emerg_{name}"), http, want)),
    );
    trials
}
