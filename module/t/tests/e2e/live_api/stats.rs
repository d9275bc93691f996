//! Per-server ids and statistics of live upstreams: `GET /api/NAME` shows `"id"` and
//! `"stats"` for every server. Ids are given when a server enters the set, kept across `PUT`s
//! that keep it and never given twice in the zone. The counters are added by both workers
//! (requests on new connections reach either worker through `reuseport`); the cases send a
//! known number of requests of each kind and compare the sums.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::case::Case;
use ngx_harness::{check, check_eq, http_request, CaseResult, Failed};

use super::helpers::*;
use super::master::Master;

/// Backends on `{P1}`…`{P3}` answering by path: `/ok` 200, `/nf` 404, `/err` 500, `/redir` 302.
fn by_path_backend(i: usize) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}};\n\
         location = /ok {{ return 200 \"ok{i}\\n\"; }}\n\
         location = /nf {{ return 404; }}\n\
         location = /err {{ return 500; }}\n\
         location = /redir {{ return 302 /ok; }}\n\
         }}\n"
    )
}

/// `app` (round robin) with `servers` of the backends; the front proxies `/` to it without
/// retries (so every request is one try), and `/api/` is the API.
fn conf(servers: &[usize], upstream_extra: &str) -> String {
    let list: String = servers
        .iter()
        .map(|i| format!("server 127.0.0.1:{{P{i}}};"))
        .collect();
    format!(
        "upstream app {{ zone app 1m; {list} {upstream_extra} }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream off; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n{}",
        (1..=3).map(by_path_backend).collect::<String>()
    )
}

/// `(address, id)` of the servers of `GET /api/app`.
fn ids(m: &Master) -> Result<Vec<(String, u64)>, Failed> {
    let v = m.get_json("/app")?;
    let servers = v["servers"].as_array().ok_or("no servers")?;
    servers
        .iter()
        .map(|s| {
            let a = s["address"].as_str().ok_or("no address")?.to_string();
            let id = s["id"]
                .as_u64()
                .ok_or_else(|| format!("server {a} has no id: {s}"))?;
            Ok((a, id))
        })
        .collect()
}

fn id_of(all: &[(String, u64)], address: &str) -> Result<u64, Failed> {
    all.iter()
        .find(|(a, _)| a == address)
        .map(|(_, id)| *id)
        .ok_or_else(|| format!("{address} not in {all:?}").into())
}

fn case_ids_are_kept_and_never_reused() -> CaseResult {
    let m = Master::start(&conf(&[1, 2], ""))?;
    let (a1, a2, a3) = (addr(&m, 1), addr(&m, 2), addr(&m, 3));
    let first = ids(&m)?;
    // The configured servers are the zone's first: 0 and 1.
    check_eq(
        first.clone(),
        vec![(a1.clone(), 0), (a2.clone(), 1)],
        "ids at start",
    )?;
    // Keep 1, drop 2, add 3.
    let r = m.put("app", &set_body(&m, &[1, 3], &[]))?;
    check_eq(r.status, 200, &format!("PUT 1,3: {}", r.text()))?;
    let second = ids(&m)?;
    check_eq(id_of(&second, &a1)?, 0, "id of the kept server")?;
    let id3 = id_of(&second, &a3)?;
    check(id3 >= 2, || format!("new server got id {id3}, used before"))?;
    // 2 comes back: a new id, not its old one.
    let r = m.put("app", &set_body(&m, &[1, 2, 3], &[]))?;
    check_eq(r.status, 200, &format!("PUT 1,2,3: {}", r.text()))?;
    let third = ids(&m)?;
    check_eq(id_of(&third, &a1)?, 0, "id of the kept server")?;
    check_eq(id_of(&third, &a3)?, id3, "id of server 3 kept")?;
    let id2 = id_of(&third, &a2)?;
    check(id2 != 1 && id2 != 0 && id2 != id3, || {
        format!("re-added server got id {id2}: ids seen {first:?} {second:?}")
    })?;
    // A server that moves to the backup list is a new peer: it gets a new id too, and all ids
    // of the set differ.
    let r = m.put("app", &set_body(&m, &[1, 2], &[3]))?;
    check_eq(r.status, 200, &format!("PUT 1,2 + backup 3: {}", r.text()))?;
    let fourth = ids(&m)?;
    let unique: BTreeSet<u64> = fourth.iter().map(|(_, id)| *id).collect();
    check_eq(unique.len(), fourth.len(), "ids are unique in the set")?;
    check(id_of(&fourth, &a3)? > id2, || {
        format!("server 3 moved to backup kept an old id: {fourth:?}")
    })?;
    // The GET answer with ids (and stats) is still a valid PUT body.
    let body = m.api("GET", "/app", "")?.text();
    let r = m.put("app", &body)?;
    check_eq(
        r.status,
        200,
        &format!("PUT of the GET answer: {}", r.text()),
    )?;
    check_eq(ids(&m)?, fourth, "ids after PUT of the GET answer")?;
    m.check_workers_unchanged()
}

