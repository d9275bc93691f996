//! Regression cases of section 1 ("exactness"): each case is named after the behaviour
//! it pins, against Debian's nginx with the module loaded. Run directly it ends with
//! `N passed, N failed`.
//!
//! Layout as in `upstrand/mod.rs`: the front server listens on `{P0}`; backends are `server {}`
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

mod partial;
mod walks;
use partial::*;
use walks::*;

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
