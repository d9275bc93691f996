//! A walk across a reload or across killed workers, and the classifier's own check.

use super::*;

/// The configuration of [`reload_during_walk_finishes_on_the_old_generation`]: upstrand `us1`
/// walks `first` then `then`; `hole` never answers (nginx makes a 504 after 1 s).
pub(super) fn walk_config(first: &str, then: &str, hole: u16) -> String {
    format!(
        "log_format p '$upstrand_path|$status';
         upstream hole {{ server 127.0.0.1:{hole}; }}
         upstream u2 {{ server 127.0.0.1:{{P2}}; }}
         upstream u3 {{ server 127.0.0.1:{{P3}}; }}
         upstrand us1 {{ upstream {first}; upstream {then}; order per_request; \
         next_upstream_statuses 5xx; }}
         server {{ listen 127.0.0.1:{{P0}}; proxy_read_timeout 1s;
                   access_log {{PREFIX}}/logs/walks.log p;
                   location / {{ proxy_pass http://$upstrand_us1; }} }}
         server {{ listen 127.0.0.1:{{P2}}; return 200 \"b2\"; }}
         server {{ listen 127.0.0.1:{{P3}}; return 200 \"b3\"; }}"
    )
}

/// A walk in flight when nginx reloads finishes on its old worker with the old configuration
/// (its upstrand and upstreams stay valid until that worker exits), the old worker then exits,
/// and the next request walks the new configuration.
pub(super) fn reload_during_walk_finishes_on_the_old_generation() -> CaseResult {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let hole_port = hole.local_addr().map_err(|e| e.to_string())?.port();
    let mut ng = ngx_harness::Nginx::start(&walk_config("hole", "u2", hole_port))?;
    ng.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    let front = ng.port();
    let walk = std::thread::spawn(move || ngx_harness::http_get(front, "/", &[]));
    std::thread::sleep(Duration::from_millis(300));
    let old = ng.reload(&walk_config("u3", "u2", hole_port))?;
    let a = walk.join().map_err(|_| "client thread panicked")??;
    check(a.status == 200 && a.text() == "b2", || {
        format!("walk across the reload: {} {:?}", a.status, a.text())
    })?;
    ng.wait_exited(&old, Duration::from_secs(10))?;
    let b = ng.get_on(0, "/")?;
    check(b.status == 200 && b.text() == "b3", || {
        format!("after the reload: {} {:?}", b.status, b.text())
    })?;
    let log = ng
        .stop_then(|prefix| fs::read_to_string(prefix.join("logs/walks.log")))?
        .map_err(|e| format!("walks.log: {e}"))?;
    check(log == "hole -> u2|200\nu3|200\n", || {
        format!("walks:\n{log}")
    })
}

/// SIGKILL at a bad moment: every worker is killed while a walk waits on a silent upstream.
/// The master starts new workers (the `[alert]` lines are expected), the client of the killed
/// walk gets no answer, and the next walks run the whole configuration on the new workers.
pub(super) fn workers_killed_mid_walk_are_replaced() -> CaseResult {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let hole_port = hole.local_addr().map_err(|e| e.to_string())?.port();
    let ng = ngx_harness::Nginx::start(&walk_config("hole", "u2", hole_port))?;
    ng.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    ng.expect_log("exited on signal 9");
    let front = ng.port();
    let walk = std::thread::spawn(move || ngx_harness::http_get(front, "/", &[]));
    std::thread::sleep(Duration::from_millis(300));
    let killed = ng.workers();
    for w in &killed {
        check(procfs::signal(*w, procfs::Sig::Kill), || {
            format!("kill {w}")
        })?;
    }
    let lost = walk.join().map_err(|_| "client thread panicked")?;
    check(lost.is_err(), || {
        format!("the killed walk still answered: {lost:?}")
    })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ng.workers().iter().filter(|w| !killed.contains(w)).count() < 2 {
        check(Instant::now() < deadline, || {
            format!("no new workers after {killed:?} were killed")
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..2 {
        let a = ng.get_on(0, "/")?;
        check(a.status == 200 && a.text() == "b2", || {
            format!("walk after the kill: {} {:?}", a.status, a.text())
        })?;
    }
    let log = ng.error_log();
    for w in &killed {
        check(
            log.contains(&format!("worker process {w} exited on signal 9")),
            || format!("error log lacks the exit of {w}:\n{log}"),
        )?;
    }
    let walks = ng
        .stop_then(|prefix| fs::read_to_string(prefix.join("logs/walks.log")))?
        .map_err(|e| format!("walks.log: {e}"))?;
    check(walks == "hole -> u2|200\n".repeat(2), || {
        format!("walks after the kill:\n{walks}")
    })
}

/// The classifier accepts what each generation explains and nothing else.
pub(super) fn reload_classifier_rejects_what_the_config_does_not_explain() -> CaseResult {
    let gens: Vec<Generation> = (0..8).map(Generation::new).collect();
    // generation 0: members u1 only, us2 present; generation 1: u2 only, no us2
    let cases = [
        ("0|/s|200|u1|(u1) 200", Verdict::Ok),
        ("0|/s|200|u1 -> ok|(u1) 503 (ok) 200", Verdict::Ok),
        ("0|/s|200|u2|(u2) 200", Verdict::Unexplained),
        ("0|/s|502|u1|(u1) 502", Verdict::Unexplained),
        ("0|/s|200|u1 -> ok|(u1) 404 (ok) 200", Verdict::Unexplained),
        ("0|/d?u=us2|200|u3 -> u4|(u3) 503 (u4) 200", Verdict::Ok),
        ("1|/d?u=us2|500|-|-", Verdict::ExplainedMissingUpstrand),
        ("0|/d?u=us2|500|-|-", Verdict::Unexplained),
        ("1|/d?u=us1|200|u2|(u2) 200", Verdict::Ok),
        ("9|/s|200|u1|(u1) 200", Verdict::Unexplained),
        ("garbage", Verdict::Unexplained),
        ("7|/s|499|u1|(u1) 200", Verdict::ClientGoneAtEnd),
        ("6|/s|499|u1|(u1) 200", Verdict::Unexplained),
    ];
    for (line, want) in cases {
        let got = classify(line, &gens, 7);
        check(got == want, || {
            format!("{line}: got {got:?}, want {want:?}")
        })?;
    }
    check(
        gens[0].members == ["u1"] && gens[0].us2 && !gens[1].us2 && gens[1].members == ["u2"],
        || format!("generations 0 and 1: {:?}", &gens[..2]),
    )
}
