//! Cases for the harness itself (testkit's nginx runner, as `ngx_harness` re-exports it) against a
//! real nginx with the module loaded: the production-like process model, the graceful and bounded
//! stop, the error-log verdict, reloads and the keep-alive pinning that other cases rely on. Run
//! directly it ends with `N passed, N failed`.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::case::Case;
use ngx_harness::procfs::{self, Sig};
use ngx_harness::{check, check_eq, CaseResult, Failed, Nginx, Options};

const ONE: &str = r#"server { listen 127.0.0.1:{P0}; add_header X-Pid $pid; return 200 "one"; }"#;

/// Waits up to 10 s until the error log contains `needle`.
fn wait_log(n: &Nginx, needle: &str) -> CaseResult {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !n.error_log().contains(needle) {
        check(Instant::now() < deadline, || {
            format!("error log lacks {needle:?}:\n{}", n.error_log())
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Kills one worker with SIGKILL and waits for the master's `[alert]` about it.
fn kill_a_worker(n: &Nginx) -> Result<u32, Failed> {
    let w = *n.workers().first().ok_or("no worker")?;
    check(procfs::signal(w, Sig::Kill), || format!("kill {w}"))?;
    wait_log(n, &format!("worker process {w} exited on signal 9"))?;
    Ok(w)
}

/// The default is a master process with 2 workers, and stopping it leaves no process behind.
fn default_is_master_with_two_workers_stopped_gracefully() -> CaseResult {
    let n = Nginx::start(ONE)?;
    let master = n.pid().ok_or("no pid")?;
    let workers = n.workers();
    check_eq(workers.len(), 2, "workers")?;
    // a forked worker renames itself once it has initialised
    let deadline = Instant::now() + Duration::from_secs(10);
    while !workers
        .iter()
        .all(|w| procfs::title(*w).contains("worker process"))
    {
        check(Instant::now() < deadline, || {
            let titles: Vec<String> = workers.iter().map(|w| procfs::title(*w)).collect();
            format!("workers {workers:?} are {titles:?}")
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    check(procfs::title(master).contains("master process"), || {
        format!("{master} is {:?}", procfs::title(master))
    })?;
    check_eq(n.get_on(0, "/")?.text(), "one".to_string(), "answer")?;
    n.stop()?;
    for p in workers.iter().chain([&master]) {
        check(!procfs::alive(*p), || format!("{p} still runs after stop"))?;
    }
    Ok(())
}

/// A worker killed by a signal fails the case through `stop`...
fn worker_exited_on_signal_fails_stop() -> CaseResult {
    let n = Nginx::start(ONE)?;
    let w = kill_a_worker(&n)?;
    match n.stop() {
        Ok(()) => Err("stop accepted a worker that exited on signal 9".into()),
        Err(e) => check(
            format!("{e:?}").contains(&format!("worker process {w} exited on signal 9")),
            || format!("stop's error does not name the line: {e:?}"),
        ),
    }
}

/// ...and through `Drop` (a panic, which the test runner reports as a failure)...
fn worker_exited_on_signal_fails_drop() -> CaseResult {
    let n = Nginx::start(ONE)?;
    kill_a_worker(&n)?;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(n)));
    let msg = match r {
        Ok(()) => return Err("drop accepted a worker that exited on signal 9".into()),
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "?".into()),
    };
    check(msg.contains("exited on signal 9"), || {
        format!("panic does not name the line: {msg}")
    })
}

/// ...unless the case declared it.
fn declared_log_lines_do_not_fail() -> CaseResult {
    let n = Nginx::start(ONE)?;
    n.expect_log("exited on signal 9");
    kill_a_worker(&n)?;
    // the master starts a new worker in its place
    check_eq(n.get_on(0, "/")?.text(), "one".to_string(), "answer")?;
    n.stop()
}

/// A master that does not exit within the stop timeout (a worker still serves a request whose
/// upstream never answers) is killed with its workers, and the case fails saying so.
fn stop_is_bounded_then_kills() -> CaseResult {
    let hole = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = hole.local_addr().map_err(|e| e.to_string())?.port();
    let n = Options::new()
        .timeouts(Duration::from_secs(10), Duration::from_secs(1))
        .start(&format!(
            "server {{ listen 127.0.0.1:{{P0}}; proxy_read_timeout 60s; \
             location / {{ proxy_pass http://127.0.0.1:{port}; }} }}"
        ))?;
    let front = n.port();
    let workers = n.workers();
    let client = std::thread::spawn(move || ngx_harness::http_get(front, "/", &[]).is_err());
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let r = n.stop();
    let took = t.elapsed();
    let msg = format!("{r:?}");
    check(
        r.is_err() && msg.contains("did not exit within 1s after SIGQUIT"),
        || format!("stop of a master that cannot exit: {msg}"),
    )?;
    check(took < Duration::from_secs(5), || {
        format!("stop took {took:?}")
    })?;
    for w in &workers {
        check(!procfs::alive(*w), || format!("worker {w} left behind"))?;
    }
    check(client.join().unwrap_or(false), || {
        "the hanging request did not end with the kill".into()
    })
}

/// `reload` starts a new generation with the new configuration; the old one exits.
fn reload_replaces_workers() -> CaseResult {
    let mut n = Nginx::start(ONE)?;
    let old = n.reload(&ONE.replace("\"one\"", "\"two\""))?;
    check_eq(old.len(), 2, "old workers")?;
    n.wait_exited(&old, Duration::from_secs(10))?;
    let new = n.workers();
    check(
        new.len() == 2 && new.iter().all(|w| !old.contains(w)),
        || format!("workers {new:?} after reload, before {old:?}"),
    )?;
    check_eq(n.get_on(0, "/")?.text(), "two".to_string(), "answer")?;
    n.stop()
}

/// A configuration nginx rejects: `reload` fails with the `[emerg]`, the old generation serves on.
fn reload_rejected_keeps_serving() -> CaseResult {
    let mut n = Nginx::start(ONE)?;
    n.expect_log("unknown directive \"no_such_directive\"");
    let before = n.workers();
    let r = n.reload(&format!("{ONE} no_such_directive;"));
    check(
        r.as_ref()
            .is_err_and(|e| format!("{e:?}").contains("unknown directive")),
        || format!("reload of a bad configuration: {r:?}"),
    )?;
    check_eq(n.workers(), before, "workers")?;
    check_eq(n.get_on(0, "/")?.text(), "one".to_string(), "answer")?;
    n.stop()
}

/// One keep-alive connection stays on one worker; new connections reach both (reuseport spreads
/// them): the pinning that cases observing per-worker state rely on, and 2 workers really serve.
fn keep_alive_stays_on_one_worker() -> CaseResult {
    let n = Nginx::start(&ONE.replace("{P0};", "{P0} reuseport;"))?;
    let mut conn = n.keep_alive(0)?;
    let mut pinned = BTreeSet::new();
    for _ in 0..20 {
        pinned.insert(conn.get("/")?.header("X-Pid").unwrap_or("").to_string());
    }
    check_eq(pinned.len(), 1, "workers seen on one connection")?;
    let mut all = BTreeSet::new();
    for _ in 0..200 {
        all.insert(n.get_on(0, "/")?.header("X-Pid").unwrap_or("").to_string());
        if all.len() == 2 {
            break;
        }
    }
    check_eq(all.len(), 2, "workers seen over 200 new connections")?;
    n.stop()
}

/// `single_process` runs `master_process off`: one process, no children.
fn single_process_has_no_workers() -> CaseResult {
    let n = Options::new().single_process().start(ONE)?;
    let pid = n.pid().ok_or("no pid")?;
    check_eq(n.workers(), vec![pid], "the process serves itself")?;
    check_eq(procfs::children(pid), Vec::<u32>::new(), "children")?;
    check_eq(n.get_on(0, "/")?.text(), "one".to_string(), "answer")?;
    n.stop()
}

/// The cases of this area, named like their functions (`main.rs` adds the area).
pub fn cases() -> Vec<Case> {
    cases![
        default_is_master_with_two_workers_stopped_gracefully,
        worker_exited_on_signal_fails_stop,
        worker_exited_on_signal_fails_drop,
        declared_log_lines_do_not_fail,
        stop_is_bounded_then_kills,
        reload_replaces_workers,
        reload_rejected_keeps_serving,
        keep_alive_stays_on_one_worker,
        single_process_has_no_workers,
    ]
}
