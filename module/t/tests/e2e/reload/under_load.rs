//! Reloads under `wrk` load: the loop, `reload_under_load` and its memcheck form.

use super::*;

/// Reloads `n` times under load; `opts` decides the process model (and valgrind).
pub(super) fn reload_loop(
    opts: Options,
    reloads: usize,
    settle: Duration,
) -> Result<Figures, Failed> {
    let gens: Vec<Generation> = (0..=reloads).map(Generation::new).collect();
    let mut ng = opts.start(&gens[0].config(0))?;
    // A generation without `us2` answers `dynamic_upstrand` naming it with 500 (an explained
    // answer): `proxy_pass` then gets an empty host.
    ng.expect_log("invalid URL prefix in \"http://\"");
    let master = ng.pid().ok_or("no master")?;
    let mut fig = Figures {
        master_rss_start: procfs::rss_kib(master).unwrap_or(0),
        ..Figures::default()
    };
    let wrk = Wrk::start(
        ng.port(),
        &PATHS,
        1,
        WRK_CONNECTIONS,
        Duration::from_secs(3600),
    )?;
    let started = Instant::now();
    std::thread::sleep(settle);
    for (g, gen) in gens.iter().enumerate().skip(1) {
        // workers of generation g - 1, after they served traffic
        let before = rss(&ng.workers());
        if g == 1 {
            fig.worker_rss_first = before.clone();
        }
        if g == WARMUP_RELOADS.min(reloads) {
            fig.worker_rss_warm = before.clone();
        }
        if g % 20 == 0 {
            fig.worker_rss_trend.push((g, median(&before)));
        }
        if g == reloads {
            fig.worker_rss_last = before;
        }
        let old = ng.reload(&gen.config(g))?;
        let t = Instant::now();
        ng.wait_exited(&old, Duration::from_secs(10) + settle * 10)?;
        fig.worker_exit_max_ms = fig.worker_exit_max_ms.max(t.elapsed().as_millis());
        if g == WARMUP_RELOADS.min(reloads) {
            fig.master_rss_warm = procfs::rss_kib(master).unwrap_or(0);
        }
        if g % 20 == 0 {
            let kib = procfs::rss_kib(master).unwrap_or(0);
            fig.master_rss_trend.push((g, kib));
        }
        // let the new generation serve some traffic before the next reload
        std::thread::sleep(settle);
    }
    fig.master_rss_end = procfs::rss_kib(master).unwrap_or(0);
    fig.seconds = started.elapsed().as_secs_f64();
    fig.reloads = reloads;
    fig.wrk = wrk.stop()?;
    let log = ng
        .stop_then(|prefix| fs::read_to_string(prefix.join("logs/front.log")))?
        .map_err(|e| format!("front.log: {e}"))?;
    let mut unexplained = Vec::new();
    for line in log.lines() {
        let v = classify(line, &gens, reloads);
        *fig.verdicts.entry(v).or_insert(0) += 1;
        if v == Verdict::Unexplained && unexplained.len() < 10 {
            unexplained.push(line.to_string());
        }
    }
    check(unexplained.is_empty(), || {
        format!(
            "answers the configuration does not explain (first 10 of {}):\n{}",
            fig.verdicts[&Verdict::Unexplained],
            unexplained.join("\n")
        )
    })?;
    Ok(fig)
}