/// The servers of `GET /api/app` by address.
fn servers(m: &Master) -> Result<BTreeMap<String, serde_json::Value>, Failed> {
    let v = m.get_json("/app")?;
    Ok(v["servers"]
        .as_array()
        .ok_or("no servers")?
        .iter()
        .map(|s| (s["address"].as_str().unwrap_or("?").to_string(), s.clone()))
        .collect())
}

/// `stats.<path>` of one server as a number (`responses.2xx` style paths).
fn stat(s: &serde_json::Value, path: &str) -> Result<u64, Failed> {
    let mut v = &s["stats"];
    for k in path.split('.') {
        v = &v[k];
    }
    v.as_u64()
        .ok_or_else(|| format!("no stats.{path} in {s}").into())
}

/// The sum of `stats.<path>` over the servers.
fn sum(all: &BTreeMap<String, serde_json::Value>, path: &str) -> Result<u64, Failed> {
    all.values().map(|s| stat(s, path)).sum()
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sends `GET path` to the front server (a new connection each); checks the status; returns
/// the worker that answered.
fn send(m: &Master, path: &str, status: u16) -> Result<u32, Failed> {
    let r = http_request(m.port(0), "GET", path, &[], b"")?;
    check_eq(r.status, status, &format!("status of {path}"))?;
    Ok(r.header("X-Worker")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

fn case_responses_are_counted_by_class_in_both_workers() -> CaseResult {
    let m = Master::start(&conf(&[1, 2], ""))?;
    let t0 = epoch_ms();
    let kinds = [
        ("/ok", 200u16, "2xx"),
        ("/nf", 404, "4xx"),
        ("/err", 500, "5xx"),
        ("/redir", 302, "3xx"),
    ];
    let mut sent: BTreeMap<&str, u64> = BTreeMap::new();
    let mut workers = BTreeSet::new();
    // Rounds of 6 × 200, 4 × 404, 3 × 500, 2 × 302 until both workers answered (one round is
    // nearly always enough; at most 20).
    for round in 0..20 {
        for (n, (path, status, class)) in [6, 4, 3, 2].into_iter().zip(kinds) {
            for _ in 0..n {
                workers.insert(send(&m, path, status)?);
                *sent.entry(class).or_default() += 1;
            }
        }
        if workers.len() == 2 {
            break;
        }
        check(round < 19, || format!("only worker {workers:?} answered"))?;
    }
    let t1 = epoch_ms();
    let all = servers(&m)?;
    let total: u64 = sent.values().sum();
    for (class, n) in &sent {
        check_eq(
            sum(&all, &format!("responses.{class}"))?,
            *n,
            &format!("{class} responses"),
        )?;
    }
    check_eq(sum(&all, "responses.1xx")?, 0, "1xx responses")?;
    check_eq(sum(&all, "responses.total")?, total, "responses total")?;
    check_eq(sum(&all, "requests")?, total, "requests")?;
    check_eq(
        sum(&all, "fails")?,
        0,
        "fails (no failed try: proxy_next_upstream off)",
    )?;
    for (a, s) in &all {
        let requests = stat(s, "requests")?;
        // Round robin over two servers gives each about half.
        check(requests >= total / 4, || {
            format!("{a} got {requests} of {total} requests")
        })?;
        check_eq(
            stat(s, "responses.total")?,
            requests,
            &format!("{a}: a response per request"),
        )?;
        let (sent_b, recv_b) = (stat(s, "sent")?, stat(s, "received")?);
        // Each request is at least `GET /ok HTTP/1.0\r\n` + Host (> 30 bytes); each answer at
        // least a status line and headers (> 60 bytes).
        check(sent_b > 30 * requests && recv_b > 60 * requests, || {
            format!("{a}: {sent_b} bytes sent, {recv_b} received for {requests} requests")
        })?;
        let selected = stat(s, "selected_ms")?;
        check(selected + 1000 >= t0 && selected <= t1 + 1000, || {
            format!("{a}: selected_ms {selected} not within the test's [{t0}, {t1}]")
        })?;
        check(stat(s, "response_time")? >= stat(s, "header_time")?, || {
            format!("{a}: response_time below header_time: {s}")
        })?;
        check_eq(stat(s, "unavail")?, 0, &format!("{a} unavail"))?;
        check_eq(stat(s, "downstart_ms")?, 0, &format!("{a} downstart_ms"))?;
        check(s["stats"].get("health_checks").is_none(), || {
            format!("{a}: health_checks without a probe: {s}")
        })?;
    }
    m.check_workers_unchanged()
}

fn case_a_dead_server_fails_and_becomes_unavailable() -> CaseResult {
    let mut c = conf(&[1], "");
    c = c.replace(
        "server 127.0.0.1:{P1};",
        "server 127.0.0.1:{P1}; server 127.0.0.1:{DEAD};",
    );
    let m = Master::start(&c)?;
    m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let dead = format!("127.0.0.1:{}", m.dead);
    let t0 = epoch_ms();
    // max_fails=1, fail_timeout=10s: the first request that reaches the dead server fails (502,
    // no retry) and takes it out for 10 s in every worker; the others go to server 1.
    let mut failed = 0;
    for _ in 0..10 {
        let r = http_request(m.port(0), "GET", "/ok", &[], b"")?;
        match r.status {
            200 => {}
            502 => failed += 1,
            s => return Err(format!("status {s}").into()),
        }
    }
    check_eq(failed, 1, "502 answers (the dead server's one try)")?;
    let all = servers(&m)?;
    let d = all.get(&dead).ok_or("no dead server")?;
    check_eq(stat(d, "requests")?, 1, "dead server requests")?;
    check_eq(stat(d, "fails")?, 1, "dead server fails")?;
    check_eq(stat(d, "unavail")?, 1, "dead server unavail")?;
    check_eq(stat(d, "responses.total")?, 0, "dead server responses")?;
    check_eq(stat(d, "received")?, 0, "dead server bytes received")?;
    let down = stat(d, "downstart_ms")?;
    check(down + 1000 >= t0 && down <= epoch_ms() + 1000, || {
        format!("dead server downstart_ms {down}, test began at {t0}")
    })?;
    let live = all.get(&addr(&m, 1)).ok_or("no server 1")?;
    check_eq(stat(live, "requests")?, 9, "server 1 requests")?;
    check_eq(stat(live, "responses.2xx")?, 9, "server 1 2xx")?;
    check_eq(stat(live, "fails")?, 0, "server 1 fails")?;
    m.check_workers_unchanged()
}

fn case_counters_follow_the_set_and_a_reload_restarts_them() -> CaseResult {
    let c = conf(&[1, 2], "");
    let mut m = Master::start(&c)?;
    let (a1, a2, a3) = (addr(&m, 1), addr(&m, 2), addr(&m, 3));
    for _ in 0..10 {
        send(&m, "/ok", 200)?;
    }
    let before = servers(&m)?;
    let r1 = stat(&before[&a1], "requests")?;
    let r2 = stat(&before[&a2], "requests")?;
    check_eq(r1 + r2, 10, "requests before the PUT")?;
    check(r2 > 0, || "server 2 got no request".into())?;
    // Keep 1 (with another weight), remove 2, add 3.
    let body = format!(r#"{{"servers":[{{"address":"{a1}","weight":2}},{{"address":"{a3}"}}]}}"#);
    let r = m.put("app", &body)?;
    check_eq(r.status, 200, &format!("PUT: {}", r.text()))?;
    let after = servers(&m)?;
    check_eq(
        after[&a1]["stats"].clone(),
        before[&a1]["stats"].clone(),
        "the kept server's statistics",
    )?;
    check_eq(
        stat(&after[&a3], "requests")?,
        0,
        "the new server's requests",
    )?;
    check(!after.contains_key(&a2), || "server 2 still listed".into())?;
    for _ in 0..9 {
        send(&m, "/ok", 200)?;
    }
    let more = servers(&m)?;
    check_eq(
        stat(&more[&a1], "requests")? + stat(&more[&a3], "requests")?,
        r1 + 9,
        "requests after 9 more",
    )?;
    // Server 2 comes back: new counters, not its old ones.
    let r = m.put("app", &set_body(&m, &[1, 2, 3], &[]))?;
    check_eq(r.status, 200, &format!("PUT back: {}", r.text()))?;
    let back = servers(&m)?;
    check_eq(
        stat(&back[&a2], "requests")?,
        0,
        "re-added server's requests",
    )?;
    check_eq(
        stat(&back[&a2], "responses.total")?,
        0,
        "re-added server's responses",
    )?;
    // A reload makes a new zone: counters (and ids) start again.
    m.reload(&c)?;
    let fresh = servers(&m)?;
    check_eq(sum(&fresh, "requests")?, 0, "requests after a reload")?;
    check_eq(
        ids(&m)?,
        vec![(a1.clone(), 0), (a2.clone(), 1)],
        "ids after a reload",
    )?;
    m.check_workers_unchanged()
}

/// A test-owned backend that answers every request with its header after `header` and its
/// body after `body` more (then closes).
fn slow_backend(header: Duration, body: Duration) -> Result<u16, Failed> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                std::thread::sleep(header);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
                );
                let _ = s.flush();
                std::thread::sleep(body);
                let _ = s.write_all(b"slow\n");
            });
        }
    });
    Ok(port)
}

