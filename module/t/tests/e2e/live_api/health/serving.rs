//! What the probes change in serving (the backup, slow start) and the directive's parameters and
//! refusals.

use super::*;
use crate::live_api::helpers::both_workers_answer;
use ngx_harness::config_test;

pub(super) fn case_backup_serves_when_primaries_are_unhealthy_and_none_gives_502() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let http = conf(
        &[b1.port],
        "uri=/healthz interval=200ms timeout=100ms fails=1 passes=1",
    )
    .replace(
        &format!("server 127.0.0.1:{} max_fails=0; ", b1.port),
        &format!(
            "server 127.0.0.1:{} max_fails=0; server 127.0.0.1:{} backup max_fails=0; ",
            b1.port, b2.port
        ),
    );
    let m = Master::start(&http)?;
    m.expect_log("no live upstreams while connecting to upstream");
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1"], 5)?;
    b1.set(FAIL_503);
    until_health(&m, b1.port, "unhealthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b2"], 10)?;
    // Everything unhealthy: nginx's answer when every server is down (502).
    b2.set(FAIL_503);
    until_health(&m, b2.port, "unhealthy", Duration::from_secs(2))?;
    for _ in 0..10 {
        let r = ngx_harness::http_request(m.port(0), "GET", "/", &[], b"")?;
        check(r.status == 502, || {
            format!("every server unhealthy: {} {}", r.status, r.text())
        })?;
    }
    check(m.error_log().contains("no live upstreams"), || {
        "no \"no live upstreams\" line".into()
    })?;
    b1.set(OK);
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1"], 5)?;
    m.check_workers_unchanged()
}

/// Share of `name` among `answers` (time since the PUT answer, body) in `[from, to)`.
fn share(answers: &[(Duration, String)], name: &str, from: Duration, to: Duration) -> (f64, usize) {
    let w: Vec<&(Duration, String)> = answers
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .collect();
    let hits = w.iter().filter(|(_, b)| b == name).count();
    (hits as f64 / w.len().max(1) as f64, w.len())
}

pub(super) fn case_slow_start_ramps_an_added_server() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    // Probes that a loaded machine cannot fail (1 s to answer, three misses): a server marked
    // unhealthy, or a lease that moves to the other worker when a tick comes late (a heartbeat
    // older than an interval), would change the shares this case measures, not the ramp.
    let m = Master::start(&conf(
        &[b1.port],
        "uri=/healthz interval=1s timeout=1s fails=3 slow_start=4s",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    put_servers(&m, &[(b1.port, 1), (b2.port, 1)])?;
    let t = Instant::now();
    let mut answers = Vec::new();
    let mut remaining_seen = None;
    while t.elapsed() < Duration::from_millis(5500) {
        let (_, body) = m.front()?;
        answers.push((t.elapsed(), body));
        if remaining_seen.is_none() && t.elapsed() > Duration::from_millis(100) {
            remaining_seen = server_view(&m, b2.port)?["slow_start_remaining_ms"].as_u64();
        }
    }
    let steady = 0.5;
    let (first, n1) = share(&answers, "b2", Duration::ZERO, Duration::from_millis(400));
    let (last, n2) = share(
        &answers,
        "b2",
        Duration::from_millis(4300),
        Duration::from_millis(5500),
    );
    let (mid, _) = share(
        &answers,
        "b2",
        Duration::from_millis(1800),
        Duration::from_millis(2200),
    );
    eprintln!(
        "slow start 4s: b2 share {first:.3} of {n1} requests in the first 400 ms, {mid:.3} around 2 s, \
         {last:.3} of {n2} after 4.3 s (steady {steady})"
    );
    check(first <= 0.15 * steady, || {
        format!("b2 got {first:.3} of the first 400 ms (at most 15 % of its steady share {steady})")
    })?;
    check((last - steady).abs() <= 0.05, || {
        format!("b2 got {last:.3} after the ramp, steady share {steady}")
    })?;
    check(mid > first && mid < last, || {
        format!("no ramp: {first:.3}, {mid:.3}, {last:.3}")
    })?;
    check(
        remaining_seen.is_some_and(|r| r > 3000 && r <= 4000),
        || format!("slow_start_remaining_ms right after the PUT: {remaining_seen:?}"),
    )?;
    let s = server_view(&m, b2.port)?;
    check(
        s["slow_start_remaining_ms"] == 0 && s["weight"] == 1,
        || format!("{s}"),
    )?;
    m.check_workers_unchanged()
}

pub(super) fn case_port_host_and_body_parameters() -> CaseResult {
    let b1 = Backend::start("b1")?;
    // Nothing listens on the servers' own ports: `port=` sends the probes to b1's.
    let dead: Vec<u16> = (0..2)
        .map(|_| {
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            Ok(l.local_addr().map_err(|e| e.to_string())?.port())
        })
        .collect::<Result<_, String>>()?;
    let m = Master::start(&conf(
        &dead,
        &format!(
            "uri=/healthz interval=200ms timeout=100ms port={} host=probe.example body=ok",
            b1.port
        ),
    ))?;
    until_health(&m, dead[0], "healthy", Duration::from_secs(2))?;
    let s = until_probed(&m, dead[1], Duration::from_secs(2))?;
    check(s["last_status"] == 200, || format!("{s}"))?;
    check(!b1.probe_times().is_empty(), || "b1 saw no probe".into())?;
    let host = b1.host.lock().unwrap_or_else(|e| e.into_inner()).clone();
    check(host == "probe.example", || format!("probe Host: {host:?}"))?;
    drop(m);
    // A body without the text fails the probe.
    let m = Master::start(&conf(
        &dead,
        &format!(
            "uri=/healthz interval=200ms timeout=100ms port={} body=ready",
            b1.port
        ),
    ))?;
    until_health(&m, dead[0], "unhealthy", Duration::from_secs(2))?;
    let s = server_view(&m, dead[0])?;
    check(
        s["last_error"] == "body mismatch" && s["last_status"] == 200,
        || format!("{s}"),
    )?;
    Ok(())
}

pub(super) fn case_refusal_names_the_upstream_file_and_line() -> CaseResult {
    let t = config_test(
        "upstream nz {\n server 127.0.0.1:1;\n probe uri=/h;\n}\nserver { listen 127.0.0.1:{P0}; location / { proxy_pass http://nz; } }",
    )?;
    check(!t.ok, || "nginx -t accepted probe without zone".into())?;
    let line = t
        .stderr
        .lines()
        .find(|l| l.contains("[emerg]"))
        .unwrap_or_default()
        .to_string();
    check(
        line.contains("\"probe\" in upstream \"nz\" needs a \"zone\" in ")
            && line.contains("nginx.conf:"),
        || format!("nginx said: {}", t.stderr),
    )
}
