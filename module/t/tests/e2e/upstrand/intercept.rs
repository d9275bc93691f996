//! `next_upstream_timeout` and `intercept_statuses`, internal redirects, other subrequests and
//! two upstrands in one request.

use super::*;

// ---- 5. next_upstream_timeout and intercept_statuses ---------------------------------------

/// `hole` (a [`black_hole`]: 504 after 300 ms) then u02 (200), with `next_upstream_timeout
/// timeout` and the `intercept` line; `/failover` names the status it saw. Keep the listener
/// until the case ends.
pub(super) fn timeout_config(
    timeout: &str,
    intercept: &str,
) -> Result<(String, TcpListener), Failed> {
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

pub(super) fn next_upstream_timeout_returns_last_answer() -> CaseResult {
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

pub(super) fn intercept_after_timeout() -> CaseResult {
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
pub(super) fn intercept_config() -> String {
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

pub(super) fn intercept_with_try_files_and_error_page() -> CaseResult {
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

pub(super) fn intercept_first_matching_directive_wins() -> CaseResult {
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

pub(super) fn redirect_error_page_does_not_break_walk() -> CaseResult {
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

pub(super) fn redirect_x_accel_redirect_is_ignored() -> CaseResult {
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

pub(super) fn subrequest_ssi_inside_upstrand_request() -> CaseResult {
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
pub(super) fn subrequest_upstrand_walk_inside_ssi_include() -> CaseResult {
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

pub(super) fn two_upstrands_in_one_request_give_500() -> CaseResult {
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
pub(super) fn walk_longer_than_subrequest_limit() -> CaseResult {
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
