//! Regression cases of section 1 ("exactness"): each case is named after the behaviour
//! it pins, against Debian's nginx with the module loaded. Run directly it ends with
//! `N passed, N failed`.
//!
//! Layout as in `upstrand.rs`: the front server listens on `{P0}`; backends are `server {}`
//! blocks of the same nginx on `{P1}`…`{P8}`; some cases add a backend of the test itself (a
//! thread on a loopback listener) that misbehaves in a precise way.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::case::Case;
use ngx_harness::{check, check_eq, expect_emerg, expect_ok, CaseResult, Failed, Nginx, Response};

/// `log_format` with the path and three status variables.
const LOG_FORMAT: &str =
    "log_format us '$request_uri|$status|$upstrand_path|$upstrand_addr|$upstrand_status';";

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

/// `upstream NAME { server 127.0.0.1:{Pi}; }` for each `(NAME, i)`, then `http`, the [`front`]
/// server with `locations`, and a [`backend`] for each `(i, NAME, STATUS)`.
fn config(
    upstreams: &[(&str, usize)],
    http: &str,
    locations: &str,
    backends: &[(usize, &str, u16)],
) -> String {
    let mut s: String = upstreams
        .iter()
        .map(|(name, i)| format!("upstream {name} {{ server 127.0.0.1:{{P{i}}}; }}\n"))
        .collect();
    s.push_str(http);
    s.push('\n');
    s.push_str(&front(locations));
    for (i, name, status) in backends {
        s.push_str(&backend(*i, name, *status));
    }
    s
}

/// Lines of `logs/NAME` once `done` holds for its text (nginx writes logs after the client may
/// already have its answer); waits up to 10 s.
fn wait_for_log(n: &Nginx, name: &str, done: impl Fn(&str) -> bool) -> Result<String, Failed> {
    let path = n.prefix().join("logs").join(name);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&path).unwrap_or_default();
        if done(&text) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            return Err(format!("logs/{name} never satisfied the check:\n{text}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The fields of access log line `i` (format [`LOG_FORMAT`]).
fn log_fields(n: &Nginx, i: usize) -> Result<Vec<String>, Failed> {
    let text = wait_for_log(n, "access.log", |t| t.lines().count() > i)?;
    let line = text.lines().nth(i).unwrap_or_default();
    Ok(line.split('|').map(str::to_string).collect())
}

/// The error log has no line worse than `[error]` and no worker that died.
fn check_no_alerts(n: &Nginx) -> CaseResult {
    let log = n.error_log();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("[alert]")
                || l.contains("[crit]")
                || l.contains("[emerg]")
                || l.contains("exited on signal")
        })
        .collect();
    check(bad.is_empty(), || {
        format!("error log has:\n{}", bad.join("\n"))
    })
}

fn check_answer(a: &Response, status: u16, body: &str) -> CaseResult {
    check_eq(a.status, status, "status")?;
    check_eq(a.text().as_str(), body, "body")
}

// ---- a backend of the test that misbehaves -------------------------------------------------

/// What a [`PartialBackend`] does after reading a request.
#[derive(Clone, Copy)]
enum Partial {
    /// Sends a status line and one header line, then closes the connection.
    StatusLineThenClose,
    /// Sends a status line and one header line, then says nothing more (until the case ends).
    StatusLineThenSilence,
}

/// A loopback backend that answers every request with the start of a header only; stopped and
/// joined on drop.
struct PartialBackend {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PartialBackend {
    fn start(mode: Partial) -> Result<PartialBackend, Failed> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut head = Vec::new();
                        let mut buf = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(k) => head.extend_from_slice(&buf[..k]),
                            }
                        }
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nX-Partial: yes\r\n");
                        let _ = s.flush();
                        if let Partial::StatusLineThenSilence = mode {
                            held.push(s);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(PartialBackend {
            port,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for PartialBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---- $upstrand_NAME is an exact variable ---------------------------------------------------

/// A typo in the upstrand name fails `nginx -t` with nginx's own message (no prefix variable
/// that would accept any `$upstrand_*` and fail only at run time).
fn upstrand_variable_typo_fails_config_test() -> CaseResult {
    expect_emerg(
        "upstream u01 { server 127.0.0.1:{P1}; }
         upstrand us1 { upstream u01; }
         server { listen 127.0.0.1:{P0}; location / { proxy_pass http://$upstrand_typo; } }",
        "unknown \"upstrand_typo\" variable",
    )
}

/// `$upstrand_NAME` may be used before its block (nginx resolves variables at the end of
/// `http {}`), in any letter case, and a status variable name is not an upstrand.
fn upstrand_variable_exists_once_its_block_exists() -> CaseResult {
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

// ---- next_upstream_timeout counts from the first contact -----------------------------------

/// A client that takes 1.5 s to upload its body does not use up a 1 s `next_upstream_timeout`:
/// the time counts from the moment the first upstream was contacted (after nginx read the
/// body), so the walk still moves on from u01's 503 to u02.
fn next_upstream_timeout_counts_from_first_upstream_contact() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2)],
        "upstrand us1 { upstream u01; upstream u02; order per_request; \
         next_upstream_statuses 5xx; next_upstream_timeout 1s; }",
        "location / { proxy_pass http://$upstrand_us1; }",
        &[(1, "u01", 503), (2, "u02", 200)],
    ))?;
    let mut s = TcpStream::connect(("127.0.0.1", n.port())).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    s.write_all(
        b"PUT /slow HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 5\r\n\r\n",
    )
    .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(1500));
    s.write_all(b"hello").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    check(text.starts_with("HTTP/1.1 200"), || {
        format!("the walk must move on to u02, got:\n{text}")
    })?;
    check(text.ends_with("u02 200\n"), || format!("body: {text}"))?;
    check_eq(
        log_fields(&n, 0)?[2].as_str(),
        "u01 -> u02",
        "$upstrand_path",
    )?;
    Ok(())
}