fn case_times_are_means_over_the_responses() -> CaseResult {
    let port = slow_backend(Duration::from_millis(150), Duration::from_millis(150))?;
    let c = format!(
        "upstream app {{ zone app 1m; server 127.0.0.1:{port}; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream off; proxy_buffering off; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n"
    );
    let m = Master::start(&c)?;
    let t = Instant::now();
    for _ in 0..3 {
        let r = http_request(m.port(0), "GET", "/t", &[], b"")?;
        check_eq(r.text(), "slow\n".to_string(), "answer")?;
    }
    let took = t.elapsed().as_millis() as u64;
    let all = servers(&m)?;
    let s = all.values().next().ok_or("no server")?;
    check_eq(stat(s, "responses.2xx")?, 3, "2xx")?;
    let (h, r) = (stat(s, "header_time")?, stat(s, "response_time")?);
    // Each answer's header came after 150 ms and its end 150 ms later; nginx's clock is
    // coarse (its cached time), so allow 10 ms below, and above no more than the whole test.
    check(h >= 140 && h <= took, || {
        format!("header_time {h} ms (3 requests took {took} ms)")
    })?;
    check(r >= 290 && r <= took, || {
        format!("response_time {r} ms (3 requests took {took} ms)")
    })?;
    check(r >= h + 140, || {
        format!("response_time {r} not 150 ms after header_time {h}")
    })?;
    m.check_workers_unchanged()
}

