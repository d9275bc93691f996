//! A removed server whose connection count can no longer fall (a worker died holding a
//! connection to it, and nginx never gives back a dead worker's counts): `GET` shows it with its
//! age until a reload, and once it has had connections for `retired_warn` a `warn` line names it,
//! once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ngx_harness::procfs::{self, Sig};
use ngx_harness::{check, check_eq, http_request, CaseResult, Failed};

use super::helpers::*;
use super::master::{Master, SlowBackend};

/// Starts nginx with `conf`, sends a request to a slow server, removes that server while the
/// request holds it, and SIGKILLs both workers: the server stays retired with one connection.
fn retired_for_good(conf: &str) -> Result<(Master, SlowBackend), Failed> {
    let m = Master::start(conf)?;
    // The case SIGKILLs workers: the master logs each as "exited on signal 9".
    m.expect_log("exited on signal 9");
    let slow = SlowBackend::start()?;
    let only_slow = format!(r#"{{"servers":[{{"address":"127.0.0.1:{}"}}]}}"#, slow.port);
    check_eq(m.put("app", &only_slow)?.status, 200, "PUT the slow server")?;
    let port = m.port(0);
    std::thread::spawn(move || {
        let _ = http_request(port, "GET", "/", &[], b"");
    });
    slow.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the slow server got no connection")?;
    let r = json(&m.put("app", &set_body(&m, &[1], &[]))?)?;
    check_eq(
        r["retiring"].as_u64(),
        Some(1),
        "the slow server retired while busy",
    )?;
    let old = m.workers();
    for w in &old {
        procfs::signal(*w, Sig::Kill);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.workers().len() != 2 || !m.workers().is_disjoint(&old) {
        check(Instant::now() < deadline, || {
            "the master did not replace the killed workers".into()
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    slow.release.store(true, Ordering::SeqCst);
    both_workers_answer(&m, &["b1"], 3)?;
    Ok((m, slow))
}

pub fn case_a_retired_server_whose_worker_died_shows_its_age_until_a_reload() -> CaseResult {
    // GET keeps listing it under `retired` with a growing age, requests are served, and a
    // reload (a new zone) clears it.
    let (mut m, _slow) = retired_for_good(&standard())?;
    let age = |v: &serde_json::Value| -> Result<(u64, u64), Failed> {
        let r = &v["retired"][0];
        Ok((
            r["active"]
                .as_u64()
                .ok_or_else(|| format!("no retired server in {v}"))?,
            r["age_ms"]
                .as_u64()
                .ok_or_else(|| format!("no age in {v}"))?,
        ))
    };
    let (active1, age1) = age(&m.get_json("/app")?)?;
    std::thread::sleep(Duration::from_millis(1100));
    let v = m.get_json("/app")?;
    let (active2, age2) = age(&v)?;
    eprintln!("retired server after its workers died: active {active2}, age {age1} → {age2} ms");
    check_eq(
        (active1, active2),
        (1, 1),
        "its connection count (never falls)",
    )?;
    check_eq(v["retiring"].as_u64(), Some(1), "retiring")?;
    check(age2 >= age1 + 1000, || {
        format!("its age went from {age1} to {age2} ms")
    })?;
    m.reload(&standard())?;
    let v = m.get_json("/app")?;
    check_eq(v["retiring"].as_u64(), Some(0), "retiring after a reload")?;
    check(v.get("retired").is_none(), || {
        format!("retired after a reload: {v}")
    })?;
    Ok(())
}

/// The `warn` lines of the error log that name a retired server of `app`.
fn warn_lines(m: &Master) -> Vec<String> {
    m.error_log()
        .lines()
        .filter(|l| {
            l.contains("[warn]") && l.contains("upstreams_api: upstream \"app\": removed server")
        })
        .map(str::to_string)
        .collect()
}

pub fn case_a_retired_server_whose_worker_died_is_named_once_in_a_warn_line() -> CaseResult {
    let conf = standard().replace(
        "upstreams_api write=on;",
        "upstreams_api write=on retired_warn=2s;",
    );
    check(conf.contains("retired_warn=2s"), || {
        "standard() changed: no `upstreams_api write=on;`".into()
    })?;
    let (m, slow) = retired_for_good(&conf)?;
    // Before retired_warn: requests (each `free` may sweep) and GETs name nothing. (Starting
    // the replacement workers can take most of the 2 s on a loaded machine: then this part is
    // left out, said so.)
    both_workers_answer(&m, &["b1"], 3)?;
    let age0 = m.get_json("/app")?["retired"][0]["age_ms"]
        .as_u64()
        .ok_or("no retired server")?;
    if age0 < 1900 {
        check_eq(
            warn_lines(&m),
            Vec::<String>::new(),
            "warn lines before 2 s",
        )?;
    } else {
        eprintln!("the server was already {age0} ms retired: no check before retired_warn");
    }
    std::thread::sleep(Duration::from_millis(2200u64.saturating_sub(age0)));
    // After it: traffic (sweeps at most every 100 ms, in both workers) and GETs, for 1 s.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        both_workers_answer(&m, &["b1"], 1)?;
        m.get_json("/app")?;
        std::thread::sleep(Duration::from_millis(120));
    }
    let lines = warn_lines(&m);
    eprintln!("{}", lines.join("\n"));
    check_eq(lines.len(), 1, "warn lines naming the retired server")?;
    for want in [
        format!("removed server 127.0.0.1:{} (1 active, removed ", slow.port),
        "still counted connections longer than retired_warn=2s after removal".to_string(),
        "until a reload frees it".to_string(),
    ] {
        check(lines[0].contains(&want), || {
            format!("{:?} does not contain {want:?}", lines[0])
        })?;
    }
    // Still retired and shown: the line reports, it reclaims nothing.
    check_eq(
        m.get_json("/app")?["retiring"].as_u64(),
        Some(1),
        "retiring",
    )?;
    Ok(())
}
