//! A set applied through the API: listed, reaching every worker without a reload, servers that
//! stay keeping their state, compare-and-set, workers killed meanwhile, the round-robin position,
//! busy servers retired, and requests whose tries span a change (grown or shrunk sets).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ngx_harness::procfs::{self, Sig};
use ngx_harness::{check, check_eq, http_request, CaseResult};

use super::helpers::*;
use super::master::Master;
use super::nginx_version;

pub(super) fn case_lists_upstreams_and_names_balancers() -> CaseResult {
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

pub(super) fn case_put_reaches_every_worker_without_reload() -> CaseResult {
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

pub(super) fn case_identical_set_is_a_no_op() -> CaseResult {
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

pub(super) fn case_servers_that_stay_keep_their_state() -> CaseResult {
    let m = Master::start(&standard())?;
    m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
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

pub(super) fn case_concurrent_compare_and_set_has_one_winner() -> CaseResult {
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

pub(super) fn case_workers_killed_under_traffic_and_puts() -> CaseResult {
    // SIGKILL a worker every 50 ms, 20 times, while clients send requests and the set changes
    // every 20 ms; afterwards the master's new workers serve and the API works.
    let m = Master::start(&standard())?;
    // The case SIGKILLs workers: the master logs each as "exited on signal 9".
    m.expect_log("exited on signal 9");
    // A proxied request whose backend server (in the same nginx) ran in a killed worker is cut
    // off: a reset or a premature close, depending on when the kill lands.
    m.expect_log(
        "recv() failed (104: Connection reset by peer) while reading response header from upstream",
    );
    m.expect_log(
        "upstream prematurely closed connection while reading response header from upstream",
    );
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

pub(super) fn case_round_robin_position_is_kept() -> CaseResult {
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