pub(super) fn reloads_from_env(default: usize) -> usize {
    std::env::var("RELOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// [`RELOADS`] reloads under wrk load with 2 workers: every answer explained, nothing in the
/// error log, old generations exit, RSS of master and workers flat.
pub(super) fn reload_under_load() -> CaseResult {
    let f = reload_loop(
        Options::new(),
        reloads_from_env(RELOADS),
        Duration::from_millis(100),
    )?;
    report("reload_under_load", &f);
    let ok = *f.verdicts.get(&Verdict::Ok).unwrap_or(&0);
    check(ok as u64 >= f.wrk.requests / 2 && ok > 1000, || {
        format!("too little traffic was served: {ok} answers")
    })?;
    check(
        f.master_rss_end <= f.master_rss_warm + MASTER_RSS_SLACK_KIB,
        || {
            format!(
                "master RSS grew from {} KiB (after {WARMUP_RELOADS} reloads) to {} KiB (after \
                 {}): more than {MASTER_RSS_SLACK_KIB} KiB",
                f.master_rss_warm, f.master_rss_end, f.reloads
            )
        },
    )?;
    let (warm, last) = (median(&f.worker_rss_warm), median(&f.worker_rss_last));
    check(last <= warm + WORKER_RSS_SLACK_KIB, || {
        format!(
            "worker RSS grew from {:?} KiB (generation {WARMUP_RELOADS}) to {:?} KiB (last): more \
             than {WORKER_RSS_SLACK_KIB} KiB",
            f.worker_rss_warm, f.worker_rss_last
        )
    })?;
    // Every answer nginx logged reached wrk complete, except those in flight when wrk stopped
    // (at most one per connection).
    let logged = f.verdicts.values().sum::<usize>() as u64;
    check(
        logged >= f.wrk.requests && logged - f.wrk.requests <= WRK_CONNECTIONS as u64,
        || {
            format!(
                "nginx logged {logged} answers, wrk completed {}: answers lost on the way",
                f.wrk.requests
            )
        },
    )?;
    // Each reload's old workers close every idle keep-alive connection once (nginx drops a
    // request that arrives on it at that moment, unread and unlogged: wrk counts a read error).
    // Nothing else may fail.
    let conns = WRK_CONNECTIONS as u64 * f.reloads as u64;
    check(
        f.wrk.connect_errors + f.wrk.write_errors + f.wrk.timeouts == 0
            && f.wrk.read_errors <= conns,
        || format!("wrk socket errors: {:?}", f.wrk),
    )
}

/// `ERROR SUMMARY` lines of every valgrind log in `dir` (one log per process).
pub(super) fn valgrind_summaries(dir: &Path) -> Result<Vec<(String, String)>, Failed> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| e.to_string())? {
        let p = e.map_err(|e| e.to_string())?.path();
        if !p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vg."))
        {
            continue;
        }
        let text = fs::read_to_string(&p).map_err(|e| e.to_string())?;
        for l in text.lines().filter(|l| l.contains("ERROR SUMMARY:")) {
            out.push((p.display().to_string(), l.to_string()));
        }
    }
    out.sort();
    Ok(out)
}

/// The reload loop with nginx (master and workers) under valgrind memcheck; every process's
/// valgrind log must end with `ERROR SUMMARY: 0 errors`: no invalid access, no use of
/// uninitialised memory, no definite leak (nginx 1.22's own leaks are suppressed by
/// `module/t/valgrind/nginx-1.22.supp`, which says how they were found). Ignored in CI (minutes); run by
/// `module/t/bench/reload-memcheck.sh`. `VALGRIND_LOGS` keeps the logs in that directory.
pub(super) fn reload_under_load_memcheck() -> CaseResult {
    let keep = std::env::var_os("VALGRIND_LOGS").map(std::path::PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("cu-reload-vg-{}", std::process::id()))
    });
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let log_file = format!("--log-file={}/vg.%p.log", dir.display());
    let supp = format!(
        "--suppressions={}/valgrind/nginx-1.22.supp",
        env!("CARGO_MANIFEST_DIR")
    );
    let opts = Options::new()
        .wrapper(&[
            "valgrind",
            "--tool=memcheck",
            "--trace-children=yes",
            "--child-silent-after-fork=no",
            "--num-callers=40",
            "--error-limit=no",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            &supp,
            &log_file,
        ])
        .timeouts(Duration::from_secs(120), Duration::from_secs(120));
    let result = reload_loop(
        opts,
        reloads_from_env(MEMCHECK_RELOADS),
        Duration::from_millis(1500),
    );
    let summaries = valgrind_summaries(&dir)?;
    if keep.is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    let f = result?;
    report("reload_under_load_memcheck", &f);
    for (file, line) in &summaries {
        println!("reload_under_load_memcheck: {file}: {line}");
    }
    check(!summaries.is_empty(), || {
        "no valgrind ERROR SUMMARY found".into()
    })?;
    let bad: Vec<&(String, String)> = summaries
        .iter()
        .filter(|(_, l)| !l.contains("ERROR SUMMARY: 0 errors"))
        .collect();
    check(bad.is_empty(), || format!("valgrind found errors: {bad:?}"))
}
