//! Chaos soak: the whole system as a user runs it, under faults at random moments.
//!
//! Command (from the workspace root): `scripts/soak.sh --minutes N [--seed S]` (it builds what
//! this needs: the release module `.so` and the debug workspace binaries, then runs this target
//! with `cargo test -p tributary --bench soak -- ...`). `scripts/test.sh` runs the 3-minute form.
//!
//! Started: a front nginx (master + 2 workers, the combined-upstreams module, its upstreams API
//! with `write=on` on a unix socket), `tributary serve --apply live` with the real `file` plugin
//! managing three bindings (`web` round robin + `keepalive`, `api` `least_conn`, `img`), the
//! registry file that plugin reads — rewritten atomically every 100 ms with a random non-empty
//! subset of 6 backends and weights — and the backends: a separate nginx no fault touches, each
//! backend answering its name, or a 25 s stream on `/slow`. A refresher asks the daemon to
//! resolve a random binding every 0.1–0.6 s (the 10 s minimum interval alone would move a set
//! every ~3 s), so changes reach nginx several times a second. Clients: 2 keep-alive, 2
//! new-connection, 3 long-lived.
//!
//! Faults (seeded; the seed is printed): SIGKILL of the daemon, restarted after 0.1–5 s (systemd's
//! default `RestartSec` is 100 ms, the packaged unit's 5 s); SIGKILL of the plugin process; SIGKILL
//! of one nginx worker; `nginx -s reload`. One at a time, 2–10 s apart, each followed by its
//! recovery and the settle check.
//!
//! Asserted (the table it prints, then `N passed, N failed`; exit status 1 on a failure): client
//! errors no fault explains = 0 (every explained one listed with its kill); `nginx -t` failures of
//! the live files = 0; after each recovery the daemon's servers, the file and the module's live set
//! agree within 30 s (see `checks::settle`); RSS of the daemon and of nginx flat (median of the last
//! quarter ≤ 1.2 × the first + 2 MiB); no `[alert]`/`[crit]`/`[emerg]` in nginx's logs but the
//! killed workers' own lines; and that the soak did what it says (every fault kind, traffic of every
//! kind, live changes, the daemon never exited by itself).

mod args;
mod checks;
mod client;
mod faults;
mod report;
mod stack;
mod traffic;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use args::Args;
use faults::Kind;
use report::Row;
use stack::{DaemonProc, Registry};
use traffic::Shared;
use tributary_store::now_ms;

/// One fault and what followed it.
struct FaultRecord {
    kind: Kind,
    at_s: f64,
    done: faults::Done,
    settle: Vec<checks::Settle>,
}

