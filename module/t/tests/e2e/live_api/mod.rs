//! Cases for the live upstream API (`upstreams_api;`) against Debian's nginx with the
//! module loaded, run with `master_process on` and 2 workers so every change must reach both
//! workers through the zone. Every row is a named test; run directly it ends with
//! `N passed, N failed`.
//!
//! Layout: the front server listens on `{P0}` (`reuseport`, so both workers accept) and
//! answers with `X-Worker: <pid>` and the backend's body; the API is `/api/` on `{P0}`;
//! backends `b1`…`b5` are `server {}` blocks of the same nginx on `{P1}`…`{P5}`; `{DEAD}` is a
//! port where nothing listens. The nginx runner (`Master`, in `live_api/master.rs`) belongs to
//! these tests: the harness's `Nginx` runs one process, and they need a master, its workers' PIDs
//! and reloads (`live_api/helpers.rs`: configurations, bodies, shared checks).

mod access;
mod churn;
mod drain;
mod health;
pub(crate) mod helpers;
mod liveness;
pub(crate) mod master;
mod plus;
mod plus_writes;
mod reload_race;
mod retired;
mod scale;
mod stats;
mod sticky;
mod zone_size;

use std::collections::BTreeMap;
use std::fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::case::Case;
use helpers::*;
use master::{Master, SlowBackend};
use ngx_harness::procfs::{self, Sig};
use ngx_harness::{check, check_eq, http_request, CaseResult, Completion, Failed};

