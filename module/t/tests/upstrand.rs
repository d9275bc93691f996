//! Cases for `upstrand`, `$upstrand_NAME`, the status variables and `dynamic_upstrand` (issue 4)
//! against Debian's nginx with the module loaded. Every row is a named test; run directly it ends
//! with `N passed, N failed`.
//!
//! Layout of the configurations: the front server listens on `{P0}`; backends are `server {}`
//! blocks of the same nginx on `{P1}`…`{P8}`; `{P9}` is a free port nobody listens on (a
//! connection there is refused: an nginx-generated 502). Some cases add a "black hole" (a
//! listening socket of the test that never answers: an nginx-generated 504 after
//! `proxy_read_timeout`). Paths walked are read from an access log with `$upstrand_path`.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ngx_harness::{
    check, check_eq, emerg_trial, expect_ok, run_tests, CaseResult, Failed, Nginx, Trial,
};

/// Loads the Debian echo module (for backends that read and echo a request body).
const ECHO: &str = "load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;";

/// `log_format` with every variable of the family.
const LOG_FORMAT: &str = "log_format us '$request_uri|$status|$upstrand_path|$upstrand_addr|\
$upstrand_status|$upstrand_cache_status|$upstrand_connect_time|$upstrand_header_time|\
$upstrand_response_length|$upstrand_response_time';";

// ---- a small HTTP/1.1 client (chunked answers, request bodies, raw body bytes) ----------------

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Sends one HTTP/1.1 request (`Connection: close`) and reads the whole answer.
fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, Failed> {
    let mut s =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect {port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read from {port}: {e}"))?;
    let bad = || format!("bad HTTP answer: {:?}", String::from_utf8_lossy(&raw));
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(bad)?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body).ok_or_else(|| format!("bad chunked body in {}", bad()))?;
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// Reads one answer with a `Content-Length` from a keep-alive connection.
fn read_answer(s: &mut TcpStream) -> Result<Answer, Failed> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).map_err(|e| format!("read: {e}"))?;
        check(n == 1, || format!("connection closed after {head:?}"))?;
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|x| x.parse().ok())
        .ok_or_else(|| format!("bad status line in {text:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| format!("no Content-Length in {text:?}"))?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .map_err(|e| format!("read body: {e}"))?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn get(n: &Nginx, path: &str) -> Result<Answer, Failed> {
    request(n.port(0), "GET", path, &[], b"")
}

/// Lines of `logs/access.log` once it has at least `count` of them (nginx logs a request after
/// the client may already have its answer, so wait up to 10 s).
fn access_log(n: &Nginx, count: usize) -> Result<Vec<String>, Failed> {
    let path = n.prefix().join("logs/access.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= count {
            return Ok(lines);
        }
        if Instant::now() > deadline {
            return Err(
                format!("access log has {} lines, want {count}: {text}", lines.len()).into(),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `$upstrand_path` field of access log line `i` (format [`LOG_FORMAT`]).
fn path_of(n: &Nginx, i: usize) -> Result<String, Failed> {
    let lines = access_log(n, i + 1)?;
    Ok(lines[i].split('|').nth(2).unwrap_or_default().to_string())
}

/// A listening socket that never accepts: connections succeed, answers never come.
fn black_hole() -> Result<TcpListener, Failed> {
    Ok(TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?)
}

fn hole_port(l: &TcpListener) -> Result<String, Failed> {
    Ok(l.local_addr()
        .map_err(|e| e.to_string())?
        .port()
        .to_string())
}

/// The front server: `{P0}` with the access log, then `body`.
fn front(body: &str) -> String {
    format!(
        "{LOG_FORMAT}\nserver {{ listen 127.0.0.1:{{P0}}; access_log {{PREFIX}}/logs/access.log us;\n{body}\n}}\n"
    )
}

/// A backend on `{Pi}` answering `status` with body `"NAME STATUS\n"` and `X-From: NAME`.
fn backend(i: usize, name: &str, status: u16) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}}; location / {{ add_header X-From {name} always; \
         return {status} \"{name} {status}\\n\"; }} }}\n"
    )
}

/// `upstream NAME { server 127.0.0.1:{Pi}; }`
fn upstream(name: &str, i: usize) -> String {
    format!("upstream {name} {{ server 127.0.0.1:{{P{i}}}; }}\n")
}

// ---- 1. parsing ---------------------------------------------------------------------------

const U: &str = "upstream u01 { server 127.0.0.1:{P1}; } upstream u02 { server 127.0.0.1:{P2}; } ";

fn emerg_cases() -> Vec<Trial> {
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
            emerg_trial(name, http, want)
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
fn regex_members_include_singlets() -> CaseResult {
    let http = format!(
        "upstream u1 {{ server 127.0.0.1:{{P1}}; server 127.0.0.1:{{P2}}; \
         combine_server_singlets _single_ nobackup; }}
         upstrand us1 {{ upstream ~^u1_single_; order per_request; next_upstream_statuses 5xx; }}
         {}{}{}",
        front("location / { proxy_pass http://$upstrand_us1; }"),
        backend(1, "s1", 503),
        backend(2, "s2", 200),
    );
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(a.text(), "s2 200\n".to_string(), "body")?;
    check_eq(
        path_of(&n, 0)?,
        "u1_single_1 -> u1_single_2".to_string(),
        "path",
    )
}

// ---- 2. failover --------------------------------------------------------------------------

fn three_and_backup(location_extra: &str, statuses: &str, s1: u16, s2: u16, s3: u16) -> String {
    format!(
        "{}{}{}
         upstrand us1 {{ upstream ~^u0; upstream b01 backup; order per_request; next_upstream_statuses {statuses}; }}
         {}{}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        upstream("b01", 3),
        "",
        front(&format!(
            "location / {{ {location_extra} add_header X-Loc front; proxy_pass http://$upstrand_us1; }}"
        )),
        backend(1, "u01", s1),
        backend(2, "u02", s2),
        backend(3, "b01", s3),
    )
}

fn failover_normal_then_backup_cycle() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    let a = get(&n, "/x?q=1")?;
    check_eq(a.status, 200, "status")?;
    check_eq(a.text(), "b01 200\n".to_string(), "body")?;
    check_eq(a.header("X-From"), Some("b01"), "backend header")?;
    check_eq(
        a.header("X-Loc"),
        Some("front"),
        "add_header of the location",
    )?;
    check_eq(path_of(&n, 0)?, "u01 -> u02 -> b01".to_string(), "path")
}

fn failover_last_answer_is_delivered() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 504))?;
    let a = get(&n, "/")?;
    check_eq(a.status, 504, "status of the last upstream")?;
    check_eq(
        a.text(),
        "b01 504\n".to_string(),
        "body of the last upstream",
    )?;
    check_eq(
        a.header("X-From"),
        Some("b01"),
        "header of the last upstream",
    )?;
    check_eq(path_of(&n, 0)?, "u01 -> u02 -> b01".to_string(), "path")
}

