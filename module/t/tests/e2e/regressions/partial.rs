//! A backend of the test that misbehaves (a status line, then an error or silence), and
//! `next_upstream_timeout` counted from the first contact.

use super::*;

// ---- a backend of the test that misbehaves -------------------------------------------------

/// What a [`PartialBackend`] does after reading a request.
#[derive(Clone, Copy)]
pub(super) enum Partial {
    /// Sends a status line and one header line, then closes the connection.
    StatusLineThenClose,
    /// Sends a status line and one header line, then says nothing more (until the case ends).
    StatusLineThenSilence,
}

/// A loopback backend that answers every request with the start of a header only; stopped and
/// joined on drop.
pub(super) struct PartialBackend {
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

// ---- next_upstream_timeout counts from the first contact -----------------------------------

/// A client that takes 1.5 s to upload its body does not use up a 1 s `next_upstream_timeout`:
/// the time counts from the moment the first upstream was contacted (after nginx read the
/// body), so the walk still moves on from u01's 503 to u02.
pub(super) fn next_upstream_timeout_counts_from_first_upstream_contact() -> CaseResult {
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
pub(super) fn partial_header_case(mode: Partial, word: &str, status: u16) -> CaseResult {
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

pub(super) fn error_matches_status_line_then_closed_connection() -> CaseResult {
    partial_header_case(Partial::StatusLineThenClose, "error", 502)
}

pub(super) fn timeout_matches_status_line_then_silence() -> CaseResult {
    partial_header_case(Partial::StatusLineThenSilence, "timeout", 504)
}