/// `(major, minor, patch)` of the nginx under test (`nginx -v`).
fn nginx_version() -> Result<(u32, u32, u32), String> {
    let out = std::process::Command::new(ngx_harness::nginx_bin())
        .arg("-v")
        .output()
        .map_err(|e| format!("nginx -v: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = text
        .split("nginx/")
        .nth(1)
        .map(|v| v.split_whitespace().next().unwrap_or(""))
        .ok_or_else(|| format!("nginx -v said {text:?}"))?;
    let n: Vec<u32> = v.split('.').filter_map(|x| x.parse().ok()).collect();
    match n[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => Err(format!("nginx -v said {text:?}")),
    }
}

fn case_lists_upstreams_and_names_balancers() -> CaseResult {
    // From nginx 1.29.7 upstream `keepalive` is on by default, so every upstream is wrapped
    // unless it says `keepalive 0;` (which older nginx refuses): `tiny` says so there.
    let ka_default = nginx_version()? >= (1, 29, 7);
    let mut conf = standard();
    if ka_default {
        let plain = "zone tiny 32k;";
        check(conf.contains(plain), || {
            "standard() changed: no `zone tiny 32k;`".into()
        })?;
        conf = conf.replace(plain, "zone tiny 32k; keepalive 0;");
    }
    let m = Master::start(&conf)?;
    let list = m.get_json("/")?;
    let names: BTreeMap<String, String> = list["upstreams"]
        .as_array()
        .ok_or("no upstreams array")?
        .iter()
        .map(|u| {
            (
                u["name"].as_str().unwrap_or("").to_string(),
                u["balancer"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let ka_default = if ka_default { "+keepalive" } else { "" };
    let want: BTreeMap<String, String> = [
        ("app", format!("round_robin{ka_default}")),
        ("lc", format!("least_conn{ka_default}")),
        ("rk", "round_robin+keepalive".into()),
        ("lck", "least_conn+keepalive".into()),
        ("tiny", "round_robin".into()),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b))
    .collect();
    check_eq(names, want, "live upstreams and balancers")?;
    let app = m.get_json("/app")?;
    check_eq(addresses(&app), vec![addr(&m, 1)], "app servers")?;
    check_eq(app["retiring"].as_u64(), Some(0), "retiring")?;
    check_eq(app["servers"][0]["weight"].as_u64(), Some(1), "weight")?;
    check_eq(
        app["servers"][0]["fail_timeout_ms"].as_u64(),
        Some(10_000),
        "fail_timeout_ms",
    )?;
    check(app["generation"].as_u64().is_some(), || {
        "no generation".into()
    })?;
    Ok(())
}

fn case_put_reaches_every_worker_without_reload() -> CaseResult {
    let m = Master::start(&standard())?;
    both_workers_answer(&m, &["b1"], 5)?;
    let before = m.workers();
    let g0 = m.get_json("/app")?["generation"]
        .as_u64()
        .ok_or("no generation")?;
    let t0 = Instant::now();
    let r = m.put("app", &set_body(&m, &[2, 3], &[]))?;
    let put_done = Instant::now();
    check_eq(r.status, 200, &format!("PUT ({})", r.text()))?;
    let v = json(&r)?;
    check_eq(v["changed"].as_bool(), Some(true), "changed")?;
    check(v["generation"].as_u64() != Some(g0), || {
        "generation unchanged".into()
    })?;
    // Every answer after the PUT answer comes from the new set, in both workers; then 100 more
    // changes, each checked the same way, with the time from the PUT answer until both workers
    // answered from the new set, next to the same measure without a change (the baseline: the
    // time two workers take to answer at all).
    let first = until_both_answer(&m, &["b2", "b3"])?;
    let mut changed = vec![first];
    let mut baseline = Vec::new();
    for i in 0..100 {
        let (set, allowed): (&[usize], &[&str]) = if i % 2 == 0 {
            (&[4, 5], &["b4", "b5"])
        } else {
            (&[2, 3], &["b2", "b3"])
        };
        baseline.push(until_both_answer(
            &m,
            if i % 2 == 0 {
                &["b2", "b3"]
            } else {
                &["b4", "b5"]
            },
        )?);
        let r = m.put("app", &set_body(&m, set, &[]))?;
        check_eq(r.status, 200, "PUT")?;
        changed.push(until_both_answer(&m, allowed)?);
    }
    let stats = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[v.len() * 99 / 100], v[v.len() - 1])
    };
    let (c50, c99, cmax) = stats(&mut changed);
    let (b50, b99, bmax) = stats(&mut baseline);
    eprintln!(
        "PUT took {:?}; from the PUT answer until both workers answered from the new set ({} changes): \
         median {c50:?}, p99 {c99:?}, max {cmax:?}; baseline without a change (both workers answer): \
         median {b50:?}, p99 {b99:?}, max {bmax:?}; ratio of medians {:.2}",
        put_done - t0,
        changed.len(),
        c50.as_secs_f64() / b50.as_secs_f64().max(1e-9)
    );
    // Back to b2/b3 for the checks below.
    check_eq(
        m.put("app", &set_body(&m, &[2, 3], &[]))?.status,
        200,
        "PUT",
    )?;
    let seen = both_workers_answer(&m, &["b2", "b3"], 50)?;
    check_eq(seen.len(), 2, "workers answering")?;
    check_eq(m.workers(), before, "worker PIDs (no reload, no restart)")?;
    m.check_workers_unchanged()?;
    check(!m.error_log().contains("reconfiguring"), || {
        "nginx reloaded".into()
    })?;
    let app = m.get_json("/app")?;
    check_eq(
        addresses(&app),
        vec![addr(&m, 2), addr(&m, 3)],
        "GET after PUT",
    )?;
    Ok(())
}

fn case_identical_set_is_a_no_op() -> CaseResult {
    let m = Master::start(&standard())?;
    let r = json(&m.put("app", &set_body(&m, &[2, 3], &[4]))?)?;
    let g = r["generation"].as_u64();
    let r2 = json(&m.put("app", &set_body(&m, &[3, 2], &[4]))?)?;
    check_eq(
        r2["changed"].as_bool(),
        Some(false),
        "changed (same set, other order)",
    )?;
    check_eq(r2["generation"].as_u64(), g, "generation")?;
    Ok(())
}

fn case_servers_that_stay_keep_their_state() -> CaseResult {
    let m = Master::start(&standard())?;
    // A dead primary with max_fails=5 and a live one; requests fail over from the dead one.
    let body = |extra: &str| {
        format!(
            r#"{{"servers":[{{"address":"127.0.0.1:{}","max_fails":5,"fail_timeout_ms":60000}},{{"address":"127.0.0.1:{}"}}{extra}]}}"#,
            m.dead,
            m.port(1)
        )
    };
    check_eq(m.put("app", &body(""))?.status, 200, "PUT")?;
    for _ in 0..6 {
        let (_, b) = m.front()?;
        check_eq(b.as_str(), "b1", "answer while the dead server fails")?;
    }
    let fails = |v: &serde_json::Value| v["servers"][0]["fails"].as_u64().unwrap_or(0);
    let before = m.get_json("/app")?;
    check(fails(&before) >= 1, || {
        format!("dead server has no failures: {before}")
    })?;
    let r = m.put(
        "app",
        &body(&format!(r#",{{"address":"127.0.0.1:{}"}}"#, m.port(2))),
    )?;
    check_eq(r.status, 200, "PUT adding b2")?;
    let after = m.get_json("/app")?;
    check_eq(
        fails(&after),
        fails(&before),
        "failures of the server that stayed",
    )?;
    check_eq(addresses(&after).len(), 3, "servers")?;
    // A changed setting of a staying server is applied; its failures stay too.
    let r = m.put("app", &format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}","max_fails":5,"fail_timeout_ms":60000,"down":true}},{{"address":"127.0.0.1:{}"}}]}}"#,
        m.dead, m.port(1)
    ))?;
    check_eq(r.status, 200, "PUT marking it down")?;
    let down = m.get_json("/app")?;
    check_eq(down["servers"][0]["down"].as_bool(), Some(true), "down")?;
    check_eq(
        fails(&down),
        fails(&before),
        "failures after a settings change",
    )?;
    Ok(())
}

fn case_concurrent_compare_and_set_has_one_winner() -> CaseResult {
    // 8 clients PUT different sets with the same generation at once (both workers take some):
    // exactly one gets 200, the others 409, and the set is the winner's.
    let m = Master::start(&standard())?;
    for round in 0..5 {
        let g = m.get_json("/app")?["generation"]
            .as_u64()
            .ok_or("no generation")?;
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (port, barrier) = (m.port(0), barrier.clone());
                let body = format!(
                    r#"{{"servers":[{{"address":"10.7.{round}.{}:80"}}],"generation":{g}}}"#,
                    i + 1
                );
                std::thread::spawn(move || {
                    barrier.wait();
                    http_request(port, "PUT", "/api/app", &[], body.as_bytes())
                        .map(|r| (i, r.status))
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in threads {
            let (i, status) = t.join().map_err(|_| "PUT thread panicked")??;
            match status {
                200 => winners.push(i),
                409 => {}
                other => return Err(format!("PUT {i}: status {other}").into()),
            }
        }
        check_eq(
            winners.len(),
            1,
            &format!("round {round}: PUTs answered 200"),
        )?;
        check_eq(
            addresses(&m.get_json("/app")?),
            vec![format!("10.7.{round}.{}:80", winners[0] + 1)],
            "the set is the winner's",
        )?;
    }
    m.check_workers_unchanged()
}

fn case_workers_killed_under_traffic_and_puts() -> CaseResult {
    // SIGKILL a worker every 50 ms, 20 times, while clients send requests and the set changes
    // every 20 ms; afterwards the master's new workers serve and the API works.
    let mut m = Master::start(&standard())?;
    // The case SIGKILLs workers: the master logs each as "exited on signal 9".
    m.expect_log("exited on signal 9");
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for _ in 0..3 {
        let (stop, port) = (stop.clone(), m.port(0));
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let _ = http_request(port, "GET", "/", &[], b"");
            }
        }));
    }
    {
        let (stop, port) = (stop.clone(), m.port(0));
        let bodies = [
            set_body(&m, &[1, 2], &[3]),
            set_body(&m, &[2], &[]),
            set_body(&m, &[1, 2, 3, 4], &[5]),
        ];
        threads.push(std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let _ = http_request(port, "PUT", "/api/app", &[], bodies[i % 3].as_bytes());
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    // A count of kills, not a time: on a loaded machine a time-boxed loop killed too few. Each
    // kill hits a live (non-zombie) worker; the deadline only bounds a master that stops
    // starting workers.
    let (mut kills, deadline) = (0, Instant::now() + Duration::from_secs(30));
    while kills < 20 && Instant::now() < deadline {
        if let Some(w) = m.workers().into_iter().next() {
            if procfs::signal(w, Sig::Kill) {
                kills += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    check(kills >= 20, || {
        format!("only {kills} workers killed in 30 s: the master stopped starting workers?")
    })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.workers().len() != 2 {
        check(Instant::now() < deadline, || {
            "the master did not restart 2 workers".into()
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    check_eq(
        m.put("app", &set_body(&m, &[4], &[]))?.status,
        200,
        "PUT after the kills",
    )?;
    both_workers_answer(&m, &["b4"], 10)?;
    check_eq(
        addresses(&m.get_json("/app")?),
        vec![addr(&m, 4)],
        "GET after the kills",
    )?;
    eprintln!("{kills} workers killed with SIGKILL; nginx serves and the API answers");
    Ok(())
}

fn case_round_robin_position_is_kept() -> CaseResult {
    // Smooth weighted round robin over b1, b2 (weights 1): the first pick is b1, leaving b1's
    // current weight at -1 and b2's at +1. Adding b3 while keeping that state makes b2 the next
    // pick; a set that restarted the weights would pick b1 again.
    let m = Master::start(&standard())?;
    check_eq(
        m.put("app", &set_body(&m, &[1, 2], &[]))?.status,
        200,
        "PUT b1 b2",
    )?;
    check_eq(m.front()?.1.as_str(), "b1", "first pick")?;
    check_eq(
        m.put("app", &set_body(&m, &[1, 2, 3], &[]))?.status,
        200,
        "PUT b1 b2 b3",
    )?;
    check_eq(m.front()?.1.as_str(), "b2", "pick after adding b3")?;
    check_eq(m.front()?.1.as_str(), "b3", "next pick")?;
    Ok(())
}

fn case_busy_server_is_retired_then_freed() -> CaseResult {
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

fn case_request_between_tries_continues_in_a_grown_set() -> CaseResult {
    // A request holds server F (3 servers, its tried bitmap is one word); the set is replaced
    // by 70 servers (69 of them down) without F; F then fails the request, whose next try must
    // be made from the new set with balancer data sized for it.
    let m = Master::start(&standard())?;
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

fn case_request_gets_the_tries_of_a_grown_set() -> CaseResult {
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

fn case_large_set_from_a_body_in_a_temp_file() -> CaseResult {
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

fn case_request_keeps_its_tries_when_the_set_shrinks_to_one() -> CaseResult {
    // A request holds F in [F, b1]; the set becomes [b2] (a single server); F then fails the
    // request, which must still take its second try (in the new set).
    let m = Master::start(&standard())?;
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

fn case_compare_and_set_conflict() -> CaseResult {
    let m = Master::start(&standard())?;
    let g = m.get_json("/app")?["generation"]
        .as_u64()
        .ok_or("no generation")?;
    let with_gen = |servers: &[usize], g: u64| {
        let b = set_body(&m, servers, &[]);
        format!("{},\"generation\":{g}}}", &b[..b.len() - 1])
    };
    let r = m.put("app", &with_gen(&[2], g))?;
    check_eq(
        r.status,
        200,
        &format!("PUT with the current generation ({})", r.text()),
    )?;
    let r = m.put("app", &with_gen(&[3], g))?;
    check_eq(r.status, 409, "PUT with a stale generation")?;
    check(r.text().contains("generation is"), || {
        format!("409 text: {}", r.text())
    })?;
    check_eq(
        addresses(&m.get_json("/app")?),
        vec![addr(&m, 2)],
        "set after the conflict",
    )?;
    Ok(())
}

fn case_bad_inputs_change_nothing() -> CaseResult {
    let m = Master::start(&standard())?;
    check_eq(
        m.put("app", &set_body(&m, &[2, 3], &[4]))?.status,
        200,
        "PUT",
    )?;
    let before = m.get_json("/app")?;
    let many: Vec<String> = (0..16_385)
        .map(|i| format!(r#"{{"address":"10.1.{}.{}:80"}}"#, i / 250, i % 250 + 1))
        .collect();
    let tiny_many: Vec<String> = (0..300)
        .map(|i| format!(r#"{{"address":"10.1.{}.{}:80"}}"#, i / 250, i % 250 + 1))
        .collect();
    let huge = format!(
        r#"{{"servers":[{{"address":"10.0.0.1:80"}}]{}}}"#,
        " ".repeat(4 * 1024 * 1024)
    );
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("PUT", "/app", "{\"servers\":".into(), 400, "bad JSON"),
        ("PUT", "/app", "".into(), 400, "empty body"),
        (
            "PUT",
            "/nope",
            set_body(&m, &[1], &[]),
            404,
            "no upstream \\\"nope\\\"",
        ),
        (
            "PUT",
            "/nozone",
            set_body(&m, &[1], &[]),
            409,
            "has no zone",
        ),
        ("PUT", "/ih", set_body(&m, &[1], &[]), 409, "ip_hash"),
        (
            "PUT",
            "/hs",
            set_body(&m, &[1], &[]),
            409,
            "hash consistent",
        ),
        ("PUT", "/rnd", set_body(&m, &[1], &[]), 409, "random"),
        (
            "PUT",
            "/app",
            r#"{"servers":[{"address":"localhost:80"}]}"#.into(),
            400,
            "addresses only",
        ),
        (
            "PUT",
            "/app",
            format!(r#"{{"servers":[{}]}}"#, many.join(",")),
            400,
            "at most 16384",
        ),
        ("PUT", "/app", huge, 413, "larger than"),
        (
            "PUT",
            "/tiny",
            format!(r#"{{"servers":[{}]}}"#, tiny_many.join(",")),
            507,
            "too small: about",
        ),
        ("DELETE", "/app", String::new(), 405, "GET or PUT"),
        ("POST", "/", String::new(), 405, "use GET"),
        ("GET", "/a/b", String::new(), 404, "no such API resource"),
    ];
    for (method, path, body, status, text) in cases {
        let r = m.api(method, path, &body)?;
        check_eq(r.status, status, &format!("{method} {path} ({})", r.text()))?;
        check(r.text().contains(text), || {
            format!("{method} {path}: {:?} lacks {text:?}", r.text())
        })?;
        check(r.header("Content-Type") == Some("application/json"), || {
            format!(
                "{method} {path}: content type {:?}",
                r.header("Content-Type")
            )
        })?;
        check_eq(
            &m.get_json("/app")?,
            &before,
            &format!("app after {method} {path}"),
        )?;
    }
    check_eq(
        addresses(&m.get_json("/tiny")?),
        vec![addr(&m, 1)],
        "tiny after the 507",
    )?;
    check_eq(
        m.get_json("/tiny?slab")?["alloc_failures"]
            .as_u64()
            .map(|f| f > 0),
        Some(true),
        "tiny zone saw the failed allocation",
    )?;
    check(!m.error_log().contains("no memory"), || {
        "a [crit] no-memory line for the refused change (the 507 says it)".into()
    })?;
    m.check_workers_unchanged()
}

fn case_reload_restores_the_configured_set() -> CaseResult {
    let mut m = Master::start(&standard())?;
    let g0 = m.get_json("/app")?["generation"].as_u64();
    check_eq(
        m.put("app", &set_body(&m, &[2, 3], &[4]))?.status,
        200,
        "PUT",
    )?;
    check_eq(m.put("lc", &set_body(&m, &[5], &[]))?.status, 200, "PUT lc")?;
    std::thread::sleep(Duration::from_millis(5));
    let http = m.http.clone();
    m.reload(&http)?;
    let app = m.get_json("/app")?;
    check_eq(addresses(&app), vec![addr(&m, 1)], "app after reload")?;
    check_eq(
        addresses(&m.get_json("/lc")?),
        vec![addr(&m, 1)],
        "lc after reload",
    )?;
    check(app["generation"].as_u64() != g0, || {
        "generation repeated after reload".into()
    })?;
    both_workers_answer(&m, &["b1"], 5)?;
    // And live changes work on the new zone.
    check_eq(
        m.put("app", &set_body(&m, &[3], &[]))?.status,
        200,
        "PUT after reload",
    )?;
    both_workers_answer(&m, &["b3"], 5)?;
    m.check_workers_unchanged()
}

fn case_zone_memory_does_not_grow() -> CaseResult {
    let mut m = Master::start(&standard())?;
    // Warm-up: the first set with backups makes the backup list, which stays (it is small and
    // in-flight requests may point at it); from then on the figures must come back exactly.
    check_eq(
        m.put("app", &set_body(&m, &[1], &[2]))?.status,
        200,
        "warm-up PUT",
    )?;
    check_eq(
        m.put("app", &set_body(&m, &[1], &[]))?.status,
        200,
        "warm-up PUT back",
    )?;
    let base = slab(&m, "app")?;
    let big: Vec<usize> = vec![1, 2, 3, 4, 5];
    for round in 0..40 {
        let body = match round % 4 {
            0 => set_body(&m, &big, &[]),
            1 => {
                // many distinct addresses, some backups
                let s: Vec<String> = (0..60)
                    .map(|i| {
                        format!(
                            r#"{{"address":"10.9.{round}.{}:80","backup":{}}}"#,
                            i + 1,
                            i % 3 == 0
                        )
                    })
                    .collect();
                format!(r#"{{"servers":[{}]}}"#, s.join(","))
            }
            2 => set_body(&m, &[2], &[3, 4]),
            _ => set_body(&m, &[1], &[]),
        };
        let r = m.put("app", &body)?;
        check_eq(r.status, 200, &format!("PUT round {round} ({})", r.text()))?;
    }
    // Back to the configured set, with traffic in between.
    both_workers_answer(&m, &["b1"], 3)?;
    let after_puts = slab(&m, "app")?;
    check_eq(
        after_puts,
        base,
        "slab (chunks used, free pages) after 40 PUTs",
    )?;
    let http = m.http.clone();
    let mut after_reloads = Vec::new();
    for _ in 0..3 {
        m.reload(&http)?;
        for i in 0..5 {
            check_eq(
                m.put("app", &set_body(&m, &[1 + i % 5], &[6]))?.status,
                200,
                "PUT between reloads",
            )?;
        }
        check_eq(
            m.put("app", &set_body(&m, &[1], &[]))?.status,
            200,
            "PUT back",
        )?;
        after_reloads.push(slab(&m, "app")?);
    }
    check(after_reloads.windows(2).all(|w| w[0] == w[1]), || {
        format!("slab after each reload cycle: {after_reloads:?}")
    })?;
    check_eq(
        after_reloads[0],
        base,
        "slab after a reload and the same changes",
    )?;
    m.check_workers_unchanged()
}

fn case_servers_from_the_api_take_the_memory_of_configured_ones() -> CaseResult {
    // A server the API adds takes exactly the zone memory a configured server takes (the zone
    // module's layout: peer, address, name, server string and, in nginx builds with sticky
    // sessions, a `sid` buffer), and freeing any of them returns all of it: otherwise the
    // figures of `zone_memory_does_not_grow` could balance a leak against a smaller peer.
    let conf = |servers: &[usize]| {
        let list: String = servers
            .iter()
            .map(|i| format!(" server 127.0.0.1:{{P{i}}};"))
            .collect();
        format!(
            "upstream solo {{ zone solo 64k;{list} }}\n{}",
            front("solo", "")
        )
    };
    let mut m = Master::start(&conf(&[1, 2, 3]))?;
    let three = slab(&m, "solo")?;
    m.reload(&conf(&[1, 2]))?;
    let two = slab(&m, "solo")?;
    let per_configured = three
        .0
        .checked_sub(two.0)
        .ok_or("3 servers use fewer chunks than 2")?;
    check(per_configured > 0, || {
        "a configured server uses no chunk".into()
    })?;
    // Replace both configured servers by two others, then add a third.
    check_eq(
        m.put("solo", &set_body(&m, &[4, 5], &[]))?.status,
        200,
        "PUT b4 b5",
    )?;
    both_workers_answer(&m, &["b4", "b5"], 2)?;
    let two_api = slab(&m, "solo")?;
    check_eq(
        two_api,
        two,
        "slab with 2 servers from the API vs 2 configured",
    )?;
    check_eq(
        m.put("solo", &set_body(&m, &[3, 4, 5], &[]))?.status,
        200,
        "PUT b3 b4 b5",
    )?;
    let three_api = slab(&m, "solo")?;
    check_eq(
        three_api.0 - two_api.0,
        per_configured,
        "chunks of one server from the API vs one configured",
    )?;
    m.check_workers_unchanged()
}

fn case_least_conn_and_keepalive_take_live_changes() -> CaseResult {
    for up in ["lc", "rk", "lck"] {
        let m = Master::start(&format!(
            "upstream lc {{ zone app 64k; least_conn; server 127.0.0.1:{{P1}}; }}\n\
             upstream rk {{ zone rk 64k; server 127.0.0.1:{{P1}}; keepalive 4; }}\n\
             upstream lck {{ zone rk; least_conn; server 127.0.0.1:{{P1}}; keepalive 4; }}\n{}",
            front(
                up,
                "proxy_http_version 1.1; proxy_set_header Connection \"\";"
            )
        ))?;
        both_workers_answer(&m, &["b1"], 5)?;
        check_eq(
            m.put(up, &set_body(&m, &[2, 3], &[4]))?.status,
            200,
            &format!("PUT {up}"),
        )?;
        let seen = both_workers_answer(&m, &["b2", "b3"], 30)?;
        check_eq(seen.len(), 2, "workers")?;
        // Only the backup left alive: the dead primary fails over to it.
        let body = format!(
            r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}","backup":true}}]}}"#,
            m.dead,
            m.port(4)
        );
        check_eq(
            m.put(up, &body)?.status,
            200,
            &format!("PUT {up} dead+backup"),
        )?;
        both_workers_answer(&m, &["b4"], 5)?;
        m.check_workers_unchanged()?;
    }
    Ok(())
}

/// nginx 1.27.3+ resolves `server NAME resolve` names itself and rewrites the set from a timer:
/// such an upstream is refused (409), left out of `GET /`, and keeps its set. The resolver is a
/// port where nothing answers, so `localhost` never resolves and the upstream's servers stay the
/// configured address (b1) plus a name without addresses.
fn case_resolve_servers_are_refused() -> Result<Completion, Failed> {
    let v = nginx_version()?;
    if v < (1, 27, 3) {
        let why = format!(
            "nginx {}.{}.{} has no `server ... resolve` (open-source nginx has it from 1.27.3)",
            v.0, v.1, v.2
        );
        eprintln!("skipped: {why}");
        return Ok(Completion::ignored_with(why));
    }
    let conf = standard_for("rs").replace(
        "upstream app {",
        "upstream rs { zone rs 64k; resolver 127.0.0.1:{DEAD} valid=1s; resolver_timeout 1s;\n\
         server 127.0.0.1:{P1}; server localhost:{P2} resolve; }\n\
         upstream app {",
    );
    let mut m = Master::start(&conf)?;
    let refused = "upstream \"rs\" has servers with the \"resolve\" parameter";
    let check_refused = |what: &str, r: &ngx_harness::Response| -> CaseResult {
        check_eq(r.status, 409, &format!("{what} status ({})", r.text()))?;
        let msg = json(r)?["error"].as_str().unwrap_or("").to_string();
        check(msg.starts_with(refused), || {
            format!("{what}: error {msg:?} does not start with {refused:?}")
        })
    };
    let names = |m: &Master| -> Result<Vec<String>, Failed> {
        Ok(m.get_json("/")?["upstreams"]
            .as_array()
            .ok_or("no upstreams array")?
            .iter()
            .map(|u| u["name"].as_str().unwrap_or("").to_string())
            .collect())
    };
    let listed = names(&m)?;
    check(
        listed.iter().any(|n| n == "app") && !listed.iter().any(|n| n == "rs"),
        || format!("GET / lists {listed:?}: want app, not rs"),
    )?;
    both_workers_answer(&m, &["b1"], 3)?;
    check_refused("PUT rs", &m.put("rs", &set_body(&m, &[2, 3], &[4]))?)?;
    check_refused("GET rs", &m.api("GET", "/rs", "")?)?;
    // Nothing changed: both workers still send every request to b1 only.
    both_workers_answer(&m, &["b1"], 10)?;
    // The other upstreams of the same configuration still take changes.
    check_eq(
        m.put("app", &set_body(&m, &[3], &[]))?.status,
        200,
        "PUT app",
    )?;
    // Still refused after a reload (the classification is made per configuration).
    let http = m.http.clone();
    m.reload(&http)?;
    check_refused(
        "PUT rs after a reload",
        &m.put("rs", &set_body(&m, &[2], &[]))?,
    )?;
    both_workers_answer(&m, &["b1"], 3)?;
    let log = m.error_log();
    check(!log.contains("[alert]") && !log.contains("[crit]"), || {
        format!("[alert] or [crit] in the error log:\n{log}")
    })?;
    m.check_workers_unchanged()?;
    Ok(Completion::Completed)
}

fn case_set_changes_under_traffic_with_retries() -> CaseResult {
    for up in ["app", "lck"] {
        set_changes_under_traffic_with_retries(up)
            .map_err(|e| format!("upstream {up}: {}", e.message().unwrap_or("failed")))?;
    }
    Ok(())
}

fn set_changes_under_traffic_with_retries(up: &str) -> CaseResult {
    // Many dead servers force each request through several tries, so sets change between a
    // request's init and its later tries; the set grows past 64 servers (the size where
    // nginx's tried bitmap stops fitting in one word) and shrinks again. Every request must get
    // 200: one given the small set's 5 tries and sent into the big set of fresh dead servers
    // continues with the big set's tries (it used to end with 502 after 5 dead servers, about
    // once in 20,000 requests under load).
    // A second access log of every request's status and tries, for the failure message.
    let base = standard_for(up);
    let plain_log = "access_log {PREFIX}/logs/up.log up;";
    check(base.contains(plain_log), || {
        "standard_for() changed: no up.log access_log".into()
    })?;
    let conf = base.replace(
        plain_log,
        &format!("{plain_log} access_log {{PREFIX}}/logs/tries.log tries;"),
    );
    let conf = format!(
        "log_format tries '$status $msec $pid u=$upstream_addr s=$upstream_status t=$upstream_connect_time';\n{conf}"
    );
    let m = Master::start(&conf)?;
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for _ in 0..4 {
        let (stop, bad, total, port) = (stop.clone(), bad.clone(), total.clone(), m.port(0));
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match http_request(port, "GET", "/", &[], b"") {
                    Ok(r) if r.status == 200 => {}
                    other => {
                        // What went wrong, for the failure message (a status and body, or the
                        // client's error).
                        let what = match other {
                            Ok(r) => format!("HTTP {} {:?}", r.status, r.text()),
                            Err(e) => format!("client error: {e:?}"),
                        };
                        if bad.fetch_add(1, Ordering::SeqCst) < 3 {
                            eprintln!("not 200: {what}");
                        }
                    }
                }
                total.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let dead_base = 20_000 + (m.dead as usize % 5000);
    for round in 0..60 {
        let n = if round % 2 == 0 { 100 } else { 3 };
        let mut s: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"address":"127.0.0.{}:{}"}}"#,
                    2 + i % 200,
                    dead_base + i
                )
            })
            .collect();
        s.push(format!(
            r#"{{"address":"127.0.0.1:{}"}}"#,
            m.port(1 + round % 5)
        ));
        s.push(format!(
            r#"{{"address":"127.0.0.1:{}","backup":true}}"#,
            m.port(1 + (round + 1) % 5)
        ));
        let r = m.put(up, &format!(r#"{{"servers":[{}]}}"#, s.join(",")))?;
        check_eq(r.status, 200, &format!("PUT round {round} ({})", r.text()))?;
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let (bad, total) = (bad.load(Ordering::SeqCst), total.load(Ordering::SeqCst));
    eprintln!("{total} requests during 60 set changes, {bad} not 200");
    check(total > 100, || format!("only {total} requests"))?;
    if bad > 0 {
        let tries = fs::read_to_string(m.dir.join("logs/tries.log")).unwrap_or_default();
        for line in tries.lines().filter(|l| !l.starts_with("200 ")).take(3) {
            eprintln!("access log of a request not answered 200: {line}");
        }
        let log = m.error_log();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("connect() failed (111"))
            .collect();
        eprintln!(
            "error log without the expected connection refusals (last 30 of {}):\n{}",
            lines.len(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        );
    }
    check_eq(bad, 0, "requests that did not end in 200")?;
    m.check_workers_unchanged()
}

/// The cases of this area, named without the area (`main.rs` adds it).
pub fn cases() -> Vec<Case> {
    let mut trials = vec![
        Case::emerg(
            "directive_takes_only_write_and_host",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api on; } }",
            "invalid parameter \"on\" in \"upstreams_api\" directive: the parameters are write=on|off, host=NAME and retired_warn=TIME|off",
        ),
        Case::emerg(
            "directive_retired_warn_takes_a_time_or_off",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api retired_warn=1d; } }",
            "invalid parameter \"retired_warn=1d\" in \"upstreams_api\" directive: retired_warn takes a time",
        ),
        Case::emerg(
            "directive_write_takes_on_or_off",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api write=yes; } }",
            "invalid parameter \"write=yes\" in \"upstreams_api\" directive: write takes on or off",
        ),
        Case::emerg(
            "directive_host_takes_no_port",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api write=on host=api:80; } }",
            "invalid parameter \"host=api:80\" in \"upstreams_api\" directive: host takes a host name",
        ),
        Case::emerg(
            "directive_once_per_location",
            "server { listen 127.0.0.1:{P0}; location /api/ { upstreams_api; upstreams_api write=on; } }",
            "\"upstreams_api\" directive is duplicate",
        ),
        Case::emerg(
            "directive_only_in_a_location",
            "server { listen 127.0.0.1:{P0}; upstreams_api; }",
            "\"upstreams_api\" directive is not allowed here",
        ),
        Case::test(
            "lists_upstreams_and_names_balancers",
            case_lists_upstreams_and_names_balancers,
        ),
        Case::test(
            "put_reaches_every_worker_without_reload",
            case_put_reaches_every_worker_without_reload,
        ),
        Case::test("identical_set_is_a_no_op", case_identical_set_is_a_no_op),
        Case::test(
            "servers_that_stay_keep_their_state",
            case_servers_that_stay_keep_their_state,
        ),
        Case::test(
            "busy_server_is_retired_then_freed",
            case_busy_server_is_retired_then_freed,
        ),
        Case::test("compare_and_set_conflict", case_compare_and_set_conflict),
        Case::test(
            "request_keeps_its_tries_when_the_set_shrinks_to_one",
            case_request_keeps_its_tries_when_the_set_shrinks_to_one,
        ),
        Case::test(
            "round_robin_position_is_kept",
            case_round_robin_position_is_kept,
        ),
        Case::test(
            "workers_killed_under_traffic_and_puts",
            case_workers_killed_under_traffic_and_puts,
        ),
        Case::test(
            "concurrent_compare_and_set_has_one_winner",
            case_concurrent_compare_and_set_has_one_winner,
        ),
        Case::test(
            "large_set_from_a_body_in_a_temp_file",
            case_large_set_from_a_body_in_a_temp_file,
        ),
        Case::test(
            "request_gets_the_tries_of_a_grown_set",
            case_request_gets_the_tries_of_a_grown_set,
        ),
        Case::test(
            "request_between_tries_continues_in_a_grown_set",
            case_request_between_tries_continues_in_a_grown_set,
        ),
        Case::test("bad_inputs_change_nothing", case_bad_inputs_change_nothing),
        Case::test(
            "reload_restores_the_configured_set",
            case_reload_restores_the_configured_set,
        ),
        Case::test("zone_memory_does_not_grow", case_zone_memory_does_not_grow),
        Case::test(
            "servers_from_the_api_take_the_memory_of_configured_ones",
            case_servers_from_the_api_take_the_memory_of_configured_ones,
        ),
        Case::test(
            "least_conn_and_keepalive_take_live_changes",
            case_least_conn_and_keepalive_take_live_changes,
        ),
        Case::ignorable_test(
            "resolve_servers_are_refused",
            case_resolve_servers_are_refused,
        ),
        Case::test(
            "set_changes_under_traffic_with_retries",
            case_set_changes_under_traffic_with_retries,
        ),
        Case::test(
            "retries_stay_bounded_while_sets_keep_changing",
            liveness::case_retries_stay_bounded_while_sets_keep_changing,
        ),
        Case::test(
            "worker_killed_holding_the_gate_leaves_puts_busy_not_stuck",
            liveness::case_worker_killed_holding_the_gate_leaves_puts_busy_not_stuck,
        ),
        Case::test(
            "no_request_fails_while_sets_change_every_10ms",
            liveness::case_no_request_fails_while_sets_change_every_10ms,
        ),
        Case::test(
            "a_long_request_on_a_removed_server_costs_other_requests_nothing",
            liveness::case_a_long_request_on_a_removed_server_costs_other_requests_nothing,
        ),
        Case::test(
            "a_retired_server_whose_worker_died_shows_its_age_until_a_reload",
            retired::case_a_retired_server_whose_worker_died_shows_its_age_until_a_reload,
        ),
        Case::test(
            "a_retired_server_whose_worker_died_is_named_once_in_a_warn_line",
            retired::case_a_retired_server_whose_worker_died_is_named_once_in_a_warn_line,
        ),
    ];
    trials.extend(access::trials());
    trials.extend(health::trials());
    trials.extend(zone_size::trials());
    trials.extend(reload_race::trials());
    trials.push(Case::ignorable_test(
        "sticky_upstreams_are_refused_and_keep_learning",
        sticky::case_sticky_upstreams_are_refused_and_keep_learning,
    ));
    trials.extend(scale::trials());
    trials.extend(drain::trials());
    trials.extend(stats::trials());
    trials.extend(plus::trials());
    trials
}
