//! Requests whose tries span a change of the set: a busy server retired then freed, a grown set,
//! a set that shrinks to one, and a large set from a body buffered in a temp file.

use std::fs;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ngx_harness::{check, check_eq, http_request, CaseResult};

use super::helpers::*;
use super::master::{Master, SlowBackend};

pub(super) fn case_busy_server_is_retired_then_freed() -> CaseResult {
    for up in ["app", "lc", "lck"] {
        busy_server_is_retired_then_freed(up)
            .map_err(|e| format!("upstream {up}: {}", e.message().unwrap_or("failed")))?;
    }
    Ok(())
}

fn busy_server_is_retired_then_freed(up: &str) -> CaseResult {
    let m = Master::start(&standard_for(up))?;
    let slow = SlowBackend::start()?;
    let base = slab(&m, up)?;
    let body = format!(r#"{{"servers":[{{"address":"127.0.0.1:{}"}}]}}"#, slow.port);
    check_eq(m.put(up, &body)?.status, 200, "PUT slow backend")?;
    let port0 = m.port(0);
    let inflight = std::thread::spawn(move || {
        http_request(port0, "GET", "/", &[], b"").map(|r| (r.status, r.text()))
    });
    slow.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "slow backend got no connection")?;
    let v = m.get_json(&format!("/{up}"))?;
    check_eq(
        v["servers"][0]["active"].as_u64(),
        Some(1),
        "active on the slow server",
    )?;
    let r = json(&m.put(up, &set_body(&m, &[1], &[]))?)?;
    check_eq(
        r["retiring"].as_u64(),
        Some(1),
        "retiring after removing the busy server",
    )?;
    let v = m.get_json(&format!("/{up}"))?;
    check_eq(v["retiring"].as_u64(), Some(1), "GET retiring while busy")?;
    check_eq(
        addresses(&v),
        vec![addr(&m, 1)],
        "set without the busy server",
    )?;
    let (w, b) = m.front()?;
    check_eq(b.as_str(), "b1", &format!("new requests (worker {w})"))?;
    slow.release.store(true, Ordering::SeqCst);
    let (status, text) = inflight.join().map_err(|_| "request thread panicked")??;
    check_eq(
        (status, text.as_str()),
        (200, "slow\n"),
        "the in-flight request completes",
    )?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = m.get_json(&format!("/{up}"))?;
        if v["retiring"].as_u64() == Some(0) {
            break;
        }
        check(Instant::now() < deadline, || {
            format!("retired server not freed: {v}")
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    check_eq(
        slab(&m, up)?,
        base,
        "zone slab (chunks used, free pages) back to the start",
    )?;
    // The request's $upstream_addr was logged after its server was freed: a copy, still right.
    let log = fs::read_to_string(m.dir.join("logs/up.log")).unwrap_or_default();
    check(
        log.lines().any(|l| l == format!("127.0.0.1:{}", slow.port)),
        || format!("no $upstream_addr of the retired server in the log: {log:?}"),
    )?;
    m.check_workers_unchanged()
}

pub(super) fn case_request_between_tries_continues_in_a_grown_set() -> CaseResult {
    // A request holds server F (3 servers, its tried bitmap is one word); the set is replaced
    // by 70 servers (69 of them down) without F; F then fails the request, whose next try must
    // be made from the new set with balancer data sized for it.
    let m = Master::start(&standard())?;
    m.expect_log(
        "upstream prematurely closed connection while reading response header from upstream",
    );
    let f = SlowBackend::start_mode(true)?;
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}}]}}"#,
        f.port,
        m.dead,
        m.dead + 1
    );
    check_eq(m.put("app", &body)?.status, 200, "PUT F + 2")?;
    let r0 = m.get_json("/app")?["rebalanced"].as_u64();
    let port0 = m.port(0);
    let inflight = std::thread::spawn(move || {
        http_request(port0, "GET", "/", &[], b"").map(|r| (r.status, r.text()))
    });
    f.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "F got no connection")?;
    let mut s: Vec<String> = (0..69)
        .map(|i| {
            format!(
                r#"{{"address":"127.0.0.{}:{}","down":true}}"#,
                2 + i,
                m.dead
            )
        })
        .collect();
    s.push(format!(r#"{{"address":"127.0.0.1:{}"}}"#, m.port(2)));
    let r = json(&m.put("app", &format!(r#"{{"servers":[{}]}}"#, s.join(",")))?)?;
    check_eq(r["retiring"].as_u64(), Some(1), "F retired")?;
    f.release.store(true, Ordering::SeqCst);
    let (status, text) = inflight.join().map_err(|_| "request thread panicked")??;
    check_eq(
        (status, text.trim()),
        (200, "b2"),
        "the request continued in the new set",
    )?;
    let v = m.get_json("/app")?;
    check_eq(
        v["rebalanced"].as_u64(),
        r0.map(|x| x + 1),
        "requests rebalanced",
    )?;
    check_eq(v["retiring"].as_u64(), Some(0), "F freed")?;
    m.check_workers_unchanged()
}

pub(super) fn case_request_gets_the_tries_of_a_grown_set() -> CaseResult {
    // A request holds server F in [F, DEAD] (2 tries); the set becomes 6 dead servers and b2
    // (7 tries); F then fails the request. Its next tries are made in the new set, where a new
    // request could try all 7 servers: it must get that many (nginx would give a new request
    // 7), not the 1 it had left in the old set, or it ends with 502 after one dead server. Both
    // balancers: round robin (app) and least_conn (lc), which prefers the idle dead servers.
    for up in ["app", "lc"] {
        request_gets_the_tries_of_a_grown_set(up)
            .map_err(|e| format!("upstream {up}: {}", e.message().unwrap_or("failed")))?;
    }
    Ok(())
}

fn request_gets_the_tries_of_a_grown_set(up: &str) -> CaseResult {
    let m = Master::start(&standard_for(up))?;
    m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    m.expect_log(
        "upstream prematurely closed connection while reading response header from upstream",
    );
    let f = SlowBackend::start_mode(true)?;
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}}]}}"#,
        f.port, m.dead
    );
    check_eq(m.put(up, &body)?.status, 200, "PUT F DEAD")?;
    let port0 = m.port(0);
    let inflight = std::thread::spawn(move || {
        http_request(port0, "GET", "/", &[], b"").map(|r| (r.status, r.text()))
    });
    f.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "F got no connection")?;
    let mut s: Vec<String> = (0..6)
        .map(|i| format!(r#"{{"address":"127.0.0.{}:{}"}}"#, 2 + i, m.dead))
        .collect();
    s.push(format!(r#"{{"address":"127.0.0.1:{}"}}"#, m.port(2)));
    let r = m.put(up, &format!(r#"{{"servers":[{}]}}"#, s.join(",")))?;
    check_eq(r.status, 200, &format!("PUT 6 dead + b2 ({})", r.text()))?;
    f.release.store(true, Ordering::SeqCst);
    let (status, text) = inflight.join().map_err(|_| "request thread panicked")??;
    let tries = fs::read_to_string(m.dir.join("logs/up.log")).unwrap_or_default();
    check_eq(
        (status, text.trim()),
        (200, "b2"),
        &format!(
            "the failed request's tries in the new set (tried: {})",
            tries.trim()
        ),
    )?;
    m.check_workers_unchanged()
}

pub(super) fn case_large_set_from_a_body_in_a_temp_file() -> CaseResult {
    // 512 servers with every field: about 60 KB, more than client_body_buffer_size, so nginx
    // keeps the body in a temporary file.
    let m = Master::start(&standard())?;
    let s: Vec<String> = (0..512)
        .map(|i| {
            format!(
                r#"{{"address":"10.2.{}.{}:8080","weight":{},"max_fails":2,"fail_timeout_ms":20000,"backup":{},"down":false}}"#,
                i / 250,
                i % 250 + 1,
                1 + i % 7,
                i >= 500
            )
        })
        .collect();
    let body = format!(r#"{{"servers":[{}]}}"#, s.join(","));
    check(body.len() > 32 * 1024, || {
        format!("body only {} bytes", body.len())
    })?;
    let r = m.put("app", &body)?;
    check_eq(r.status, 200, &format!("PUT 512 servers ({})", r.text()))?;
    let v = m.get_json("/app")?;
    let servers = v["servers"].as_array().ok_or("no servers")?;
    check_eq(servers.len(), 512, "servers")?;
    check_eq(
        servers
            .iter()
            .filter(|x| x["backup"].as_bool() == Some(true))
            .count(),
        12,
        "backups",
    )?;
    check_eq(servers[3]["weight"].as_u64(), Some(4), "weight of the 4th")?;
    check_eq(
        servers[0]["fail_timeout_ms"].as_u64(),
        Some(20_000),
        "fail_timeout_ms",
    )?;
    check(
        m.error_log().contains("buffered to a temporary file"),
        || "the body was not in a temporary file".into(),
    )?;
    Ok(())
}

pub(super) fn case_request_keeps_its_tries_when_the_set_shrinks_to_one() -> CaseResult {
    // A request holds F in [F, b1]; the set becomes [b2] (a single server); F then fails the
    // request, which must still take its second try (in the new set).
    let m = Master::start(&standard())?;
    m.expect_log(
        "upstream prematurely closed connection while reading response header from upstream",
    );
    let f = SlowBackend::start_mode(true)?;
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}}]}}"#,
        f.port,
        m.port(1)
    );
    check_eq(m.put("app", &body)?.status, 200, "PUT F b1")?;
    let port0 = m.port(0);
    let inflight = std::thread::spawn(move || {
        http_request(port0, "GET", "/", &[], b"").map(|r| (r.status, r.text()))
    });
    f.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "F got no connection")?;
    check_eq(
        m.put("app", &set_body(&m, &[2], &[]))?.status,
        200,
        "PUT b2",
    )?;
    f.release.store(true, Ordering::SeqCst);
    let (status, text) = inflight.join().map_err(|_| "request thread panicked")??;
    check_eq(
        (status, text.trim()),
        (200, "b2"),
        "the failed request's second try",
    )?;
    m.check_workers_unchanged()
}