fn failover_first_unlisted_answer_stops() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 404, 502, 200))?;
    let a = get(&n, "/")?;
    check_eq(a.status, 404, "status")?;
    check_eq(a.text(), "u01 404\n".to_string(), "body")?;
    check_eq(path_of(&n, 0)?, "u01".to_string(), "path")
}

fn failover_4xx_and_exact_codes() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "4xx 204", 404, 204, 200))?;
    let a = get(&n, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(path_of(&n, 0)?, "u01 -> u02 -> b01".to_string(), "path")?;
    let n = Nginx::start(&three_and_backup("", "204", 404, 204, 200))?;
    let a = get(&n, "/")?;
    check_eq(a.status, 404, "404 is not listed")?;
    check_eq(path_of(&n, 0)?, "u01".to_string(), "path")
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
    let a = request(n.port(0), "GET", "/", &[("Accept-Encoding", "gzip")], b"")?;
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
        let a = get(&n, "/")?;
        check_eq(a.status, 200, "status")?;
        check_eq(a.text(), "b01 200\n".to_string(), "body")?;
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
    let http = format!(
        "{}{}
         upstrand us1 {{ upstream u01; upstream u02; order per_request; next_upstream_statuses 503; }}
         {}
         server {{ listen 127.0.0.1:{{P1}}; root {{PREFIX}}/html; location / {{ error_page 503 /err.txt; return 503; }} location = /err.txt {{ internal; }} }}
         server {{ listen 127.0.0.1:{{P2}}; root {{PREFIX}}/html; }}",
        upstream("u01", 1),
        upstream("u02", 2),
        front(
            "location /b/ { proxy_pass http://$upstrand_us1; }
             location /u/ { proxy_buffering off; proxy_pass http://$upstrand_us1; }"
        ),
    );
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
        let a = get(&n, path)?;
        check_eq(a.status, 200, "status")?;
        check(a.body == good, || {
            format!("{path}: body of {} bytes differs", a.body.len())
        })?;
        check_eq(path_of(&n, i)?, "u01 -> u02".to_string(), "path")?;
    }
    // The swallowed 1 MiB error bodies must not stall a keep-alive connection.
    let mut s = TcpStream::connect(("127.0.0.1", n.port(0))).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    for path in ["/b/big.txt", "/u/big.txt", "/b/big.txt", "/u/big.txt"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let a = read_answer(&mut s)?;
        check_eq(a.status, 200, "keep-alive status")?;
        check(a.body == good, || {
            format!("keep-alive {path}: body differs")
        })?;
    }
    Ok(())
}

