//! Drain: a `PUT` with `"drain": true` on a server keeps it in the set with its
//! requests in flight, and gives it no new request in any worker — with upstream `keepalive`
//! too, where a cached connection to it must not carry a new request. `GET` shows `drain` and
//! `active`; a later `PUT` without `drain` puts it back in rotation; `down` and `drain` are
//! independent.
//!
//! The long request is held [`hold`] seconds by the drained backend: 5 s by default, so the case
//! stays a few seconds long (what it shows — the request outlives the `PUT` and the new requests
//! sent meanwhile, and ends with 200 — does not depend on the length); `DRAIN_HOLD_SECS=30` runs
//! the issue's 30 s form.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::case::Case;
use ngx_harness::{check, check_eq, http_request_within, CaseResult, Failed};

use super::helpers::*;
use super::master::Master;

/// How long the drained backend holds `/slow` (`DRAIN_HOLD_SECS`, default 5).
fn hold() -> Duration {
    let secs = std::env::var("DRAIN_HOLD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5u64);
    Duration::from_secs(secs)
}

/// A test-owned HTTP/1.1 backend that keeps connections alive (so nginx's upstream `keepalive`
/// caches them), answers `d` at once, or `slow` after `hold` for `/slow`, and counts the
/// requests and connections it got.
struct DrainBackend {
    port: u16,
    requests: Arc<AtomicUsize>,
    conns: Arc<AtomicUsize>,
    /// One message per `/slow` request, when it arrives.
    slow_arrived: Mutex<mpsc::Receiver<()>>,
    stop: Arc<AtomicBool>,
}

impl DrainBackend {
    fn start(hold: Duration) -> Result<DrainBackend, Failed> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        let requests = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (rq, cn, st) = (requests.clone(), conns.clone(), stop.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(s) = s else { return };
                cn.fetch_add(1, Ordering::SeqCst);
                let (rq, tx) = (rq.clone(), tx.clone());
                std::thread::spawn(move || serve(s, &rq, &tx, hold));
            }
        });
        Ok(DrainBackend {
            port,
            requests,
            conns,
            slow_arrived: Mutex::new(rx),
            stop,
        })
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for DrainBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Serves requests on one connection until the peer closes it or asks to.
fn serve(s: TcpStream, requests: &AtomicUsize, slow: &mpsc::Sender<()>, hold: Duration) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut close = line.contains("HTTP/1.0");
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let lower = h.to_ascii_lowercase();
            if lower.starts_with("connection:") {
                close = lower.contains("close");
            }
            if h == "\r\n" || h == "\n" {
                break;
            }
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let body: &[u8] = if path.starts_with("/slow") {
            let _ = slow.send(());
            std::thread::sleep(hold);
            b"slow\n"
        } else {
            b"d\n"
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}\r\n",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if w.write_all(head.as_bytes()).is_err() || w.write_all(body).is_err() || close {
            return;
        }
    }
}

/// `GET /slow` on the front server with a read timeout longer than `hold`: (status, body).
fn long_get(port: u16, hold: Duration) -> Result<(u16, String), String> {
    let r = http_request_within(
        port,
        "GET",
        "/slow",
        &[],
        b"",
        hold + Duration::from_secs(30),
    )
    .map_err(|e| format!("the long request: {}", e.message().unwrap_or("no answer")))?;
    Ok((r.status, r.text().trim().to_string()))
}

/// The server `address` of `GET /api/app`.
fn server_view(m: &Master, address: &str) -> Result<serde_json::Value, Failed> {
    let v = m.get_json("/app")?;
    v["servers"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["address"] == address))
        .cloned()
        .ok_or_else(|| format!("{address} is not in {v}").into())
}

