//! Probes across workers and the live set: one probe per server per interval for all workers, a
//! mandatory server added by PUT gets nothing before its first pass, health follows the live set.

use super::*;
use crate::live_api::helpers::both_workers_answer;
use ngx_harness::procfs::{self, Sig};

/// Probes per server over `n` intervals of `ms` (counted at the backends) must be `n` ± 1.
fn probes_per_interval(b: &[&Backend], n: u32, ms: u64, what: &str) -> CaseResult {
    let from = Instant::now();
    std::thread::sleep(Duration::from_millis(ms) * n);
    let to = Instant::now();
    for (i, x) in b.iter().enumerate() {
        let got = x.probes_between(from, to);
        check(got + 1 >= n as usize && got <= n as usize + 1, || {
            format!("{what}: backend {i} got {got} probes in {n} intervals (one per interval expected, not one per worker)")
        })?;
    }
    Ok(())
}

pub(super) fn case_one_probe_per_server_per_interval_for_all_workers() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let http = conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=300ms timeout=200ms",
    );
    let mut m = Master::start(&http)?;
    // The case SIGKILLs the probes' owner: the master logs it as "exited on signal 9".
    m.expect_log("exited on signal 9");
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    std::thread::sleep(Duration::from_millis(300));
    probes_per_interval(&[&b1, &b2], 5, 300, "steady")?;

    // SIGKILL the probing worker: another takes over within about an interval.
    let owner = m.get_json("/app")?["probe"]["owner_pid"]
        .as_u64()
        .ok_or("no owner_pid")? as u32;
    check(m.workers().contains(&owner), || {
        format!("owner {owner} is not a worker: {:?}", m.workers())
    })?;
    let last_before = b1.probe_times().last().copied().ok_or("no probe")?;
    check(procfs::signal(owner, Sig::Kill), || {
        format!("kill {owner} failed")
    })?;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(3);
    let first_after = loop {
        if let Some(t) = b1.probe_times().into_iter().find(|t| *t > killed) {
            break t;
        }
        check(Instant::now() < deadline, || {
            "no probe within 3 s of the kill".into()
        })?;
        std::thread::sleep(Duration::from_millis(5));
    };
    let gap = first_after - last_before;
    // The lease goes stale one interval after the last heartbeat; the tick is interval / 4.
    check(gap <= Duration::from_millis(300 * 2 + 200), || {
        format!("probes stopped for {gap:?} after the owner was killed")
    })?;
    std::thread::sleep(Duration::from_millis(300));
    probes_per_interval(&[&b1, &b2], 5, 300, "after SIGKILL of the probing worker")?;
    let new_owner = m.get_json("/app")?["probe"]["owner_pid"]
        .as_u64()
        .unwrap_or(0) as u32;
    check(new_owner != owner && new_owner != 0, || {
        format!("owner still {new_owner}")
    })?;

    // A reload: the new workers probe the new zone, the old ones stop.
    m.reload(&http)?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    std::thread::sleep(Duration::from_millis(300));
    probes_per_interval(&[&b1, &b2], 5, 300, "after nginx -s reload")?;
    eprintln!("probe gap after SIGKILL of the owner: {gap:?}");
    Ok(())
}

pub(super) fn case_mandatory_server_added_by_put_gets_nothing_before_its_first_pass() -> CaseResult
{
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let m = Master::start(&conf(
        &[b1.port],
        "uri=/healthz interval=200ms timeout=100ms fails=1 passes=1 mandatory",
    ))?;
    until_health(&m, b1.port, "healthy", Duration::from_secs(2))?;
    b2.set(FAIL_503);
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}}]}}"#,
        b1.port, b2.port
    );
    let r = m.put("app", &body)?;
    check(r.status == 200, || {
        format!("PUT: {} {}", r.status, r.text())
    })?;
    // Several intervals with failing probes: checking, no request.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1000) {
        let (_, body) = m.front()?;
        check(body == "b1", || {
            format!("answer {body:?} while b2 is checking")
        })?;
    }
    let s = server_view(&m, b2.port)?;
    check(
        s["health"] == "checking" && s["last_error"] == "status 503",
        || format!("{s}"),
    )?;
    check_eq_usize(
        b2.proxied.load(Ordering::SeqCst),
        0,
        "requests proxied to b2 before its first pass",
    )?;
    b2.set(OK);
    until_health(&m, b2.port, "healthy", Duration::from_secs(2))?;
    both_workers_answer(&m, &["b1", "b2"], 20)?;
    check(b2.proxied.load(Ordering::SeqCst) > 0, || {
        "b2 never got a request after it passed".into()
    })?;
    m.check_workers_unchanged()
}

pub(super) fn case_health_follows_the_live_set() -> CaseResult {
    let b1 = Backend::start("b1")?;
    let b2 = Backend::start("b2")?;
    let b3 = Backend::start("b3")?;
    let m = Master::start(&conf(
        &[b1.port, b2.port],
        "uri=/healthz interval=200ms timeout=100ms fails=1 passes=3",
    ))?;
    b1.set(FAIL_503);
    until_health(&m, b1.port, "unhealthy", Duration::from_secs(2))?;
    // Kept across a PUT (with another weight): still unhealthy, still skipped.
    put_servers(&m, &[(b1.port, 2), (b2.port, 1)])?;
    let s = server_view(&m, b1.port)?;
    check(s["health"] == "unhealthy" && s["weight"] == 2, || {
        format!("after the PUT: {s}")
    })?;
    let before = b1.proxied.load(Ordering::SeqCst);
    both_workers_answer(&m, &["b2"], 10)?;
    check_eq_usize(
        b1.proxied.load(Ordering::SeqCst),
        before,
        "requests to the kept unhealthy b1",
    )?;
    // Removed: no longer probed. Added: probed from the next round.
    put_servers(&m, &[(b2.port, 1), (b3.port, 1)])?;
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let late = b1.probes_between(t + Duration::from_millis(300), Instant::now());
    check_eq_usize(late, 0, "probes of the removed b1 after one round")?;
    let new = b3.probes_between(t, Instant::now());
    check(new >= 3, || format!("the added b3 got {new} probes in 1 s"))?;
    let s = server_view(&m, b3.port)?;
    check(s["health"] == "healthy" && s["last_status"] == 200, || {
        format!("{s}")
    })?;
    // Re-added: a new server again (healthy without mandatory), not the old record.
    put_servers(&m, &[(b1.port, 1), (b2.port, 1), (b3.port, 1)])?;
    b1.set(OK);
    std::thread::sleep(Duration::from_millis(300));
    let s = server_view(&m, b1.port)?;
    check(s["health"] == "healthy", || format!("re-added b1: {s}"))?;
    m.check_workers_unchanged()
}
