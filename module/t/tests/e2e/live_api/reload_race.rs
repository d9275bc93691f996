//! A `PUT` that races `nginx -s reload`: a worker of the old configuration must not
//! answer 200 for a change it makes in the zone the new configuration has already replaced.
//!
//! nginx never reuses an upstream zone across a reload (`noreuse`): the new configuration's zone
//! is made from the files, and the old workers keep their mapping of the old zone until they exit.
//! The master starts the new workers, sleeps 100 ms, and only then tells the old ones to quit, so
//! for at least that long an old worker serving a keep-alive connection applies `PUT`s to a zone
//! nobody will use again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::case::Case;
use ngx_harness::{check, check_eq, CaseResult, KeepAlive};

use super::helpers::{addr, addresses, json, set_body, standard};
use super::master::Master;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One `PUT` that got an answer.
struct Answered {
    /// Wall-clock ms just before the request was written.
    sent_ms: u64,
    /// The worker that answered (`X-Worker`).
    worker: u32,
    status: u16,
    /// `generation` of a 200 answer.
    generation: u64,
    /// `changed` of a 200 answer.
    changed: bool,
    /// The address the `PUT` set.
    address: String,
}

/// A set of one server no other `PUT` of the run uses: `10.T.HI.LO:80`.
fn address(thread: u64, seq: u64) -> String {
    format!("10.{}.{}.{}:80", thread + 1, (seq >> 8) & 255, seq & 255)
}

/// `PUT`s on one keep-alive connection (a new one when nginx closes it) until `stop`.
fn put_loop(port: u16, thread: u64, stop: &AtomicBool, out: &Mutex<Vec<Answered>>) {
    let mut conn = None;
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let ka = match conn.as_mut() {
            Some(k) => k,
            None => match KeepAlive::open(port) {
                Ok(k) => conn.insert(k),
                Err(_) => continue,
            },
        };
        seq += 1;
        let address = address(thread, seq);
        let body = format!(r#"{{"servers":[{{"address":"{address}"}}]}}"#);
        let sent_ms = now_ms();
        let Ok(r) = ka.request("PUT", "/api/app", &[], body.as_bytes()) else {
            // An old worker closed the connection after its last answer: the request was
            // not read.
            conn = None;
            continue;
        };
        let v = json(&r).unwrap_or_default();
        out.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Answered {
                sent_ms,
                worker: r
                    .header("X-Worker")
                    .and_then(|w| w.parse().ok())
                    .unwrap_or(0),
                status: r.status,
                generation: v["generation"].as_u64().unwrap_or(0),
                changed: v["changed"].as_bool().unwrap_or(false),
                address,
            });
        if r.header("Connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            conn = None;
        }
    }
}

pub fn case_a_put_racing_a_reload_is_never_200_and_lost() -> CaseResult {
    let mut m = Master::start(&standard())?;
    let port = m.port(0);
    let old_workers = m.workers();
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (stop, answers) = (stop.clone(), answers.clone());
            std::thread::spawn(move || put_loop(port, t, &stop, &answers))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let hup_ms = now_ms();
    let reloaded = m.reload(&m.http.clone());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    reloaded?;
    let answers = std::mem::take(&mut *answers.lock().unwrap_or_else(|e| e.into_inner()));
    let after = m.get_json("/app")?;
    let final_gen = after["generation"].as_u64().ok_or("no generation")?;
    let new_workers = m.workers();
    check(new_workers.is_disjoint(&old_workers), || {
        format!("workers {new_workers:?} not all new (old {old_workers:?})")
    })?;

    // The new zone's generation started at its creation (ms) and moved by one per change: the
    // changes the new workers answered are final_gen - n + 1 ..= final_gen.
    let by_new: Vec<&Answered> = answers
        .iter()
        .filter(|a| a.status == 200 && a.changed && new_workers.contains(&a.worker))
        .collect();
    check(!by_new.is_empty(), || "no PUT reached a new worker".into())?;
    let new_gens: BTreeSet<u64> = by_new.iter().map(|a| a.generation).collect();
    let base = final_gen - by_new.len() as u64;
    let want: BTreeSet<u64> = (base + 1..=final_gen).collect();
    check_eq(
        new_gens,
        want,
        "generations of the changes the new workers answered",
    )?;
    let last = by_new
        .iter()
        .find(|a| a.generation == final_gen)
        .ok_or("no answer with the final generation")?;
    check_eq(
        addresses(&after),
        vec![last.address.clone()],
        "set after the reload (the last PUT a new worker answered)",
    )?;

    let by_old: Vec<&Answered> = answers
        .iter()
        .filter(|a| old_workers.contains(&a.worker))
        .collect();
    // Sent once the new zone existed (`base` is its creation time in ms, +1 for the clock's
    // granularity) and answered by an old worker: made in the zone the reload replaced.
    let late: Vec<&&Answered> = by_old.iter().filter(|a| a.sent_ms > base + 1).collect();
    let lost: Vec<String> = late
        .iter()
        .filter(|a| a.status == 200 && a.changed)
        .map(|a| {
            format!(
                "{} sent {} ms after the new zone was made, generation {} (worker {})",
                a.address,
                a.sent_ms - base,
                a.generation,
                a.worker
            )
        })
        .collect();
    let statuses: BTreeSet<u16> = late.iter().map(|a| a.status).collect();
    eprintln!(
        "{} PUTs answered ({} by old workers, {} by new ones); reload signalled {} ms before the new zone was made; {} sent to old workers after it (statuses {statuses:?}), {} of them 200 and lost",
        answers.len(),
        by_old.len(),
        answers.len() - by_old.len(),
        base as i64 - hup_ms as i64,
        late.len(),
        lost.len()
    );
    check(lost.is_empty(), || {
        format!(
            "{} PUTs answered 200 by an old worker after the reload made the new zone, their sets lost: {}",
            lost.len(),
            lost.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        )
    })?;
    // The race was run: old workers got PUTs after the new zone existed (and refused them).
    check(!late.is_empty(), || {
        "no PUT reached an old worker after the new zone was made: the race was not exercised"
            .into()
    })?;
    for a in &late {
        check_eq(
            a.status,
            503,
            "status of a PUT an old worker got during the reload",
        )?;
    }
    m.check_workers_unchanged()
}

