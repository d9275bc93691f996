//! The walk's variables and logs: `$upstrand_NAME`, the status variables as documented, the
//! `extend_single_peers` warning, the debug log, and the variables inside the filter chain;
//! `combine_server_singlets` without servers.

use super::*;

// ---- $upstrand_NAME is an exact variable ---------------------------------------------------

/// A typo in the upstrand name fails `nginx -t` with nginx's own message (no prefix variable
/// that would accept any `$upstrand_*` and fail only at run time).
pub(super) fn upstrand_variable_typo_fails_config_test() -> CaseResult {
    expect_emerg(
        "upstream u01 { server 127.0.0.1:{P1}; }
         upstrand us1 { upstream u01; }
         server { listen 127.0.0.1:{P0}; location / { proxy_pass http://$upstrand_typo; } }",
        "unknown \"upstrand_typo\" variable",
    )
}

/// `$upstrand_NAME` may be used before its block (nginx resolves variables at the end of
/// `http {}`), in any letter case, and a status variable name is not an upstrand.
pub(super) fn upstrand_variable_exists_once_its_block_exists() -> CaseResult {
    expect_ok(
        "upstream u01 { server 127.0.0.1:{P1}; }
         server { listen 127.0.0.1:{P0}; location / { proxy_pass http://$upstrand_US1; } }
         upstrand us1 { upstream u01; }",
    )?;
    let n = Nginx::start(&config(
        &[("u01", 1)],
        "upstrand us1 { upstream u01; }",
        "location / { proxy_pass http://$UPSTRAND_us1; }",
        &[(1, "u01", 200)],
    ))?;
    check_answer(&n.get_on(0, "/")?, 200, "u01 200\n")?;
    expect_emerg(
        "upstream u01 { server 127.0.0.1:{P1}; }
         upstrand us1 { upstream u01; }
         server { listen 127.0.0.1:{P0}; location / { proxy_pass http://$upstrand_us2; } }",
        "unknown \"upstrand_us2\" variable",
    )
}

// ---- combine_server_singlets needs servers -------------------------------------------------

pub(super) fn combine_server_singlets_before_any_server_is_an_error() -> CaseResult {
    expect_emerg(
        "upstream u { combine_server_singlets; server 127.0.0.1:{P1}; }",
        "no server so far declared to build singlets",
    )?;
    expect_emerg(
        "upstream u { combine_server_singlets _s_ 2 nobackup; }",
        "no server so far declared to build singlets",
    )?;
    expect_ok("upstream u { server 127.0.0.1:{P1}; combine_server_singlets; }").map(|_| ())
}

// ---- status variables as documented --------------------------------------------------------

/// docs/directives.md, "Status variables": one `(UPSTREAM) VALUE` entry per step, the failover
/// subrequest as `(<intercepted>) VALUE` (its own `$upstream_*` when it proxies, `-` when it
/// does not), `$upstrand_path` without the failover subrequest; a first-upstream hit has one
/// entry; `$upstrand_NAME` evaluated outside `proxy_pass` has a path and `-` values.
pub(super) fn status_variables_follow_the_docs_in_every_walk() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2), ("fo", 3), ("ok", 4)],
        "upstrand us1 { upstream u01; upstream u02; order per_request; \
         next_upstream_statuses 5xx; intercept_statuses 5xx /failover; }
         upstrand us2 { upstream u01; upstream u02; order per_request; \
         next_upstream_statuses 5xx; intercept_statuses 5xx /plain-failover; }
         upstrand hit { upstream ok; upstream u01; order per_request; next_upstream_statuses 5xx; }",
        "location /proxied { proxy_pass http://$upstrand_us1; }
         location /plain { proxy_pass http://$upstrand_us2; }
         location /hit { proxy_pass http://$upstrand_hit; }
         location /name { return 200 \"$upstrand_hit\\n\"; }
         location /failover { internal; proxy_pass http://fo; }
         location /plain-failover { internal; return 503 \"no luck\\n\"; }",
        &[
            (1, "u01", 503),
            (2, "u02", 502),
            (3, "fo", 200),
            (4, "ok", 200),
        ],
    ))?;
    let (p1, p2, p3, p4) = (n.ports()[1], n.ports()[2], n.ports()[3], n.ports()[4]);
    check_answer(&n.get_on(0, "/proxied")?, 200, "fo 200\n")?;
    let f = log_fields(&n, 0)?;
    check_eq(f[2].as_str(), "u01 -> u02", "path of an intercepted walk")?;
    check_eq(
        f[3].clone(),
        format!("(u01) 127.0.0.1:{p1} (u02) 127.0.0.1:{p2} (<intercepted>) 127.0.0.1:{p3}"),
        "addr of an intercepted walk",
    )?;
    check_eq(
        f[4].as_str(),
        "(u01) 503 (u02) 502 (<intercepted>) 200",
        "status of an intercepted walk",
    )?;
    check_answer(&n.get_on(0, "/plain")?, 503, "no luck\n")?;
    let f = log_fields(&n, 1)?;
    check_eq(f[2].as_str(), "u01 -> u02", "path")?;
    check_eq(
        f[4].as_str(),
        "(u01) 503 (u02) 502 (<intercepted>) -",
        "a failover location without upstream shows -",
    )?;
    check_answer(&n.get_on(0, "/hit")?, 200, "ok 200\n")?;
    let f = log_fields(&n, 2)?;
    check_eq(f[2].as_str(), "ok", "path of a hit")?;
    check_eq(
        f[3].clone(),
        format!("(ok) 127.0.0.1:{p4}"),
        "addr of a hit",
    )?;
    check_eq(f[4].as_str(), "(ok) 200", "status of a hit")?;
    check_answer(&n.get_on(0, "/name")?, 200, "ok\n")?;
    let f = log_fields(&n, 3)?;
    check_eq(f[2].as_str(), "ok", "path when only the name was taken")?;
    check_eq(f[4].as_str(), "(ok) -", "no upstream ran: -")?;
    check_no_alerts(&n)
}

// ---- extend_single_peers warning -----------------------------------------------------------

/// The warning names the `upstream` block's own file and line, not the end of `http {}`.
pub(super) fn extend_single_peers_warning_names_upstream_file_and_line() -> CaseResult {
    let n = Nginx::start(
        "\nupstream lonely {\n server 127.0.0.1:{P1};\n extend_single_peers;\n least_conn;\n}\n\
         upstream fine { server 127.0.0.1:{P1}; }\n\
         server { listen 127.0.0.1:{P0};\n location / { proxy_pass http://fine; }\n}\n\
         server { listen 127.0.0.1:{P1}; return 200; }\n",
    )?;
    let conf = n.prefix().join("conf/nginx.conf");
    let text = fs::read_to_string(&conf).map_err(|e| e.to_string())?;
    let line = text
        .lines()
        .position(|l| l.trim_start().starts_with("upstream lonely {"))
        .ok_or("no upstream line in nginx.conf")?
        + 1;
    let want = format!(
        "\"extend_single_peers\" has no effect in upstream \"lonely\": a load balancing \
         directive after it replaced it; put extend_single_peers after the balancer in {}:{line}",
        conf.display()
    );
    let log = n.error_log();
    check(
        log.lines()
            .any(|l| l.contains("[warn]") && l.ends_with(&want)),
        || format!("expected a [warn] line ending with {want:?}, got:\n{log}"),
    )
}

// ---- debug log -----------------------------------------------------------------------------

/// `error_log ... debug` shows where a walk started, why it moved on and why it stopped.
pub(super) fn walk_decisions_are_in_the_debug_log() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2), ("b01", 3)],
        "error_log {PREFIX}/logs/debug.log debug;
         upstrand us1 { upstream u01; upstream u02; upstream b01 backup; order per_request; \
         next_upstream_statuses 5xx; }
         upstrand us2 { upstream u01; order per_request; next_upstream_statuses 5xx; \
         intercept_statuses 503 /failover; }",
        "location /us1 { proxy_pass http://$upstrand_us1; }
         location /us2 { proxy_pass http://$upstrand_us2; }
         location /failover { internal; return 200 \"failover\\n\"; }",
        &[(1, "u01", 503), (2, "u02", 502), (3, "b01", 200)],
    ))?;
    check_answer(&n.get_on(0, "/us1")?, 200, "b01 200\n")?;
    check_answer(&n.get_on(0, "/us2")?, 200, "failover\n")?;
    let want = [
        "upstrand \"us1\": walk starts at upstream \"u01\" (normal cycle)",
        "upstrand \"us1\": upstream \"u01\" answered 503 (sent by the backend), listed in \
         next_upstream_statuses: moving on to upstream \"u02\" (normal cycle)",
        "upstrand \"us1\": upstream \"u02\" answered 502 (sent by the backend), listed in \
         next_upstream_statuses: moving on to upstream \"b01\" (backup cycle)",
        "upstrand \"us1\": walk stops at upstream \"b01\" with 200 (sent by the backend): the \
         status is not in next_upstream_statuses; delivering this answer",
        "upstrand \"us2\": walk stops at upstream \"u01\" with 503 (sent by the backend): no \
         upstream is left in the normal and backup cycles; intercepted by \"/failover\" \
         (intercept_statuses)",
    ];
    wait_for_log(&n, "debug.log", |t| {
        want.iter()
            .all(|w| t.lines().any(|l| l.contains("[debug]") && l.ends_with(w)))
    })?;
    // Not at the info level of the main error log.
    check(!n.error_log().contains("walk starts at"), || {
        "walk lines leak into a non-debug log".to_string()
    })
}

// ---- variables of the walk inside the filter chain -----------------------------------------

/// `add_header` evaluates `$upstrand_us1` and the status variables inside the header filter
/// chain that the walk itself drives (the module's handlers re-entered while it delivers the
/// final answer): values as documented, nothing logged worse than `[error]`.
pub(super) fn add_header_reads_walk_variables_while_the_walk_delivers() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2), ("b01", 3)],
        "upstrand us1 { upstream u01; upstream u02; upstream b01 backup; order per_request; \
         next_upstream_statuses 5xx; }
         upstrand us2 { upstream u01; upstream u02; order per_request; next_upstream_statuses 5xx; \
         intercept_statuses 5xx /failover; }",
        "location /walk { add_header X-Us $upstrand_us1 always; add_header X-Path $upstrand_path always; \
         add_header X-Status $upstrand_status always; proxy_pass http://$upstrand_us1; }
         location /icpt { add_header X-Us $upstrand_us2 always; add_header X-Path $upstrand_path always; \
         add_header X-Status $upstrand_status always; proxy_pass http://$upstrand_us2; }
         location /failover { internal; return 503 \"failover\\n\"; }",
        &[(1, "u01", 503), (2, "u02", 502), (3, "b01", 200)],
    ))?;
    for _ in 0..3 {
        let a = n.get_on(0, "/walk")?;
        check_answer(&a, 200, "b01 200\n")?;
        check_eq(a.header("X-Us"), Some("u01"), "the root's upstream")?;
        check_eq(a.header("X-Path"), Some("u01 -> u02 -> b01"), "X-Path")?;
        check_eq(
            a.header("X-Status"),
            Some("(u01) 503 (u02) 502 (b01) 200"),
            "X-Status",
        )?;
        let a = n.get_on(0, "/icpt")?;
        check_answer(&a, 503, "failover\n")?;
        check_eq(a.header("X-Path"), Some("u01 -> u02"), "X-Path (intercept)")?;
        check_eq(
            a.header("X-Status"),
            Some("(u01) 503 (u02) 502 (<intercepted>) -"),
            "X-Status (intercept)",
        )?;
    }
    check_no_alerts(&n)
}