fn case_health_checks_are_counted_per_server() -> CaseResult {
    let c = conf(
        &[1],
        "probe uri=/ok interval=200ms timeout=150ms fails=1 passes=1;",
    )
    .replace(
        "server 127.0.0.1:{P1};",
        "server 127.0.0.1:{P1}; server 127.0.0.1:{DEAD};",
    );
    let m = Master::start(&c)?;
    let t0 = epoch_ms();
    let dead = format!("127.0.0.1:{}", m.dead);
    let live = addr(&m, 1);
    // Wait for 3 probes of each server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let all = loop {
        let all = servers(&m)?;
        let checks = |a: &str| {
            all.get(a)
                .and_then(|s| s["stats"]["health_checks"]["checks"].as_u64())
                .unwrap_or(0)
        };
        if checks(&dead) >= 3 && checks(&live) >= 3 {
            break all;
        }
        check(Instant::now() < deadline, || {
            format!("not 3 probes of each server in 10 s: {all:?}")
        })?;
        std::thread::sleep(Duration::from_millis(100));
    };
    let hc = |a: &str, k: &str| all[a]["stats"]["health_checks"][k].clone();
    let n_live = hc(&live, "checks").as_u64().unwrap_or(0);
    check_eq(
        hc(&live, "fails"),
        serde_json::json!(0),
        "live server's failed probes",
    )?;
    check_eq(
        hc(&live, "unhealthy"),
        serde_json::json!(0),
        "live server unhealthy",
    )?;
    check_eq(
        hc(&live, "last_passed"),
        serde_json::json!(true),
        "live server last_passed",
    )?;
    check(n_live >= 3, || format!("live server checks {n_live}"))?;
    check_eq(
        hc(&dead, "fails"),
        hc(&dead, "checks"),
        "dead server: every probe failed",
    )?;
    check_eq(
        hc(&dead, "unhealthy"),
        serde_json::json!(1),
        "dead server unhealthy",
    )?;
    check_eq(
        hc(&dead, "last_passed"),
        serde_json::json!(false),
        "dead server last_passed",
    )?;
    // Unhealthy is a down spell.
    let down = stat(&all[&dead], "downstart_ms")?;
    check(down + 1000 >= t0, || {
        format!("dead server downstart_ms {down}")
    })?;
    check_eq(
        stat(&all[&live], "downstart_ms")?,
        0,
        "live server downstart_ms",
    )?;
    m.check_workers_unchanged()
}

pub fn trials() -> Vec<Case> {
    vec![
        Case::test(
            "stats_ids_are_kept_and_never_reused",
            case_ids_are_kept_and_never_reused,
        ),
        Case::test(
            "stats_responses_are_counted_by_class_in_both_workers",
            case_responses_are_counted_by_class_in_both_workers,
        ),
        Case::test(
            "stats_a_dead_server_fails_and_becomes_unavailable",
            case_a_dead_server_fails_and_becomes_unavailable,
        ),
        Case::test(
            "stats_counters_follow_the_set_and_a_reload_restarts_them",
            case_counters_follow_the_set_and_a_reload_restarts_them,
        ),
        Case::test(
            "stats_times_are_means_over_the_responses",
            case_times_are_means_over_the_responses,
        ),
        Case::test(
            "stats_health_checks_are_counted_per_server",
            case_health_checks_are_counted_per_server,
        ),
    ]
}
