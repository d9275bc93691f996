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

// ---- 2. failover --------------------------------------------------------------------------

/// u01, u02 and the backup b01 answering `s1`, `s2`, `s3`; `order per_request`.
fn three_and_backup(location_extra: &str, statuses: &str, s1: u16, s2: u16, s3: u16) -> String {
    config(
        &[("u01", 1), ("u02", 2), ("b01", 3)],
        &format!(
            "upstrand us1 {{ upstream ~^u0; upstream b01 backup; order per_request; \
             next_upstream_statuses {statuses}; }}"
        ),
        &format!(
            "location / {{ {location_extra} add_header X-Loc front; proxy_pass http://$upstrand_us1; }}"
        ),
        &[(1, "u01", s1), (2, "u02", s2), (3, "b01", s3)],
    )
}

fn failover_normal_then_backup_cycle() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    let a = n.get_on(0, "/x?q=1")?;
    check_answer(&a, 200, "b01 200\n")?;
    check_eq(a.header("X-From"), Some("b01"), "backend header")?;
    check_eq(
        a.header("X-Loc"),
        Some("front"),
        "add_header of the location",
    )?;
    check_path(&n, 0, "u01 -> u02 -> b01", "path")
}

fn failover_last_answer_is_delivered() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 504))?;
    let a = n.get_on(0, "/")?;
    check_eq(a.status, 504, "status of the last upstream")?;
    check_eq(a.text().as_str(), "b01 504\n", "body of the last upstream")?;
    check_eq(
        a.header("X-From"),
        Some("b01"),
        "header of the last upstream",
    )?;
    check_path(&n, 0, "u01 -> u02 -> b01", "path")
}

fn failover_first_unlisted_answer_stops() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 404, 502, 200))?;
    check_answer(&n.get_on(0, "/")?, 404, "u01 404\n")?;
    check_path(&n, 0, "u01", "path")
}

fn failover_4xx_and_exact_codes() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "4xx 204", 404, 204, 200))?;
    check_eq(n.get_on(0, "/")?.status, 200, "status")?;
    check_path(&n, 0, "u01 -> u02 -> b01", "path")?;
    let n = Nginx::start(&three_and_backup("", "204", 404, 204, 200))?;
    check_eq(n.get_on(0, "/")?.status, 404, "404 is not listed")?;
    check_path(&n, 0, "u01", "path")
}