fn failover_head_request() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    let a = request(n.port(0), "HEAD", "/", &[], b"")?;
    check_eq(a.status, 200, "status")?;
    check_eq(
        a.header("X-From"),
        Some("b01"),
        "header of the final upstream",
    )?;
    check(a.body.is_empty(), || {
        format!("HEAD answer has a body: {:?}", a.text())
    })?;
    check_eq(path_of(&n, 0)?, "u01 -> u02 -> b01".to_string(), "path")
}

fn failover_error_and_timeout_against_backend_codes() -> CaseResult {
    let hole = black_hole()?;
    let http = format!(
        "upstream dead {{ server 127.0.0.1:{{P9}}; }} upstream hole {{ server 127.0.0.1:HOLE; }}
         {}{}
         upstrand e {{ upstream dead; upstream u02; upstream u03; order per_request; next_upstream_statuses error; }}
         upstrand t {{ upstream hole; upstream u04; upstream u03; order per_request; next_upstream_statuses timeout; }}
         {}{}{}{}",
        upstream("u02", 2) + &upstream("u03", 3),
        upstream("u04", 4),
        front(
            "proxy_read_timeout 300ms;
             location /e { proxy_pass http://$upstrand_e; }
             location /t { proxy_pass http://$upstrand_t; }"
        ),
        backend(2, "u02", 502),
        backend(3, "u03", 200),
        backend(4, "u04", 504),
    )
    .replace("HOLE", &hole_port(&hole)?);
    let n = Nginx::start(&http)?;
    let a = get(&n, "/e")?;
    check_eq(a.status, 502, "a backend's 502 is not `error`")?;
    check_eq(a.text(), "u02 502\n".to_string(), "body")?;
    check_eq(path_of(&n, 0)?, "dead -> u02".to_string(), "path")?;
    let a = get(&n, "/t")?;
    check_eq(a.status, 504, "a backend's 504 is not `timeout`")?;
    check_eq(a.text(), "u04 504\n".to_string(), "body")?;
    check_eq(path_of(&n, 1)?, "hole -> u04".to_string(), "path")
}

fn echo_backend(i: usize, name: &str, status: u16) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}}; access_log {{PREFIX}}/logs/bodies.log bodies; \
         location / {{ echo_read_request_body; \
         echo_status {status}; echo \"{name} $request_method $request_body\"; }} }}\n"
    )
}

