//! Failover: the walk moves on after a listed status, the last answer is delivered, through
//! gzip, chunked and unbuffered answers, large bodies, HEAD, errors and timeouts, and POST.

use super::*;

// ---- 2. failover --------------------------------------------------------------------------

/// u01, u02 and the backup b01 answering `s1`, `s2`, `s3`; `order per_request`.
pub(super) fn three_and_backup(
    location_extra: &str,
    statuses: &str,
    s1: u16,
    s2: u16,
    s3: u16,
) -> String {
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

pub(super) fn failover_normal_then_backup_cycle() -> CaseResult {
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

pub(super) fn failover_last_answer_is_delivered() -> CaseResult {
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

pub(super) fn failover_first_unlisted_answer_stops() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 404, 502, 200))?;
    check_answer(&n.get_on(0, "/")?, 404, "u01 404\n")?;
    check_path(&n, 0, "u01", "path")
}

pub(super) fn failover_4xx_and_exact_codes() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "4xx 204", 404, 204, 200))?;
    check_eq(n.get_on(0, "/")?.status, 200, "status")?;
    check_path(&n, 0, "u01 -> u02 -> b01", "path")?;
    let n = Nginx::start(&three_and_backup("", "204", 404, 204, 200))?;
    check_eq(n.get_on(0, "/")?.status, 404, "404 is not listed")?;
    check_path(&n, 0, "u01", "path")
}

pub(super) fn gunzip(data: &[u8]) -> Result<Vec<u8>, Failed> {
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

pub(super) fn failover_through_gzip_and_chunked() -> CaseResult {
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

pub(super) fn failover_with_proxy_buffering_off() -> CaseResult {
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

pub(super) fn big_body(seed: u8) -> Vec<u8> {
    (0..1024 * 1024)
        .map(|i: usize| b'a' + ((i * 7 + usize::from(seed)) % 26) as u8)
        .collect()
}

/// 1 MiB error body swallowed, 1 MiB answer delivered; buffered (to a temp file) and unbuffered.
pub(super) fn failover_one_mebibyte_bodies() -> CaseResult {
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

pub(super) fn failover_head_request() -> CaseResult {
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

pub(super) fn failover_error_and_timeout_against_backend_codes() -> CaseResult {
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
pub(super) fn echo_backend(i: usize, name: &str, status: u16) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}}; access_log {{PREFIX}}/logs/bodies.log bodies; \
         location / {{ echo_read_request_body; \
         echo_status {status}; echo \"{name} $request_method $request_body\"; }} }}\n"
    )
}

pub(super) fn failover_non_idempotent_post() -> CaseResult {
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