fn gunzip(data: &[u8]) -> Result<Vec<u8>, Failed> {
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("gzip (Debian package gzip) is needed: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(data)
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    check(out.status.success(), || {
        "gzip -dc failed: answer is not valid gzip".into()
    })?;
    Ok(out.stdout)
}

fn failover_through_gzip_and_chunked() -> CaseResult {
    let n = Nginx::start(&three_and_backup(
        "gzip on; gzip_min_length 1; gzip_types text/plain;",
        "5xx",
        503,
        502,
        200,
    ))?;
    let a = n.get_with(0, "/", &[("Accept-Encoding", "gzip")])?;
    check_eq(a.status, 200, "status")?;
    check_eq(a.header("Content-Encoding"), Some("gzip"), "gzip applied")?;
    check_eq(
        a.header("Transfer-Encoding"),
        Some("chunked"),
        "chunked applied",
    )?;
    check_eq(gunzip(&a.body)?, b"b01 200\n".to_vec(), "decompressed body")
}

fn failover_with_proxy_buffering_off() -> CaseResult {
    let n = Nginx::start(&three_and_backup(
        "proxy_buffering off;",
        "5xx",
        503,
        502,
        200,
    ))?;
    for _ in 0..3 {
        check_answer(&n.get_on(0, "/")?, 200, "b01 200\n")?;
    }
    Ok(())
}

fn big_body(seed: u8) -> Vec<u8> {
    (0..1024 * 1024)
        .map(|i: usize| b'a' + ((i * 7 + usize::from(seed)) % 26) as u8)
        .collect()
}

/// 1 MiB error body swallowed, 1 MiB answer delivered; buffered (to a temp file) and unbuffered.
fn failover_one_mebibyte_bodies() -> CaseResult {
    let http = config(
        &[("u01", 1), ("u02", 2)],
        "upstrand us1 { upstream u01; upstream u02; order per_request; next_upstream_statuses 503; }",
        "location /b/ { proxy_pass http://$upstrand_us1; }
         location /u/ { proxy_buffering off; proxy_pass http://$upstrand_us1; }",
        &[],
    ) + "server { listen 127.0.0.1:{P1}; root {PREFIX}/html; \
         location / { error_page 503 /err.txt; return 503; } location = /err.txt { internal; } }
         server { listen 127.0.0.1:{P2}; root {PREFIX}/html; }";
    let n = Nginx::start(&http)?;
    let html = n.prefix().join("html");
    fs::create_dir_all(&html).map_err(|e| e.to_string())?;
    let good = big_body(1);
    fs::write(html.join("err.txt"), big_body(2)).map_err(|e| e.to_string())?;
    // proxy_pass with a variable sends the request URI unchanged: serve /b/… and /u/….
    for d in ["b", "u"] {
        fs::create_dir_all(html.join(d)).map_err(|e| e.to_string())?;
        fs::write(html.join(d).join("big.txt"), &good).map_err(|e| e.to_string())?;
    }
    for (i, path) in ["/b/big.txt", "/u/big.txt", "/b/big.txt"]
        .iter()
        .enumerate()
    {
        let a = n.get_on(0, path)?;
        check_eq(a.status, 200, "status")?;
        check(a.body == good, || {
            format!("{path}: body of {} bytes differs", a.body.len())
        })?;
        check_path(&n, i, "u01 -> u02", "path")?;
    }
    // The swallowed 1 MiB error bodies must not stall a keep-alive connection.
    let mut conn = KeepAlive::open(n.port())?;
    for path in ["/b/big.txt", "/u/big.txt", "/b/big.txt", "/u/big.txt"] {
        let a = conn.get(path)?;
        check_eq(a.status, 200, "keep-alive status")?;
        check(a.body == good, || {
            format!("keep-alive {path}: body differs")
        })?;
    }
    Ok(())
}

fn failover_head_request() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    let a = n.request(0, "HEAD", "/", &[], b"")?;
    check_eq(a.status, 200, "status")?;
    check_eq(
        a.header("X-From"),
        Some("b01"),
        "header of the final upstream",
    )?;
    check(a.body.is_empty(), || {
        format!("HEAD answer has a body: {:?}", a.text())
    })?;
    check_path(&n, 0, "u01 -> u02 -> b01", "path")
}

fn failover_error_and_timeout_against_backend_codes() -> CaseResult {
    let hole = black_hole()?;
    let http = config(
        &[("dead", 9), ("u02", 2), ("u03", 3), ("u04", 4)],
        "upstream hole { server 127.0.0.1:HOLE; }
         upstrand e { upstream dead; upstream u02; upstream u03; order per_request; next_upstream_statuses error; }
         upstrand t { upstream hole; upstream u04; upstream u03; order per_request; next_upstream_statuses timeout; }",
        "proxy_read_timeout 300ms;
         location /e { proxy_pass http://$upstrand_e; }
         location /t { proxy_pass http://$upstrand_t; }",
        &[(2, "u02", 502), (3, "u03", 200), (4, "u04", 504)],
    )
    .replace("HOLE", &hole_port(&hole)?);
    let n = Nginx::start(&http)?;
    n.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    n.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    let a = n.get_on(0, "/e")?;
    check_eq(a.status, 502, "a backend's 502 is not `error`")?;
    check_eq(a.text().as_str(), "u02 502\n", "body")?;
    check_path(&n, 0, "dead -> u02", "path")?;
    let a = n.get_on(0, "/t")?;
    check_eq(a.status, 504, "a backend's 504 is not `timeout`")?;
    check_eq(a.text().as_str(), "u04 504\n", "body")?;
    check_path(&n, 1, "hole -> u04", "path")
}

/// A backend on `{Pi}` that reads the request body and answers `status` with
/// `"NAME METHOD BODY\n"`, logging the body to `logs/bodies.log`.
fn echo_backend(i: usize, name: &str, status: u16) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}}; access_log {{PREFIX}}/logs/bodies.log bodies; \
         location / {{ echo_read_request_body; \
         echo_status {status}; echo \"{name} $request_method $request_body\"; }} }}\n"
    )
}

fn failover_non_idempotent_post() -> CaseResult {
    let http = config(
        &[("u01", 1), ("u02", 2), ("u03", 3)],
        "upstrand plain { upstream u01; upstream u02; upstream u03; order per_request; next_upstream_statuses 503; }
         upstrand ni { upstream u01; upstream u02; upstream u03; order per_request; next_upstream_statuses 503 non_idempotent; }
         log_format bodies '$server_port $request_method $request_body';",
        "location /plain { proxy_pass http://$upstrand_plain; }
         location /ni { proxy_pass http://$upstrand_ni; }",
        &[],
    ) + &echo_backend(1, "u01", 503)
        + &echo_backend(2, "u02", 503)
        + &echo_backend(3, "u03", 200);
    let n = Nginx::start_with(ECHO, &http)?;
    let a = n.request(0, "POST", "/plain", &[], b"k=v1")?;
    check_eq(
        a.status,
        503,
        "a POST that reached a backend is not retried",
    )?;
    check_eq(a.text().as_str(), "u01 POST k=v1\n", "body")?;
    check_path(&n, 0, "u01", "path")?;
    let a = n.request(0, "POST", "/ni", &[], b"k=v2")?;
    check_eq(a.status, 200, "with non_idempotent")?;
    check_eq(
        a.text().as_str(),
        "u03 POST k=v2\n",
        "the body reached the last upstream",
    )?;
    check_eq(
        log_field(&n, 1, STATUS_FIELD)?.as_str(),
        "(u01) 503 (u02) 503 (u03) 200",
        "statuses",
    )?;
    // Every upstream the POST was retried on got its body.
    let want: Vec<String> = (1..=3)
        .map(|i| format!("{} POST k=v2", n.ports()[i]))
        .collect();
    wait_for_log(&n, "bodies.log", |text| {
        want.iter().all(|w| text.lines().any(|l| l == w))
    })
    .map_err(|text| format!("backend body log lacks {want:?}:\n{text}"))?;
    // GET moves on without non_idempotent.
    check_eq(
        n.get_on(0, "/plain")?.text().as_str(),
        "u03 GET \n",
        "GET body",
    )
}

// ---- 5. next_upstream_timeout and intercept_statuses ---------------------------------------

/// `hole` (a [`black_hole`]: 504 after 300 ms) then u02 (200), with `next_upstream_timeout
/// timeout` and the `intercept` line; `/failover` names the status it saw. Keep the listener
/// until the case ends.
fn timeout_config(timeout: &str, intercept: &str) -> Result<(String, TcpListener), Failed> {
    let hole = black_hole()?;
    let http = config(
        &[("u02", 2)],
        &format!(
            "upstream hole {{ server 127.0.0.1:HOLE; }}
             upstrand us1 {{ upstream hole; upstream u02; order per_request; \
             next_upstream_statuses 5xx; next_upstream_timeout {timeout}; {intercept} }}"
        ),
        "proxy_read_timeout 300ms;
         location / { proxy_pass http://$upstrand_us1; }
         location /failover { internal; return 200 \"failover after $status\\n\"; }",
        &[(2, "u02", 200)],
    )
    .replace("HOLE", &hole_port(&hole)?);
    Ok((http, hole))
}

fn next_upstream_timeout_returns_last_answer() -> CaseResult {
    let (http, _hole) = timeout_config("100ms", "")?;
    let n = Nginx::start(&http)?;
    n.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    check_eq(
        n.get_on(0, "/")?.status,
        504,
        "the timed-out answer is final",
    )?;
    check_path(&n, 0, "hole", "path")?;
    let (http, _hole) = timeout_config("10s", "")?;
    let n = Nginx::start(&http)?;
    n.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    check_eq(
        n.get_on(0, "/")?.status,
        200,
        "within the time the walk goes on",
    )?;
    check_path(&n, 0, "hole -> u02", "path")
}

fn intercept_after_timeout() -> CaseResult {
    let (http, _hole) = timeout_config("100ms", "intercept_statuses 504 /failover;")?;
    let n = Nginx::start(&http)?;
    n.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    let a = n.get_on(0, "/")?;
    check_eq(a.status, 200, "failover answer")?;
    check_eq(a.text().as_str(), "failover after 200\n", "failover body")?;
    check_eq(
        log_field(&n, 0, STATUS_FIELD)?.as_str(),
        "(hole) 504 (<intercepted>) -",
        "$upstrand_status",
    )
}

/// u01 (500) and u02 (503); 502 goes to `/first`, other 5xx to `/tf`, which reaches its answer
/// through `try_files` and `error_page`.
fn intercept_config() -> String {
    config(
        &[("u01", 1), ("u02", 2)],
        "upstrand us1 { upstream ~^u0; order per_request; next_upstream_statuses 5xx; \
         intercept_statuses 502 /first; intercept_statuses 5xx /tf; }",
        "location / { add_header X-Loc front always; proxy_pass http://$upstrand_us1; }
         location /first { internal; default_type text/x-first; return 503 \"first\\n\"; }
         location /tf { internal; try_files /nope @named; }
         location @named { error_page 404 = @page; return 404; }
         location @page { default_type text/x-page; return 503 \"via try_files and error_page\\n\"; }",
        &[(1, "u01", 500), (2, "u02", 503)],
    )
}

fn intercept_with_try_files_and_error_page() -> CaseResult {
    let n = Nginx::start(&intercept_config())?;
    let a = n.get_on(0, "/")?;
    check_eq(a.status, 503, "failover status")?;
    check_eq(
        a.text().as_str(),
        "via try_files and error_page\n",
        "failover body",
    )?;
    check_eq(
        a.header("Content-Type"),
        Some("text/x-page"),
        "failover content type",
    )?;
    check_eq(
        a.header("X-Loc"),
        Some("front"),
        "add_header of the upstrand location",
    )?;
    check_path(&n, 0, "u01 -> u02", "path")
}

fn intercept_first_matching_directive_wins() -> CaseResult {
    let n =
        Nginx::start(&intercept_config().replace("return 503 \"u02 503", "return 502 \"u02 502"))?;
    let a = n.get_on(0, "/")?;
    check_eq(
        a.text().as_str(),
        "first\n",
        "502 goes to the first directive",
    )?;
    check_eq(
        a.header("Content-Type"),
        Some("text/x-first"),
        "content type",
    )
}

// ---- 6. internal redirects, other subrequests, two upstrands ------------------------------

fn redirect_error_page_does_not_break_walk() -> CaseResult {
    let n = Nginx::start(&config(
        &[("dead", 9), ("u02", 2)],
        "upstrand us1 { upstream dead; upstream u02; order per_request; next_upstream_statuses error 503; }",
        "location / { error_page 502 503 /oops; proxy_intercept_errors on; proxy_pass http://$upstrand_us1; }
         location /oops { return 200 \"error page\\n\"; }",
        &[(2, "u02", 200)],
    ))?;
    n.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let a = n.get_on(0, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(a.text().as_str(), "u02 200\n", "the walk went on")?;
    check_path(&n, 0, "dead -> u02", "path")
}

fn redirect_x_accel_redirect_is_ignored() -> CaseResult {
    let http = config(
        &[("u01", 1), ("u02", 2)],
        "upstrand us1 { upstream ~^u0; order per_request; next_upstream_statuses 503; }",
        "location / { proxy_pass http://$upstrand_us1; }
         location /secret { return 200 \"redirected\\n\"; }",
        &[],
    ) + "server { listen 127.0.0.1:{P1}; location / { add_header X-Accel-Redirect /secret; return 503 \"u01 503\\n\"; } }
         server { listen 127.0.0.1:{P2}; location / { add_header X-Accel-Redirect /secret; return 200 \"u02 200\\n\"; } }";
    let n = Nginx::start(&http)?;
    let a = n.get_on(0, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(
        a.text().as_str(),
        "u02 200\n",
        "backend answer, not the redirect target",
    )?;
    check_path(&n, 0, "u01 -> u02", "path")
}

fn subrequest_ssi_inside_upstrand_request() -> CaseResult {
    let http = config(
        &[("u01", 1)],
        "upstrand us1 { upstream ~^u0; order per_request; next_upstream_statuses 503; }",
        "location / { ssi on; ssi_types text/plain; proxy_pass http://$upstrand_us1; }
         location /inc { return 200 \"included\"; }",
        &[],
    ) + "server { listen 127.0.0.1:{P1}; location / { return 200 \"[<!--# include virtual=\\\"/inc\\\" -->]\\n\"; } }";
    let n = Nginx::start(&http)?;
    check_answer(&n.get_on(0, "/")?, 200, "[included]\n")
}

/// An upstrand location included by SSI: the walk runs inside the SSI subrequest and its final
/// answer lands at the include's place.
fn subrequest_upstrand_walk_inside_ssi_include() -> CaseResult {
    let http = config(
        &[("u01", 1), ("u02", 2), ("b01", 3), ("page", 4)],
        "upstrand us1 { upstream ~^u0; upstream b01 backup; order per_request; next_upstream_statuses 5xx; }",
        "location / { ssi on; ssi_types text/plain; proxy_pass http://page; }
         location /us { proxy_pass http://$upstrand_us1; }",
        &[(1, "u01", 503), (2, "u02", 502), (3, "b01", 200)],
    ) + "server { listen 127.0.0.1:{P4}; location / { return 200 \"[<!--# include virtual=\\\"/us\\\" -->]\\n\"; } }";
    let n = Nginx::start(&http)?;
    for _ in 0..3 {
        let a = n.get_on(0, "/")?;
        check_eq(a.status, 200, "status")?;
        check_eq(a.text().as_str(), "[b01 200\n]\n", "included walk answer")?;
    }
    Ok(())
}

fn two_upstrands_in_one_request_give_500() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2)],
        "upstrand us1 { upstream u01; } upstrand us2 { upstream u02; }",
        "location /set { set $x $upstrand_us2; proxy_pass http://$upstrand_us1; }
         location /both { proxy_pass http://$upstrand_us1$upstrand_us2; }",
        &[(1, "u01", 200), (2, "u02", 200)],
    ))?;
    n.expect_log("accessing multiple upstrand variables in a single request is prohibited");
    n.expect_log("invalid URL prefix in \"http://\"");
    check_eq(n.get_on(0, "/set")?.status, 500, "set + proxy_pass")?;
    check_eq(
        n.get_on(0, "/both")?.status,
        500,
        "two variables in proxy_pass",
    )?;
    let log = n.error_log();
    check(
        log.contains("accessing multiple upstrand variables in a single request is prohibited"),
        || format!("error log lacks the message:\n{log}"),
    )
}

/// Decision 8: a walk longer than nginx's subrequest nesting limit (50) ends with nginx's own
/// error in the log; the client gets the last answer.
fn walk_longer_than_subrequest_limit() -> CaseResult {
    let ups: String = (0..60)
        .map(|i| format!("upstream m{i:02} {{ server 127.0.0.1:{{P1}}; }}\n"))
        .collect();
    let n = Nginx::start(&config(
        &[],
        &(ups + "upstrand many { upstream ~^m; order per_request; next_upstream_statuses 503; }"),
        "location / { proxy_pass http://$upstrand_many; }",
        &[(1, "m", 503)],
    ))?;
    n.expect_log("subrequests cycle while processing \"/\"");
    check_answer(&n.get_on(0, "/")?, 503, "m 503\n")?;
    let walked = path_of(&n, 0)?.split(" -> ").count();
    check(walked > 40 && walked < 60, || {
        format!("{walked} upstreams walked")
    })?;
    let log = n.error_log();
    check(log.contains("subrequests cycle"), || {
        format!("error log lacks nginx's subrequest limit error:\n{log}")
    })
}

// ---- 7. status variables ------------------------------------------------------------------

fn status_variables_format() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    n.get_on(0, "/")?;
    let lines = access_log(&n, 1)?;
    let f: Vec<&str> = lines[0].split('|').collect();
    check_eq(f.len(), 10, "fields")?;
    let (p1, p2, p3) = (n.ports()[1], n.ports()[2], n.ports()[3]);
    check_eq(f[2], "u01 -> u02 -> b01", "$upstrand_path")?;
    check_eq(
        f[3].to_string(),
        format!("(u01) 127.0.0.1:{p1} (u02) 127.0.0.1:{p2} (b01) 127.0.0.1:{p3}"),
        "$upstrand_addr",
    )?;
    check_eq(f[4], "(u01) 503 (u02) 502 (b01) 200", "$upstrand_status")?;
    check_eq(f[5], "(u01) - (u02) - (b01) -", "$upstrand_cache_status")?;
    check_eq(f[8], "(u01) 8 (u02) 8 (b01) 8", "$upstrand_response_length")?;
    for (i, name) in [
        (6, "connect_time"),
        (7, "header_time"),
        (9, "response_time"),
    ] {
        let parts: Vec<&str> = f[i].split(' ').collect();
        check(
            parts.len() == 6
                && parts[0] == "(u01)"
                && parts[2] == "(u02)"
                && parts[4] == "(b01)"
                && [1, 3, 5].iter().all(|j| parts[*j].parse::<f64>().is_ok()),
            || format!("$upstrand_{name}: {}", f[i]),
        )?;
    }
    Ok(())
}

fn status_variables_outside_upstrand_are_not_found() -> CaseResult {
    let n = Nginx::start(&front("location / { return 200 \"plain\\n\"; }"))?;
    n.get_on(0, "/")?;
    let lines = access_log(&n, 1)?;
    check_eq(lines[0].as_str(), "/|200|-|-|-|-|-|-|-|-", "log line")
}

// ---- 8. dynamic_upstrand ------------------------------------------------------------------

/// Every row of the seed's worked example (u0x fail, so the backup names the upstrand).
fn dynamic_upstrand_seed_example() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2), ("b01", 3), ("b02", 4)],
        "upstrand us1 { upstream ~^u0; upstream b01 backup; order start_random; next_upstream_statuses 5xx; }
         upstrand us2 { upstream ~^u0; upstream b02 backup; order start_random; next_upstream_statuses 5xx; }",
        "dynamic_upstrand $dus1 $arg_a us2;
         location / {
             dynamic_upstrand $dus2 $arg_b;
             if ($arg_b) {
                 proxy_pass http://$dus2;
                 break;
             }
             proxy_pass http://$dus1;
         }",
        &[(1, "u01", 503), (2, "u02", 503), (3, "b01", 200), (4, "b02", 200)],
    ))?;
    n.expect_log("invalid URL prefix in \"http://\"");
    let rows: &[(&str, u16, Option<&str>)] = &[
        ("/", 200, Some("b02")),
        ("/?a=us1", 200, Some("b01")),
        ("/?a=US1", 200, Some("b01")),
        ("/?a=us2", 200, Some("b02")),
        ("/?a=nope", 500, None),
        ("/?a=addr", 500, None),
        ("/?b=us1", 200, Some("b01")),
        ("/?b=us2&a=us1", 200, Some("b02")),
        ("/?b=nope", 500, None),
        ("/?b=nope&a=us1", 500, None),
        ("/?b=&a=us1", 200, Some("b01")),
        ("/?a=&b=", 200, Some("b02")),
    ];
    for (path, status, from) in rows {
        let a = n.get_on(0, path)?;
        check_eq(a.status, *status, &format!("status of {path}"))?;
        if let Some(f) = from {
            check_eq(a.header("X-From"), Some(*f), &format!("answer of {path}"))?;
        }
    }
    Ok(())
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
