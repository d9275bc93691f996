//! Helpers shared by the upstrand areas (`upstrand/`, `upstrand_order.rs`): the
//! configuration layout, the access log with every `$upstrand_*` variable, and answers.

use std::fs;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use ngx_harness::{check_eq, CaseResult, Failed, KeepAlive, Nginx, Response};

/// Loads the Debian echo module (for backends that read and echo a request body).
pub const ECHO: &str = "load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;";

/// `log_format` with every variable of the family.
pub const LOG_FORMAT: &str = "log_format us '$request_uri|$status|$upstrand_path|$upstrand_addr|\
$upstrand_status|$upstrand_cache_status|$upstrand_connect_time|$upstrand_header_time|\
$upstrand_response_length|$upstrand_response_time';";

/// Waits up to 10 s until `logs/NAME` satisfies `done` (nginx writes its logs after the client
/// may already have its answer); on timeout, the text it had.
pub fn wait_for_log(n: &Nginx, name: &str, done: impl Fn(&str) -> bool) -> Result<String, String> {
    let path = n.prefix().join("logs").join(name);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&path).unwrap_or_default();
        if done(&text) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            return Err(text);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines of `logs/access.log` once it has at least `count` of them.
pub fn access_log(n: &Nginx, count: usize) -> Result<Vec<String>, Failed> {
    let text = wait_for_log(n, "access.log", |t| t.lines().count() >= count).map_err(|text| {
        format!(
            "access log has {} lines, want {count}: {text}",
            text.lines().count()
        )
    })?;
    Ok(text.lines().map(str::to_string).collect())
}

/// Field of `$upstrand_path` in [`LOG_FORMAT`].
pub const PATH_FIELD: usize = 2;
/// Field of `$upstrand_status` in [`LOG_FORMAT`].
pub const STATUS_FIELD: usize = 4;

/// Field `field` of access log line `i` (format [`LOG_FORMAT`]).
pub fn log_field(n: &Nginx, i: usize, field: usize) -> Result<String, Failed> {
    let lines = access_log(n, i + 1)?;
    Ok(lines[i]
        .split('|')
        .nth(field)
        .unwrap_or_default()
        .to_string())
}

/// The `$upstrand_path` of access log line `i`.
pub fn path_of(n: &Nginx, i: usize) -> Result<String, Failed> {
    log_field(n, i, PATH_FIELD)
}

/// Checks the `$upstrand_path` of access log line `i`.
pub fn check_path(n: &Nginx, i: usize, want: &str, what: &str) -> CaseResult {
    check_eq(path_of(n, i)?.as_str(), want, what)
}

/// Checks an answer's status and body.
pub fn check_answer(a: &Response, status: u16, body: &str) -> CaseResult {
    check_eq(a.status, status, "status")?;
    check_eq(a.text().as_str(), body, "body")
}

/// The `X-From` header (the backend's name) of the answer to `GET /` over `conn`; `-` without one.
/// The cursor and the blacklist of an upstrand are per worker: cases that follow them send every
/// request over one keep-alive connection, which one worker serves.
pub fn answered_by(conn: &mut KeepAlive) -> Result<String, Failed> {
    Ok(conn.get("/")?.header("X-From").unwrap_or("-").to_string())
}

/// A listening socket that never accepts: connections succeed, answers never come.
pub fn black_hole() -> Result<TcpListener, Failed> {
    Ok(TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?)
}

pub fn hole_port(l: &TcpListener) -> Result<String, Failed> {
    Ok(l.local_addr()
        .map_err(|e| e.to_string())?
        .port()
        .to_string())
}

/// The front server: `{P0}` with the access log, then `body`.
pub fn front(body: &str) -> String {
    format!(
        "{LOG_FORMAT}\nserver {{ listen 127.0.0.1:{{P0}}; access_log {{PREFIX}}/logs/access.log us;\n{body}\n}}\n"
    )
}

/// A backend on `{Pi}` answering `status` with body `"NAME STATUS\n"` and `X-From: NAME`.
pub fn backend(i: usize, name: &str, status: u16) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}}; location / {{ add_header X-From {name} always; \
         return {status} \"{name} {status}\\n\"; }} }}\n"
    )
}

/// A case's configuration: `upstream NAME { server 127.0.0.1:{Pi}; }` for each `(NAME, i)`,
/// then `http` (`upstrand` blocks and any other `http {}` lines), the [`front`] server with
/// `locations`, and a [`backend`] for each `(i, NAME, STATUS)`.
pub fn config(
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

/// Trials named like the case functions.
#[macro_export]
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        vec![$(ngx_harness::Case::test(stringify!($case), $case)),*]
    };
}