fn main() -> ExitCode {
    let a = match args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "soak: {} min, seed {} (the same faults again: scripts/soak.sh --minutes {} --seed {})",
        a.minutes, a.seed, a.minutes, a.seed
    );
    let root = tempfile::Builder::new()
        .prefix("tributary-soak-")
        .tempdir()
        .expect("temp dir");
    let failed = run(&a, root.path());
    if failed > 0 || a.keep {
        let kept = root.keep();
        println!("soak: logs kept in {}", kept.display());
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs the soak; returns the number of failed checks.
fn run(a: &Args, root: &Path) -> usize {
    let mut rng = fastrand::Rng::with_seed(a.seed);
    let tributary = Path::new(env!("CARGO_BIN_EXE_tributary"));
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let plugin_bin = tributary_fakes::daemon::sibling_bin(tributary, "tributary-plugin-file");
    let plugins = root.join("plugins");
    tributary_fakes::daemon::plugin_folder(
        &plugins,
        &workspace.join("plugins/file"),
        &plugin_bin,
        None,
    );

    let (backends, ports) = stack::start_backends();
    let front = Arc::new(stack::start_front());
    let front_master = front.pid().expect("front nginx runs");
    let registry = Registry::new(root, ports, rng.u64(..));
    let registry_path = registry.path.clone();
    let mut d = DaemonProc::new(tributary, root, &plugins, &front);
    d.spawn().expect("tributary serve starts");
    d.add_bindings(&registry_path)
        .expect("the bindings are created");
    front
        .wait_settled(Duration::from_secs(30))
        .expect("nginx settles after the first reloads");

    let t0 = Instant::now();
    let end_at = t0 + Duration::from_secs_f64(a.minutes * 60.0);
    let shared = Arc::new(Shared {
        t0,
        end_at,
        stop: Default::default(),
        port: front.port(),
        errors: Mutex::new(Vec::new()),
        ok: Default::default(),
        retried: AtomicU64::new(0),
    });
    let rss = Arc::new(checks::Rss {
        samples: Mutex::new(Vec::new()),
        daemon: Mutex::new(d.pid().map(|p| (p, Instant::now()))),
    });

    let mut clients = Vec::new();
    for i in 0..2u64 {
        let (s, seed) = (shared.clone(), rng.u64(..) ^ i);
        clients.push(thread::spawn(move || traffic::keepalive_client(s, seed)));
        let (s, seed) = (shared.clone(), rng.u64(..));
        clients.push(thread::spawn(move || traffic::newconn_client(s, seed)));
    }
    for _ in 0..3 {
        let (s, seed) = (shared.clone(), rng.u64(..));
        clients.push(thread::spawn(move || traffic::long_client(s, seed)));
    }
    let registry_thread = {
        let s = shared.clone();
        let mut registry = registry;
        thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                registry.rotate();
                thread::sleep(Duration::from_millis(100));
            }
            registry.writes
        })
    };
    let refresher = {
        let (s, port, token, seed) = (
            shared.clone(),
            d.port,
            d.token().expect("token"),
            rng.u64(..),
        );
        thread::spawn(move || traffic::refresh_loop(&s, port, &token, seed))
    };
    let nginx_t = {
        let (s, cmd, seed) = (shared.clone(), front.test_cmd(), rng.u64(..));
        thread::spawn(move || checks::nginx_t_loop(s, cmd, seed))
    };
    let rss_thread = {
        let (s, r, f) = (shared.clone(), rss.clone(), front.clone());
        thread::spawn(move || checks::rss_loop(s, r, front_master, f))
    };

    // The faults, one at a time.
    let mut first = faults::KINDS;
    rng.shuffle(&mut first);
    let mut records: Vec<FaultRecord> = Vec::new();
    let mut worker_kills: Vec<(u32, f64)> = Vec::new();
    let mut unexpected_exits = Vec::new();
    loop {
        let gap = Duration::from_millis(rng.u64(2000..=10000));
        if Instant::now() + gap + Duration::from_secs(5) >= end_at {
            break;
        }
        thread::sleep(gap);
        if !d.running() {
            unexpected_exits.push(format!("{:.1} s", shared.secs(Instant::now())));
            let _ = d.spawn();
        }
        let kind = Kind::draw(&mut rng, records.len(), &first);
        let at = Instant::now();
        let done = match kind {
            Kind::Daemon => {
                let delay = Duration::from_millis(rng.u64(100..=5000));
                let done = faults::kill_daemon(&mut d, delay);
                *rss.daemon.lock().unwrap() = d.pid().map(|p| (p, Instant::now()));
                done
            }
            Kind::Plugin => faults::kill_plugin(&d),
            Kind::Worker => {
                let done = faults::kill_worker(&front, &mut rng);
                if let Some(pid) = done.pid {
                    worker_kills.push((pid, shared.secs(at)));
                }
                done
            }
            Kind::Reload => faults::reload(&front),
        };
        let recovered = Instant::now();
        let settle = checks::settle(&d, &front, now_ms(), recovered);
        println!(
            "soak: {:7.1} s  {:22} {} {}{}; settled in {}",
            shared.secs(at),
            kind.label(),
            done.pid.map(|p| format!("pid {p}")).unwrap_or_default(),
            done.detail,
            done.problem
                .as_ref()
                .map(|p| format!(" PROBLEM: {p}"))
                .unwrap_or_default(),
            checks::settle_text(&settle)
        );
        records.push(FaultRecord {
            kind,
            at_s: shared.secs(at),
            done,
            settle,
        });
    }
    // A last check with everything still running, then stop the clients.
    thread::sleep(end_at.saturating_duration_since(Instant::now()));
    let last_settle = checks::settle(&d, &front, now_ms(), Instant::now());
    println!(
        "soak: end: settled in {}",
        checks::settle_text(&last_settle)
    );
    shared.stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let registry_writes = registry_thread.join().unwrap_or(0);
    let (refreshes, refresh_errors) = refresher.join().unwrap_or((0, 0));
    let (t_runs, t_failures) = nginx_t
        .join()
        .unwrap_or((0, vec!["the nginx -t thread panicked".into()]));
    let _ = rss_thread.join();
    let daemon_alive = d.running();
    if !daemon_alive {
        unexpected_exits.push("at the end".into());
    }
    let master_alive = !stack::cmdline(front_master).is_empty();
    d.stop();
    let elapsed = shared.secs(Instant::now());

    // Verdicts.
    let errors = shared.errors.lock().unwrap().clone();
    let classified: Vec<_> = errors
        .iter()
        .map(|e| (e, report::explain(e, &worker_kills)))
        .collect();
    let unexplained: Vec<_> = classified
        .iter()
        .filter(|(_, x)| x.is_none())
        .map(|(e, _)| *e)
        .collect();
    let explained: Vec<_> = classified
        .iter()
        .filter_map(|(e, x)| x.as_ref().map(|x| (*e, x)))
        .collect();
    let killed: BTreeSet<u32> = worker_kills.iter().map(|(p, _)| *p).collect();
    let front_log = front.error_log();
    let (log_ours, log_other) = checks::scan_log(&front_log, &killed);
    let (_, backend_log_other) = checks::scan_log(&backends.error_log(), &BTreeSet::new());
    let _ = std::fs::write(root.join("front-error.log"), &front_log);
    let settles: Vec<&checks::Settle> = records
        .iter()
        .flat_map(|r| r.settle.iter())
        .chain(last_settle.iter())
        .collect();
    let mismatches: Vec<&str> = settles
        .iter()
        .filter_map(|s| s.mismatch.as_deref())
        .collect();
    let unsettled: Vec<String> = settles
        .iter()
        .filter(|s| s.took_s.is_none())
        .map(|s| format!("{}: {}", s.binding, s.last_wait))
        .collect();
    let settle_times: Vec<f64> = settles.iter().filter_map(|s| s.took_s).collect();
    let problems: Vec<String> = records
        .iter()
        .filter_map(|r| {
            r.done
                .problem
                .as_ref()
                .map(|p| format!("{:.1} s {}: {p}", r.at_s, r.kind.label()))
        })
        .collect();
    let samples = rss.samples.lock().unwrap().clone();
    let (d_first, d_last) = checks::quarters(&samples, |s| s.1);
    let (n_first, n_last) = checks::quarters(&samples, |s| Some(s.2));
    let flat = |first: u64, last: u64| first > 0 && (last as f64) <= first as f64 * 1.2 + 2048.0;
    let daemon_log = std::fs::read_to_string(&d.log).unwrap_or_default();
    let live_changes = daemon_log
        .lines()
        .filter(|l| l.contains("applied live"))
        .count();
    let reload_changes = daemon_log
        .lines()
        .filter(|l| l.contains("upstream updated") && l.contains("reloaded=true"))
        .count();
    let failed_resolutions = daemon_log
        .lines()
        .filter(|l| l.contains("resolution failed"))
        .count();
    let sighups = front_log
        .lines()
        .filter(|l| l.contains("(SIGHUP) received"))
        .count();
    let ok = |i: usize| shared.ok[i].load(Ordering::Relaxed);
    let mut by_kind: BTreeMap<Kind, usize> = BTreeMap::new();
    for r in &records {
        *by_kind.entry(r.kind).or_default() += 1;
    }
    let count_of = |k: Kind| by_kind.get(&k).copied().unwrap_or(0);

    let rows = vec![
        Row::new(
            "client errors no fault explains",
            unexplained.len().to_string(),
            "0",
            unexplained.is_empty(),
        ),
        Row::new(
            "`nginx -t` failures of the live files",
            format!("{} of {t_runs} runs", t_failures.len()),
            "0",
            t_failures.is_empty() && t_runs > 0,
        ),
        Row::new(
            "daemon ↔ file ↔ module set mismatches after settling",
            format!(
                "{} of {} checks",
                mismatches.len() + unsettled.len(),
                settles.len()
            ),
            "0 (settled: first stable snapshot within 30 s)",
            mismatches.is_empty() && unsettled.is_empty() && !settles.is_empty(),
        ),
        Row::new(
            "daemon RSS, median first → last quarter",
            format!("{d_first} → {d_last} KiB"),
            "last ≤ 1.2 × first + 2 MiB",
            flat(d_first, d_last),
        ),
        Row::new(
            "nginx RSS (master + workers), median first → last quarter",
            format!("{n_first} → {n_last} KiB"),
            "last ≤ 1.2 × first + 2 MiB",
            flat(n_first, n_last),
        ),
        Row::new(
            "`[alert]`/`[crit]`/`[emerg]` lines not from the soak's kills",
            format!(
                "{} (front; {} explained), {} (backends)",
                log_other.len(),
                log_ours.len(),
                backend_log_other.len()
            ),
            "0",
            log_other.is_empty() && backend_log_other.is_empty(),
        ),
        Row::new(
            "faults made and recovered",
            format!(
                "{} daemon, {} plugin, {} worker kills, {} reloads; {} problems",
                count_of(Kind::Daemon),
                count_of(Kind::Plugin),
                count_of(Kind::Worker),
                count_of(Kind::Reload),
                problems.len()
            ),
            "each kind ≥ 1, 0 problems",
            faults::KINDS.iter().all(|k| count_of(*k) > 0) && problems.is_empty(),
        ),
        Row::new(
            "daemon exits the soak did not cause; nginx master alive",
            format!(
                "{}; master {}",
                unexpected_exits.len(),
                if master_alive { "alive" } else { "GONE" }
            ),
            "0; alive",
            unexpected_exits.is_empty() && master_alive,
        ),
        Row::new(
            "requests answered (keep-alive, new-connection, long-lived)",
            format!("{}, {}, {}", ok(0), ok(1), ok(2)),
            "each ≥ 1",
            ok(0) > 0 && ok(1) > 0 && ok(2) > 0,
        ),
        Row::new(
            "changes applied live / by reload (daemon log)",
            format!("{live_changes} / {reload_changes}"),
            "live ≥ 1",
            live_changes > 0,
        ),
    ];
    let failed = rows.iter().filter(|r| !r.pass).count();

    println!();
    println!("## Soak report: {:.1} min, seed {}", elapsed / 60.0, a.seed);
    println!();
    print!("{}", report::table(&rows));
    println!();
    println!(
        "Also: client errors explained by a fault {} (keep-alive requests sent again after their connection closed: {}); \
         registry rewrites {registry_writes}; refresh requests {refreshes} ({refresh_errors} not answered, daemon down); \
         resolutions failed (plugin killed, daemon stopping) {failed_resolutions}; SIGHUPs seen by nginx {sighups} ({} ours); \
         settle time p50 {:.2} s, max {:.2} s over {} checks; RSS samples {}.",
        explained.len(),
        shared.retried.load(Ordering::Relaxed),
        count_of(Kind::Reload),
        report::pct(&settle_times, 50.0),
        report::pct(&settle_times, 100.0),
        settle_times.len(),
        samples.len(),
    );
    let section = |title: &str, lines: &[String]| {
        if !lines.is_empty() {
            println!("\n{title}:");
            for l in lines {
                println!("- {l}");
            }
        }
    };
    section(
        "Explained client errors",
        &explained
            .iter()
            .map(|(e, x)| format!("{} — {x}", report::describe(e)))
            .collect::<Vec<_>>(),
    );
    section(
        "UNEXPLAINED client errors",
        &unexplained
            .iter()
            .map(|e| report::describe(e))
            .collect::<Vec<_>>(),
    );
    section("nginx -t failures", &t_failures);
    section(
        "Set mismatches",
        &mismatches.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    );
    section("Not settled within 30 s", &unsettled);
    section("Fault problems", &problems);
    section("Daemon exits the soak did not cause", &unexpected_exits);
    section(
        "Error log lines of the killed workers (explained)",
        &log_ours,
    );
    section("OTHER error log lines (front nginx)", &log_other);
    section("Error log lines (backends)", &backend_log_other);
    println!();
    println!("{} passed, {} failed", rows.len() - failed, failed);
    failed
}