// ---- error / timeout after a status line ---------------------------------------------------

/// `error` and `timeout` match a 502/504 that nginx made after the backend sent a status line
/// and then closed the connection / fell silent before the header ended (the C module's test is
/// "no upstream connection left"), in `next_upstream_statuses` and in `intercept_statuses`.
fn partial_header_case(mode: Partial, word: &str, status: u16) -> CaseResult {
    let part = PartialBackend::start(mode)?;
    let http = config(
        &[("u02", 2)],
        &format!(
            "upstream part {{ server 127.0.0.1:{}; }}
             upstrand next {{ upstream part; upstream u02; order per_request; \
             next_upstream_statuses {word}; }}
             upstrand icpt {{ upstream part; order per_request; intercept_statuses {word} /failover; }}
             upstrand other {{ upstream part; upstream u02; order per_request; \
             next_upstream_statuses {other}; }}",
            part.port,
            other = if word == "error" { "timeout" } else { "error" },
        ),
        "proxy_read_timeout 500ms;
         location /next { proxy_pass http://$upstrand_next; }
         location /icpt { proxy_pass http://$upstrand_icpt; }
         location /other { proxy_pass http://$upstrand_other; }
         location /failover { internal; return 200 \"failover after $status\\n\"; }",
        &[(2, "u02", 200)],
    );
    let n = Nginx::start(&http)?;
    n.expect_log(match mode {
        Partial::StatusLineThenClose => {
            "upstream prematurely closed connection while reading response header from upstream"
        }
        Partial::StatusLineThenSilence => {
            "upstream timed out (110: Connection timed out) while reading response header from upstream"
        }
    });
    let a = n.get_on(0, "/next")?;
    check_answer(&a, 200, "u02 200\n")?;
    check_eq(
        log_fields(&n, 0)?[4].as_str(),
        format!("(part) {status} (u02) 200").as_str(),
        "$upstrand_status",
    )?;
    let a = n.get_on(0, "/icpt")?;
    check_eq(a.status, 200, &format!("{word} is intercepted"))?;
    check_eq(a.text().as_str(), "failover after 200\n", "failover body")?;
    let a = n.get_on(0, "/other")?;
    check_eq(a.status, status, "the other word does not match")?;
    check_eq(log_fields(&n, 2)?[2].as_str(), "part", "no failover")?;
    check_no_alerts(&n)
}

fn error_matches_status_line_then_closed_connection() -> CaseResult {
    partial_header_case(Partial::StatusLineThenClose, "error", 502)
}

fn timeout_matches_status_line_then_silence() -> CaseResult {
    partial_header_case(Partial::StatusLineThenSilence, "timeout", 504)
}

// ---- combine_server_singlets needs servers -------------------------------------------------

fn combine_server_singlets_before_any_server_is_an_error() -> CaseResult {
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
fn status_variables_follow_the_docs_in_every_walk() -> CaseResult {
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
fn extend_single_peers_warning_names_upstream_file_and_line() -> CaseResult {
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
fn walk_decisions_are_in_the_debug_log() -> CaseResult {
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
fn add_header_reads_walk_variables_while_the_walk_delivers() -> CaseResult {
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

/// The cases of this area, named like their functions (`main.rs` adds the area).
pub fn cases() -> Vec<Case> {
    cases![
        upstrand_variable_typo_fails_config_test,
        upstrand_variable_exists_once_its_block_exists,
        next_upstream_timeout_counts_from_first_upstream_contact,
        error_matches_status_line_then_closed_connection,
        timeout_matches_status_line_then_silence,
        combine_server_singlets_before_any_server_is_an_error,
        status_variables_follow_the_docs_in_every_walk,
        extend_single_peers_warning_names_upstream_file_and_line,
        walk_decisions_are_in_the_debug_log,
        add_header_reads_walk_variables_while_the_walk_delivers,
    ]
}