/// A `GET` answered by a worker of the old configuration during a reload would show the set of a
/// zone nobody uses any more: a daemon reading back its change there would confirm a lost one.
pub fn case_a_get_racing_a_reload_shows_no_replaced_zone() -> CaseResult {
    let mut m = Master::start(&standard())?;
    let port = m.port(0);
    let old_workers = m.workers();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                let mut conn: Option<KeepAlive> = None;
                while !stop.load(Ordering::SeqCst) {
                    let ka = match conn.as_mut() {
                        Some(k) => k,
                        None => match KeepAlive::open(port) {
                            Ok(k) => conn.insert(k),
                            Err(_) => continue,
                        },
                    };
                    let sent_ms = now_ms();
                    let Ok(r) = ka.request("GET", "/api/app", &[], b"") else {
                        conn = None;
                        continue;
                    };
                    let w: u32 = r
                        .header("X-Worker")
                        .and_then(|w| w.parse().ok())
                        .unwrap_or(0);
                    let g = json(&r).ok().and_then(|v| v["generation"].as_u64());
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((sent_ms, w, r.status, g));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let reloaded = m.reload(&m.http.clone());
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    reloaded?;
    // No PUT: the new zone's generation is its creation time in ms.
    let made_ms = m.get_json("/app")?["generation"]
        .as_u64()
        .ok_or("no generation")?;
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    let late: Vec<_> = seen
        .iter()
        .filter(|(sent, w, _, _)| *sent > made_ms + 1 && old_workers.contains(w))
        .collect();
    let stale = late.iter().filter(|(_, _, s, _)| *s == 200).count();
    eprintln!(
        "{} GETs answered; {} sent to old workers after the new zone was made, {stale} of them 200 (the replaced zone's set)",
        seen.len(),
        late.len()
    );
    check_eq(stale, 0, "GETs answered 200 from the replaced zone")?;
    check(!late.is_empty(), || {
        "no GET reached an old worker after the new zone was made: the race was not exercised"
            .into()
    })?;
    m.check_workers_unchanged()
}

/// A reload that fails in the master (a log file it cannot open: `nginx -s reload` itself only
/// parses the files) leaves the running configuration, whose workers must keep taking changes:
/// the marks the failed configuration set when it began are taken back.
pub fn case_a_failed_reload_leaves_the_api_working() -> CaseResult {
    let m = Master::start(&standard())?;
    // The reload fails on purpose: the master logs `[emerg] open() "/nonexistent-…/a.log" failed`.
    m.expect_log("/a.log\" failed");
    let r = m.put("app", &set_body(&m, &[2], &[]))?;
    check_eq(
        r.status,
        200,
        &format!("PUT before the reload ({})", r.text()),
    )?;
    let bad = format!(
        "{}\nserver {{ listen 127.0.0.1:{{DEAD}}; access_log /nonexistent-{}/a.log; }}\n",
        m.http,
        std::process::id()
    );
    m.write_config(&bad)?;
    let out = std::process::Command::new(ngx_harness::nginx_bin())
        .arg("-p")
        .arg(&m.dir)
        .arg("-e")
        .arg(m.dir.join("logs/error.log"))
        .arg("-c")
        .arg(m.dir.join("conf/nginx.conf"))
        .args(["-s", "reload"])
        .output()
        .map_err(|e| format!("nginx -s reload: {e}"))?;
    check(out.status.success(), || {
        format!("nginx -s reload: {}", String::from_utf8_lossy(&out.stderr))
    })?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !m.error_log().contains("/a.log\" failed") {
        check(std::time::Instant::now() < deadline, || {
            format!("the master did not fail the reload:\n{}", m.error_log())
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    // Both workers (a new connection each time; reuseport spreads them) take a change.
    let mut statuses = BTreeSet::new();
    let mut workers = BTreeSet::new();
    for i in 0..20 {
        let set = if i % 2 == 0 { [3] } else { [4] };
        let r = m.put("app", &set_body(&m, &set, &[]))?;
        statuses.insert(r.status);
        workers.insert(
            r.header("X-Worker")
                .and_then(|w| w.parse::<u32>().ok())
                .unwrap_or(0),
        );
        check_eq(
            r.status,
            200,
            &format!("PUT after the failed reload ({})", r.text()),
        )?;
    }
    check_eq(
        addresses(&m.get_json("/app")?),
        vec![addr(&m, 4)],
        "set after the PUTs",
    )?;
    eprintln!(
        "after the failed reload: 20 PUTs, statuses {statuses:?}, answered by workers {workers:?}"
    );
    m.check_workers_unchanged()
}

pub fn trials() -> Vec<Case> {
    vec![
        Case::test(
            "a_failed_reload_leaves_the_api_working",
            case_a_failed_reload_leaves_the_api_working,
        ),
        Case::test(
            "a_put_racing_a_reload_is_never_200_and_lost",
            case_a_put_racing_a_reload_is_never_200_and_lost,
        ),
        Case::test(
            "a_get_racing_a_reload_shows_no_replaced_zone",
            case_a_get_racing_a_reload_shows_no_replaced_zone,
        ),
    ]
}