fn non_idempotent_post() -> CaseResult {
    let http = format!(
        "{}{}
         upstrand plain {{ upstream u01; upstream u02; upstream u03; order per_request; next_upstream_statuses 503; }}
         upstrand ni {{ upstream u01; upstream u02; upstream u03; order per_request; next_upstream_statuses 503 non_idempotent; }}
         {}{}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        upstream("u03", 3),
        front(
            "location /plain { proxy_pass http://$upstrand_plain; }
             location /ni { proxy_pass http://$upstrand_ni; }"
        ) + "log_format bodies '$server_port $request_method $request_body';\n",
        echo_backend(1, "u01", 503),
        echo_backend(2, "u02", 503),
        echo_backend(3, "u03", 200),
    );
    let n = Nginx::start_with(ECHO, &http)?;
    let a = request(n.port(0), "POST", "/plain", &[], b"k=v1")?;
    check_eq(
        a.status,
        503,
        "a POST that reached a backend is not retried",
    )?;
    check_eq(a.text(), "u01 POST k=v1\n".to_string(), "body")?;
    check_eq(path_of(&n, 0)?, "u01".to_string(), "path")?;
    let a = request(n.port(0), "POST", "/ni", &[], b"k=v2")?;
    check_eq(a.status, 200, "with non_idempotent")?;
    check_eq(
        a.text(),
        "u03 POST k=v2\n".to_string(),
        "the body reached the last upstream",
    )?;
    let lines = access_log(&n, 2)?;
    let status_field = lines[1].split('|').nth(4).unwrap_or_default().to_string();
    check_eq(
        status_field,
        "(u01) 503 (u02) 503 (u03) 200".to_string(),
        "statuses",
    )?;
    // Every upstream the POST was retried on got its body.
    let bodies_path = n.prefix().join("logs/bodies.log");
    let want: Vec<String> = (1..=3)
        .map(|i| format!("{} POST k=v2", n.port(i)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&bodies_path).unwrap_or_default();
        if want.iter().all(|w| text.lines().any(|l| l == w)) {
            break;
        }
        check(Instant::now() < deadline, || {
            format!("backend body log lacks {want:?}:\n{text}")
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    // GET moves on without non_idempotent.
    let a = get(&n, "/plain")?;
    check_eq(a.text(), "u03 GET \n".to_string(), "GET body")
}

// ---- 3. order -----------------------------------------------------------------------------

fn ordered(order: &str, s: [u16; 3]) -> String {
    format!(
        "{}{}
         upstrand us1 {{ upstream ~^u0; {order} next_upstream_statuses 5xx; }}
         {}{}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        upstream("u03", 3),
        front("location / { proxy_pass http://$upstrand_us1; }"),
        backend(1, "u01", s[0]),
        backend(2, "u02", s[1]),
        backend(3, "u03", s[2]),
    )
}

fn from_sequence(n: &Nginx, count: usize) -> Result<Vec<String>, Failed> {
    let mut v = Vec::new();
    for _ in 0..count {
        let a = get(n, "/")?;
        v.push(a.header("X-From").unwrap_or("-").to_string());
    }
    Ok(v)
}

fn order_default_round_robin() -> CaseResult {
    let n = Nginx::start(&ordered("", [200, 200, 200]))?;
    let seq = from_sequence(&n, 7)?;
    check_eq(
        seq.join(","),
        "u01,u02,u03,u01,u02,u03,u01".to_string(),
        "one step per request",
    )?;
    // Failover does not move the cursor more than one step per request.
    let n = Nginx::start(&ordered("", [503, 200, 200]))?;
    let seq = from_sequence(&n, 4)?;
    check_eq(
        seq.join(","),
        "u02,u02,u03,u02".to_string(),
        "starts u01,u02,u03,u01",
    )?;
    check_eq(path_of(&n, 0)?, "u01 -> u02".to_string(), "path 1")?;
    check_eq(path_of(&n, 2)?, "u03".to_string(), "path 3")
}

fn rotation_ok(seq: &[String]) -> bool {
    let idx = |s: &str| ["u01", "u02", "u03"].iter().position(|x| *x == s);
    seq.windows(2).all(|w| match (idx(&w[0]), idx(&w[1])) {
        (Some(a), Some(b)) => b == (a + 1) % 3,
        _ => false,
    })
}

fn order_start_random() -> CaseResult {
    let n = Nginx::start(&ordered("order start_random;", [200, 200, 200]))?;
    let seq = from_sequence(&n, 9)?;
    check(rotation_ok(&seq), || {
        format!("round robin after a random start: {seq:?}")
    })
}

fn order_per_request() -> CaseResult {
    let n = Nginx::start(&ordered("order per_request;", [503, 503, 200]))?;
    for i in 0..3 {
        let a = get(&n, "/")?;
        check_eq(a.header("X-From"), Some("u03"), "answer")?;
        check_eq(path_of(&n, i)?, "u01 -> u02 -> u03".to_string(), "path")?;
    }
    Ok(())
}

fn order_start_random_per_request() -> CaseResult {
    let n = Nginx::start(&ordered("order start_random per_request;", [503, 503, 503]))?;
    let mut starts = std::collections::BTreeSet::new();
    for i in 0..30 {
        get(&n, "/")?;
        let p = path_of(&n, i)?;
        let walked: Vec<String> = p.split(" -> ").map(str::to_string).collect();
        check(walked.len() == 3 && rotation_ok(&walked), || {
            format!("walk {p}")
        })?;
        starts.insert(walked[0].clone());
    }
    check(starts.len() >= 2, || {
        format!("30 random starts all at {starts:?}")
    })
}

/// The seed's "no round robin" example: singlets, `order per_request`, blacklisting.
fn order_seed_no_round_robin_with_singlets() -> CaseResult {
    let body = |first: &str| {
        format!(
            "upstream u1 {{ server 127.0.0.1:{{{first}}}; server 127.0.0.1:{{P2}}; \
             combine_server_singlets _single_ nobackup; }}
             upstrand us1 {{
                 upstream ~^u1_single_ blacklist_interval=60s;
                 order per_request;
                 next_upstream_statuses error timeout non_idempotent 5xx;
                 intercept_statuses 5xx /Internal/failover;
             }}
             {}{}{}",
            front(
                "location / { proxy_pass http://$upstrand_us1; }
                 location /Internal/failover { internal; return 503 \"failover\\n\"; }"
            ),
            backend(1, "s1", 200),
            backend(2, "s2", 200),
        )
    };
    let n = Nginx::start(&body("P1"))?;
    for i in 0..3 {
        check_eq(
            get(&n, "/")?.header("X-From").map(str::to_string),
            Some("s1".into()),
            "s1",
        )?;
        check_eq(
            path_of(&n, i)?,
            "u1_single_1".to_string(),
            "always the first server",
        )?;
    }
    let n = Nginx::start(&body("P9"))?;
    check_eq(
        get(&n, "/")?.header("X-From").map(str::to_string),
        Some("s2".into()),
        "s2",
    )?;
    check_eq(
        path_of(&n, 0)?,
        "u1_single_1 -> u1_single_2".to_string(),
        "failover",
    )?;
    check_eq(
        get(&n, "/")?.header("X-From").map(str::to_string),
        Some("s2".into()),
        "s2",
    )?;
    check_eq(
        path_of(&n, 1)?,
        "u1_single_2".to_string(),
        "the dead singlet is blacklisted",
    )
}

// ---- 4. blacklist -------------------------------------------------------------------------

fn blacklist_skips_failed_upstream_until_interval_ends() -> CaseResult {
    let http = format!(
        "{}{}
         upstrand us1 {{ upstream u01 blacklist_interval=1s; upstream u02; upstream u03; order per_request; next_upstream_statuses 5xx; }}
         {}{}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        upstream("u03", 3),
        front("location / { proxy_pass http://$upstrand_us1; }"),
        backend(1, "u01", 503),
        backend(2, "u02", 200),
        backend(3, "u03", 200),
    );
    let n = Nginx::start(&http)?;
    get(&n, "/")?;
    check_eq(path_of(&n, 0)?, "u01 -> u02".to_string(), "first request")?;
    get(&n, "/")?;
    check_eq(
        path_of(&n, 1)?,
        "u02".to_string(),
        "u01 skipped while blacklisted",
    )?;
    std::thread::sleep(Duration::from_millis(1300));
    get(&n, "/")?;
    check_eq(
        path_of(&n, 2)?,
        "u01 -> u02".to_string(),
        "u01 tried again after the interval",
    )
}

/// Decision 1: the first non-blacklisted upstream in cycle order, not the one before it.
fn blacklist_goes_to_first_healthy_in_cycle_order() -> CaseResult {
    let n = Nginx::start(
        &ordered("order per_request;", [503, 503, 200])
            .replace("upstream ~^u0;", "upstream ~^u0 blacklist_interval=60s;"),
    )?;
    get(&n, "/")?;
    check_eq(
        path_of(&n, 0)?,
        "u01 -> u02 -> u03".to_string(),
        "first request",
    )?;
    let a = get(&n, "/")?;
    check_eq(a.header("X-From"), Some("u03"), "answer")?;
    check_eq(
        path_of(&n, 1)?,
        "u03".to_string(),
        "both failed upstreams skipped",
    )
}

fn blacklist_everything_whitelists_with_log() -> CaseResult {
    let n = Nginx::start(
        &ordered("order per_request;", [503, 503, 503])
            .replace("upstream ~^u0;", "upstream ~^u0 blacklist_interval=60s;"),
    )?;
    get(&n, "/")?;
    let a = get(&n, "/")?;
    check_eq(a.status, 503, "status")?;
    check_eq(
        path_of(&n, 1)?,
        "u01 -> u02 -> u03".to_string(),
        "all whitelisted again",
    )?;
    let log = n.error_log();
    check(
        log.contains("[error]")
            && log.contains("all upstreams in upstrand \"us1\" are blacklisted, whitelisting them"),
        || format!("error log lacks the whitelist line:\n{log}"),
    )
}

// ---- 5. next_upstream_timeout and intercept_statuses ---------------------------------------

fn timeout_config(timeout: &str, intercept: &str) -> Result<(String, TcpListener), Failed> {
    let hole = black_hole()?;
    let http = format!(
        "upstream hole {{ server 127.0.0.1:HOLE; }} {}
         upstrand us1 {{ upstream hole; upstream u02; order per_request; next_upstream_statuses 5xx; next_upstream_timeout {timeout}; {intercept} }}
         {}{}",
        upstream("u02", 2),
        front(
            "proxy_read_timeout 300ms;
             location / { proxy_pass http://$upstrand_us1; }
             location /failover { internal; return 200 \"failover after $status\\n\"; }"
        ),
        backend(2, "u02", 200),
    )
    .replace("HOLE", &hole_port(&hole)?);
    Ok((http, hole))
}

fn next_upstream_timeout_returns_last_answer() -> CaseResult {
    let (http, _hole) = timeout_config("100ms", "")?;
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 504, "the timed-out answer is final")?;
    check_eq(path_of(&n, 0)?, "hole".to_string(), "path")?;
    let (http, _hole) = timeout_config("10s", "")?;
    let n = Nginx::start(&http)?;
    check_eq(
        get(&n, "/")?.status,
        200,
        "within the time the walk goes on",
    )?;
    check_eq(path_of(&n, 0)?, "hole -> u02".to_string(), "path")
}

fn intercept_after_timeout() -> CaseResult {
    let (http, _hole) = timeout_config("100ms", "intercept_statuses 504 /failover;")?;
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 200, "failover answer")?;
    check_eq(
        a.text(),
        "failover after 200\n".to_string(),
        "failover body",
    )?;
    let lines = access_log(&n, 1)?;
    let st = lines[0].split('|').nth(4).unwrap_or_default().to_string();
    check_eq(
        st,
        "(hole) 504 (<intercepted>) -".to_string(),
        "$upstrand_status",
    )
}

fn intercept_config() -> String {
    format!(
        "{}
         upstrand us1 {{ upstream ~^u0; order per_request; next_upstream_statuses 5xx; intercept_statuses 502 /first; intercept_statuses 5xx /tf; }}
         {}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        front(
            "location / { add_header X-Loc front always; proxy_pass http://$upstrand_us1; }
             location /first { internal; default_type text/x-first; return 503 \"first\\n\"; }
             location /tf { internal; try_files /nope @named; }
             location @named { error_page 404 = @page; return 404; }
             location @page { default_type text/x-page; return 503 \"via try_files and error_page\\n\"; }"
        ),
        backend(1, "u01", 500),
        backend(2, "u02", 503),
    )
}

fn intercept_with_try_files_and_error_page() -> CaseResult {
    let n = Nginx::start(&intercept_config())?;
    let a = get(&n, "/")?;
    check_eq(a.status, 503, "failover status")?;
    check_eq(
        a.text(),
        "via try_files and error_page\n".to_string(),
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
    check_eq(path_of(&n, 0)?, "u01 -> u02".to_string(), "path")
}

fn intercept_first_matching_directive_wins() -> CaseResult {
    let n =
        Nginx::start(&intercept_config().replace("return 503 \"u02 503", "return 502 \"u02 502"))?;
    let a = get(&n, "/")?;
    check_eq(
        a.text(),
        "first\n".to_string(),
        "502 goes to the first directive",
    )?;
    check_eq(
        a.header("Content-Type"),
        Some("text/x-first"),
        "content type",
    )
}

// ---- 6. internal redirects, other subrequests, two upstrands ------------------------------

fn error_page_does_not_break_walk() -> CaseResult {
    let http = format!(
        "upstream dead {{ server 127.0.0.1:{{P9}}; }} {}
         upstrand us1 {{ upstream dead; upstream u02; order per_request; next_upstream_statuses error 503; }}
         {}{}",
        upstream("u02", 2),
        front(
            "location / { error_page 502 503 /oops; proxy_intercept_errors on; proxy_pass http://$upstrand_us1; }
             location /oops { return 200 \"error page\\n\"; }"
        ),
        backend(2, "u02", 200),
    );
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(a.text(), "u02 200\n".to_string(), "the walk went on")?;
    check_eq(path_of(&n, 0)?, "dead -> u02".to_string(), "path")
}

fn x_accel_redirect_is_ignored() -> CaseResult {
    let http = format!(
        "{}
         upstrand us1 {{ upstream ~^u0; order per_request; next_upstream_statuses 503; }}
         {}
         server {{ listen 127.0.0.1:{{P1}}; location / {{ add_header X-Accel-Redirect /secret; return 503 \"u01 503\\n\"; }} }}
         server {{ listen 127.0.0.1:{{P2}}; location / {{ add_header X-Accel-Redirect /secret; return 200 \"u02 200\\n\"; }} }}",
        upstream("u01", 1) + &upstream("u02", 2),
        front(
            "location / { proxy_pass http://$upstrand_us1; }
             location /secret { return 200 \"redirected\\n\"; }"
        ),
    );
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(
        a.text(),
        "u02 200\n".to_string(),
        "backend answer, not the redirect target",
    )?;
    check_eq(path_of(&n, 0)?, "u01 -> u02".to_string(), "path")
}

fn ssi_subrequest_inside_upstrand_request() -> CaseResult {
    let http = format!(
        "{}
         upstrand us1 {{ upstream ~^u0; order per_request; next_upstream_statuses 503; }}
         {}
         server {{ listen 127.0.0.1:{{P1}}; location / {{ return 200 \"[<!--# include virtual=\\\"/inc\\\" -->]\\n\"; }} }}",
        upstream("u01", 1),
        front(
            "location / { ssi on; ssi_types text/plain; proxy_pass http://$upstrand_us1; }
             location /inc { return 200 \"included\"; }"
        ),
    );
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 200, "status")?;
    check_eq(a.text(), "[included]\n".to_string(), "SSI include ran")
}

fn two_upstrands_in_one_request_give_500() -> CaseResult {
    let http = format!(
        "{}
         upstrand us1 {{ upstream u01; }} upstrand us2 {{ upstream u02; }}
         {}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        front(
            "location /set { set $x $upstrand_us2; proxy_pass http://$upstrand_us1; }
             location /both { proxy_pass http://$upstrand_us1$upstrand_us2; }"
        ),
        backend(1, "u01", 200),
        backend(2, "u02", 200),
    );
    let n = Nginx::start(&http)?;
    check_eq(get(&n, "/set")?.status, 500, "set + proxy_pass")?;
    check_eq(get(&n, "/both")?.status, 500, "two variables in proxy_pass")?;
    let log = n.error_log();
    check(
        log.contains("accessing multiple upstrand variables in a single request is prohibited"),
        || format!("error log lacks the message:\n{log}"),
    )
}

fn variable_elsewhere_yields_name_and_advances() -> CaseResult {
    let n = Nginx::start(&ordered("", [200, 200, 200]).replace(
        "location / {",
        "location /name { return 200 \"$upstrand_us1\\n\"; } location / {",
    ))?;
    let names: Vec<String> = (0..4)
        .map(|_| get(&n, "/name").map(|a| a.text()))
        .collect::<Result<_, _>>()?;
    check_eq(names.join(""), "u01\nu02\nu03\nu01\n".to_string(), "names")?;
    check_eq(
        get(&n, "/")?.header("X-From").map(str::to_string),
        Some("u02".into()),
        "cursor",
    )
}

/// Decision 8: a walk longer than nginx's subrequest nesting limit (50) ends with nginx's own
/// error in the log; the client gets the last answer.
fn walk_longer_than_subrequest_limit() -> CaseResult {
    let ups: String = (0..60)
        .map(|i| format!("upstream m{i:02} {{ server 127.0.0.1:{{P1}}; }}\n"))
        .collect();
    let http = format!(
        "{ups}
         upstrand many {{ upstream ~^m; order per_request; next_upstream_statuses 503; }}
         {}{}",
        front("location / { proxy_pass http://$upstrand_many; }"),
        backend(1, "m", 503),
    );
    let n = Nginx::start(&http)?;
    let a = get(&n, "/")?;
    check_eq(a.status, 503, "status")?;
    check_eq(a.text(), "m 503\n".to_string(), "the last answer")?;
    let walked = path_of(&n, 0)?.split(" -> ").count();
    check(walked > 40 && walked < 60, || {
        format!("{walked} upstreams walked")
    })?;
    let log = n.error_log();
    check(log.contains("subrequests cycle"), || {
        format!("error log lacks nginx's subrequest limit error:\n{log}")
    })
}

/// Decision 2: `order start_random per_request` with an empty normal list does not crash.
fn random_order_with_only_backups() -> CaseResult {
    let http = format!(
        "{}
         upstrand us1 {{ upstream ~^b0 backup; order start_random per_request; next_upstream_statuses 5xx; }}
         {}{}{}",
        upstream("b01", 1) + &upstream("b02", 2),
        front("location / { proxy_pass http://$upstrand_us1; }"),
        backend(1, "b01", 503),
        backend(2, "b02", 200),
    );
    let n = Nginx::start(&http)?;
    for _ in 0..10 {
        let a = get(&n, "/")?;
        check_eq(a.status, 200, "status")?;
        check_eq(a.header("X-From"), Some("b02"), "answer")?;
    }
    Ok(())
}

/// An upstrand location included by SSI: the walk runs inside the SSI subrequest and its final
/// answer lands at the include's place.
fn upstrand_walk_inside_ssi_include() -> CaseResult {
    let http = format!(
        "{}{}
         upstrand us1 {{ upstream ~^u0; upstream b01 backup; order per_request; next_upstream_statuses 5xx; }}
         {}{}{}{}
         server {{ listen 127.0.0.1:{{P4}}; location / {{ return 200 \"[<!--# include virtual=\\\"/us\\\" -->]\\n\"; }} }}",
        upstream("u01", 1) + &upstream("u02", 2),
        upstream("b01", 3) + &upstream("page", 4),
        front(
            "location / { ssi on; ssi_types text/plain; proxy_pass http://page; }
             location /us { proxy_pass http://$upstrand_us1; }"
        ),
        backend(1, "u01", 503),
        backend(2, "u02", 502),
        backend(3, "b01", 200),
    );
    let n = Nginx::start(&http)?;
    for _ in 0..3 {
        let a = get(&n, "/")?;
        check_eq(a.status, 200, "status")?;
        check_eq(
            a.text(),
            "[b01 200\n]\n".to_string(),
            "included walk answer",
        )?;
    }
    Ok(())
}

// ---- 7. status variables ------------------------------------------------------------------

fn status_variables_format() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    get(&n, "/")?;
    let lines = access_log(&n, 1)?;
    let f: Vec<&str> = lines[0].split('|').collect();
    check_eq(f.len(), 10, "fields")?;
    let (p1, p2, p3) = (n.port(1), n.port(2), n.port(3));
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
    get(&n, "/")?;
    let lines = access_log(&n, 1)?;
    check_eq(
        lines[0].clone(),
        "/|200|-|-|-|-|-|-|-|-".to_string(),
        "log line",
    )
}

// ---- 8. dynamic_upstrand ------------------------------------------------------------------

fn dynamic_config() -> String {
    format!(
        "{}{}
         upstrand us1 {{ upstream ~^u0; upstream b01 backup; order start_random; next_upstream_statuses 5xx; }}
         upstrand us2 {{ upstream ~^u0; upstream b02 backup; order start_random; next_upstream_statuses 5xx; }}
         {}{}{}{}{}",
        upstream("u01", 1) + &upstream("u02", 2),
        upstream("b01", 3) + &upstream("b02", 4),
        front(
            "dynamic_upstrand $dus1 $arg_a us2;
             location / {
                 dynamic_upstrand $dus2 $arg_b;
                 if ($arg_b) {
                     proxy_pass http://$dus2;
                     break;
                 }
                 proxy_pass http://$dus1;
             }"
        ),
        backend(1, "u01", 503),
        backend(2, "u02", 503),
        backend(3, "b01", 200),
        backend(4, "b02", 200),
    )
}

/// Every row of the seed's worked example (u0x fail, so the backup names the upstrand).
fn dynamic_upstrand_seed_example() -> CaseResult {
    let n = Nginx::start(&dynamic_config())?;
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
        let a = get(&n, path)?;
        check_eq(a.status, *status, &format!("status of {path}"))?;
        if let Some(f) = from {
            check_eq(a.header("X-From"), Some(*f), &format!("answer of {path}"))?;
        }
    }
    Ok(())
}

/// A named case.
type Case = (&'static str, fn() -> CaseResult);

fn main() {
    let mut trials = emerg_cases();
    let cases: &[Case] = &[
        ("conf_seed_example_accepted", conf_seed_example_accepted),
        (
            "conf_regex_members_include_singlets",
            regex_members_include_singlets,
        ),
        (
            "failover_normal_then_backup_cycle",
            failover_normal_then_backup_cycle,
        ),
        (
            "failover_last_answer_is_delivered",
            failover_last_answer_is_delivered,
        ),
        (
            "failover_first_unlisted_answer_stops",
            failover_first_unlisted_answer_stops,
        ),
        ("failover_4xx_and_exact_codes", failover_4xx_and_exact_codes),
        (
            "failover_through_gzip_and_chunked",
            failover_through_gzip_and_chunked,
        ),
        (
            "failover_with_proxy_buffering_off",
            failover_with_proxy_buffering_off,
        ),
        ("failover_one_mebibyte_bodies", failover_one_mebibyte_bodies),
        ("failover_head_request", failover_head_request),
        (
            "failover_error_and_timeout_against_backend_codes",
            failover_error_and_timeout_against_backend_codes,
        ),
        ("failover_non_idempotent_post", non_idempotent_post),
        ("order_default_round_robin", order_default_round_robin),
        ("order_start_random", order_start_random),
        ("order_per_request", order_per_request),
        (
            "order_start_random_per_request",
            order_start_random_per_request,
        ),
        (
            "order_seed_no_round_robin_with_singlets",
            order_seed_no_round_robin_with_singlets,
        ),
        (
            "order_random_with_only_backups",
            random_order_with_only_backups,
        ),
        (
            "walk_longer_than_subrequest_limit",
            walk_longer_than_subrequest_limit,
        ),
        (
            "subrequest_upstrand_walk_inside_ssi_include",
            upstrand_walk_inside_ssi_include,
        ),
        (
            "blacklist_skips_failed_upstream_until_interval_ends",
            blacklist_skips_failed_upstream_until_interval_ends,
        ),
        (
            "blacklist_goes_to_first_healthy_in_cycle_order",
            blacklist_goes_to_first_healthy_in_cycle_order,
        ),
        (
            "blacklist_everything_whitelists_with_log",
            blacklist_everything_whitelists_with_log,
        ),
        (
            "next_upstream_timeout_returns_last_answer",
            next_upstream_timeout_returns_last_answer,
        ),
        ("intercept_after_timeout", intercept_after_timeout),
        (
            "intercept_with_try_files_and_error_page",
            intercept_with_try_files_and_error_page,
        ),
        (
            "intercept_first_matching_directive_wins",
            intercept_first_matching_directive_wins,
        ),
        (
            "redirect_error_page_does_not_break_walk",
            error_page_does_not_break_walk,
        ),
        (
            "redirect_x_accel_redirect_is_ignored",
            x_accel_redirect_is_ignored,
        ),
        (
            "subrequest_ssi_inside_upstrand_request",
            ssi_subrequest_inside_upstrand_request,
        ),
        (
            "two_upstrands_in_one_request_give_500",
            two_upstrands_in_one_request_give_500,
        ),
        (
            "variable_elsewhere_yields_name_and_advances",
            variable_elsewhere_yields_name_and_advances,
        ),
        ("status_variables_format", status_variables_format),
        (
            "status_variables_outside_upstrand_are_not_found",
            status_variables_outside_upstrand_are_not_found,
        ),
        (
            "dynamic_upstrand_seed_example",
            dynamic_upstrand_seed_example,
        ),
    ];
    trials.extend(cases.iter().map(|(name, f)| Trial::test(*name, *f)));
    run_tests(trials)
}