fn drained_server_gets_no_new_requests(keepalive: bool) -> CaseResult {
    let hold = hold();
    let (ka, extra) = if keepalive {
        (
            " keepalive 8;",
            "proxy_http_version 1.1; proxy_set_header Connection \"\";",
        )
    } else {
        ("", "")
    };
    let conf = format!(
        "upstream app {{ zone app 1m; server 127.0.0.1:{{P1}};{ka} }}\n{}",
        front("app", extra)
    );
    let m = Master::start(&conf)?;
    let d = DrainBackend::start(hold)?;
    let da = format!("127.0.0.1:{}", d.port);
    let b1 = addr(&m, 1);
    let set = |drain: bool, down: bool| {
        format!(
            r#"{{"servers":[{{"address":"{b1}"}},{{"address":"{da}","drain":{drain},"down":{down}}}]}}"#
        )
    };
    check_eq(m.put("app", &set(false, false))?.status, 200, "PUT b1, d")?;
    check_eq(
        server_view(&m, &da)?["drain"].as_bool(),
        Some(false),
        "drain of a server PUT without it",
    )?;
    // Both workers send to both servers (with keepalive: connections to d are cached now).
    both_workers_answer(&m, &["b1", "d"], 10)?;
    check(d.requests() > 0, || {
        "d got no request before the drain".into()
    })?;

    // A long request held by d; the front sends /slow until one lands on d.
    let port = m.port(0);
    let long = std::thread::spawn(move || -> Result<(u16, String, Duration), String> {
        for _ in 0..50 {
            let t = Instant::now();
            let (status, body) = long_get(port, hold)?;
            if body != "b1" {
                return Ok((status, body, t.elapsed()));
            }
        }
        Err("50 requests for /slow and none reached d".into())
    });
    d.slow_arrived
        .lock()
        .map_err(|_| "lock")?
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "no /slow request reached d in 10 s")?;

    let r = m.put("app", &set(true, false))?;
    check_eq(r.status, 200, &format!("PUT d drained: {}", r.text()))?;
    let before = d.requests();
    let s = server_view(&m, &da)?;
    check_eq(s["drain"].as_bool(), Some(true), "drain of d in GET")?;
    check_eq(s["down"].as_bool(), Some(false), "down of d in GET")?;
    check_eq(
        s["active"].as_u64(),
        Some(1),
        "active of d (the long request)",
    )?;
    check_eq(
        server_view(&m, &b1)?["drain"].as_bool(),
        Some(false),
        "drain of b1",
    )?;

    // While the long request is held: new requests (new client connections, both workers) all
    // go to b1.
    let mut sent = 0usize;
    let mut workers = std::collections::BTreeSet::new();
    while !long.is_finished() {
        let (w, body) = m.front()?;
        check_eq(
            body.as_str(),
            "b1",
            &format!("answer {sent} while d is drained"),
        )?;
        workers.insert(w);
        sent += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, body, took) = long
        .join()
        .map_err(|_| "the long request's thread panicked")??;
    eprintln!(
        "drained d (keepalive {keepalive}): long request {status} {body:?} after {took:?}; \
         {sent} new requests meanwhile, from workers {workers:?}; d got {} new",
        d.requests() - before
    );
    check_eq((status, body.as_str()), (200, "slow"), "the long request")?;
    check(took + Duration::from_millis(200) >= hold, || {
        format!("the long request took {took:?}, d holds it {hold:?}")
    })?;
    check(sent >= 20 && workers.len() == 2, || {
        format!("only {sent} requests from workers {workers:?} during the drain")
    })?;
    check_eq(d.requests(), before, "requests d got after its drain")?;

    // The request in flight is done: active falls to 0; d stays drained.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = server_view(&m, &da)?;
        if s["active"].as_u64() == Some(0) {
            check_eq(s["drain"].as_bool(), Some(true), "drain after the request")?;
            break;
        }
        check(Instant::now() < deadline, || {
            format!("d still active 5 s after its request ended: {s}")
        })?;
        std::thread::sleep(Duration::from_millis(50));
    }
    both_workers_answer(&m, &["b1"], 5)?;
    check_eq(d.requests(), before, "requests d got after its drain")?;

    // `down` and `drain` are independent bits of the PUT.
    check_eq(
        m.put("app", &set(true, true))?.status,
        200,
        "PUT d down+drain",
    )?;
    let s = server_view(&m, &da)?;
    check_eq(
        (s["down"].as_bool(), s["drain"].as_bool()),
        (Some(true), Some(true)),
        "down, drain",
    )?;
    check_eq(m.put("app", &set(false, true))?.status, 200, "PUT d down")?;
    let s = server_view(&m, &da)?;
    check_eq(
        (s["down"].as_bool(), s["drain"].as_bool()),
        (Some(true), Some(false)),
        "down, drain",
    )?;
    both_workers_answer(&m, &["b1"], 3)?;
    check_eq(d.requests(), before, "requests d got while down")?;

    // Undrained (PUT without drain, not down): d is in rotation again.
    check_eq(
        m.put("app", &set(false, false))?.status,
        200,
        "PUT d undrained",
    )?;
    check_eq(
        server_view(&m, &da)?["drain"].as_bool(),
        Some(false),
        "drain after the undrain",
    )?;
    let mut n = 0;
    while d.requests() == before {
        let (_, body) = m.front()?;
        check(["b1", "d"].contains(&body.as_str()), || {
            format!("answer {body:?}")
        })?;
        n += 1;
        check(n < 50, || "d got no request in 50 after its undrain".into())?;
    }
    eprintln!(
        "d undrained: its first request came with request {n}; {} connections to d in all",
        d.conns.load(Ordering::SeqCst)
    );
    m.check_workers_unchanged()
}

pub fn trials() -> Vec<Case> {
    vec![
        Case::test(
            "drained_server_gets_no_new_requests_and_finishes_its_own",
            || drained_server_gets_no_new_requests(false),
        ),
        Case::test(
            "drained_server_gets_no_new_requests_through_keepalive_connections",
            || drained_server_gets_no_new_requests(true),
        ),
    ]
}
