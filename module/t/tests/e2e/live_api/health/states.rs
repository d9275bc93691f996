//! A server's health states: it leaves on failing probes and comes back, is not held out by its
//! passive failures, and is unhealthy when hung or when its port is closed.

use super::*;
use crate::live_api::helpers::both_workers_answer;

pub(super) fn case_failing_server_leaves_and_comes_back() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let m = Master::start(&conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=200ms timeout=150ms fails=2 passes=2",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    until_probed(&m, b1.port, Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1", "b2"], 5)?;
    b1.set(FAIL_503);
    // interval × fails + 1 s
    let took = until_health(&m, b1.port, "unhealthy", Duration::from_millis(1400))?;
    let s = server_view(&m, b1.port)?;
    check(
        s["last_error"] == "status 503" && s["last_status"] == 503,
        || format!("after {took:?}: {s}"),
    )?;
    check(s["probe_fails"].as_u64() >= Some(2), || format!("{s}"))?;
    let before = b1.proxied.load(Ordering::SeqCst);
    both_workers_answer(&m, &["b2"], 20)?;
    check_eq_usize(
        b1.proxied.load(Ordering::SeqCst),
        before,
        "requests proxied to b1 while unhealthy",
    )?;
    b1.set(OK);
    let back = until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    let s = server_view(&m, b1.port)?;
    check(s["probe_passes"].as_u64() >= Some(2), || {
        format!("back after {back:?}: {s}")
    })?;
    let seen = both_workers_answer(&m, &["b1", "b2"], 20)?;
    check(b1.proxied.load(Ordering::SeqCst) > before, || {
        format!("b1 got no request after it came back: {seen:?}")
    })?;
    m.check_workers_unchanged()
}

/// A server the probes bring back is not held out by nginx's passive failure count: the requests
/// that failed during its outage counted `fails` (here `max_fails=1 fail_timeout=10s`), which
/// would keep it skipped for `fail_timeout` after the probes say it is healthy again.
pub(super) fn case_recovered_server_is_not_held_out_by_its_passive_fails() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let port = b1.port;
    let conf = format!(
        "upstream app {{ zone app 256k; \
         server 127.0.0.1:{port} max_fails=1 fail_timeout=10s; \
         server 127.0.0.1:{} max_fails=1 fail_timeout=10s; \
         probe uri=/healthz interval=1s timeout=500ms fails=1 passes=1; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n",
        b2.port
    );
    let m = Master::start(&conf)?;
    m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    until_health(&m, port, "healthy", Duration::from_secs(3))?;
    both_workers_answer(&m, &["b1", "b2"], 5)?;
    // b1's port closes: the requests nginx sends it before the next probe fail (and go on to b2).
    drop(b1);
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..10 {
        let (_, body) = m.front()?;
        check(body == "b2", || format!("answer {body:?} while b1 is down"))?;
    }
    until_health(&m, port, "unhealthy", Duration::from_secs(3))?;
    let s = server_view(&m, port)?;
    check(s["fails"].as_u64() >= Some(1), || {
        format!("no passive failure was counted for b1: {s}")
    })?;
    let b1 = Backend::start_at("b1", port)?;
    let back = until_health(&m, port, "healthy", Duration::from_secs(3))?;
    let t = Instant::now();
    while b1.proxied.load(Ordering::SeqCst) == 0 {
        check(t.elapsed() < Duration::from_secs(2), || {
            format!(
                "b1 healthy again (after {back:?}) but got no request in 2 s: {}",
                server_view(&m, port)
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            )
        })?;
        m.front()?;
    }
    m.check_workers_unchanged()
}

pub(super) fn case_hung_server_is_marked_unhealthy_by_the_timeout() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let m = Master::start(&conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=200ms timeout=100ms fails=2 passes=1",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    b1.set(HANG);
    until_health(&m, b1.port, "unhealthy", Duration::from_millis(1400))?;
    let s = server_view(&m, b1.port)?;
    check(
        s["last_error"] == "timeout" && s.get("last_status").is_none(),
        || format!("{s}"),
    )?;
    both_workers_answer(&m, &["b2"], 10)?;
    m.check_workers_unchanged()
}

pub(super) fn case_closed_port_is_unhealthy_with_type_tcp() -> CaseResult {
    let b2 = Backend::start("b2")?;
    // A port nobody listens on: bound, then closed.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        l.local_addr().map_err(|e| e.to_string())?.port()
    };
    let m = Master::start(&conf(
        &[dead, b2.port],
        "type=tcp interval=200ms timeout=100ms fails=1 passes=1",
    ))?;
    until_health(&m, dead, "unhealthy", Duration::from_millis(1200))?;
    let s = server_view(&m, dead)?;
    check(
        s["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("connect: connection refused")),
        || format!("{s}"),
    )?;
    // Probes of a round are spread over half an interval: b2's may come a little later.
    let t = Instant::now();
    let ok = loop {
        let ok = server_view(&m, b2.port)?;
        if ok["probe_passes"].as_u64() >= Some(1) || t.elapsed() > Duration::from_secs(1) {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    check(
        ok["health"] == "healthy" && ok["probe_passes"].as_u64() >= Some(1),
        || format!("{ok}"),
    )?;
    // type=tcp sends no request: the backend saw connections, never a probe request.
    check(b2.probe_times().is_empty(), || {
        "type=tcp sent a request".into()
    })?;
    both_workers_answer(&m, &["b2"], 10)?;
    m.check_workers_unchanged()
}
