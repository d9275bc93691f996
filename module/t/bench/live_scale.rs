//! Scale benchmark of the live upstream API: sets of 1 to 10,000 servers changed at
//! 10 `PUT`s a second — `PUT` latency p50/p99 per size — and the zone's slab figures and the
//! workers' memory before and after 10,000 change cycles.
//!
//! Command (from the workspace root; the module's release build):
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! cargo bench -p combined-upstreams-tests --bench live_scale
//! ```
//! Environment:
//! - `LIVE_SCALE_SIZES` (default `1,10,100,1000,10000,100x1000`): the sets; `UxN` is `U`
//!   upstreams of `N` servers each, in a zone each, with the `PUT`s spread over them in turn.
//! - `LIVE_SCALE_SECS` (default 60): seconds of the latency phase, at `LIVE_SCALE_RATE`
//!   (default 10) `PUT`s a second.
//! - `LIVE_SCALE_CYCLES` (default 10000): change `PUT`s per size after the warm-up (the latency
//!   phase's included); the rest are sent back to back (faster than 10/s).
//!
//! Per size: nginx (master + 2 workers, the module, the API on a loopback port) with the
//! upstream(s) of `churn.rs`'s configuration; one `PUT` of the base set, the warm-up (one full
//! pass of the changed blocks over the set: `2 × 100` `PUT`s, fewer for sets under 100 servers),
//! then the slab figures (`GET <loc>/NAME?slab`) and each worker's `VmRSS` and `RssAnon`; the
//! latency phase (client-side time from connect to the whole answer, one new connection per
//! `PUT`, as the daemon's client does); the rest of the cycles back to back; then the figures
//! again, on the base set. Every `PUT` must answer 200.

#[allow(dead_code)]
#[path = "../tests/e2e/live_api/churn.rs"]
mod churn;
#[allow(dead_code)]
#[path = "../tests/e2e/live_api/helpers.rs"]
mod helpers;
#[allow(dead_code)]
#[path = "../tests/e2e/live_api/master.rs"]
mod master;

use std::time::{Duration, Instant};

use churn::{config, slab_figures, worker_memory, zone_bytes, Churn};
use master::Master;
use ngx_harness::Failed;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A size: `upstreams` upstreams of `servers` servers.
#[derive(Clone, Copy)]
struct Size {
    upstreams: usize,
    servers: usize,
}

fn parse_sizes(text: &str) -> Vec<Size> {
    text.split(',')
        .filter_map(|s| {
            let s = s.trim();
            let (u, n) = s.split_once('x').unwrap_or(("1", s));
            Some(Size {
                upstreams: u.parse().ok()?,
                servers: n.parse().ok()?,
            })
        })
        .collect()
}

/// The `q` quantile of sorted durations, in ms.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// One timed `PUT`: connect, send, whole answer.
fn timed_put(m: &Master, name: &str, body: &str) -> Result<Duration, Failed> {
    let t = Instant::now();
    let r = m.put(name, body)?;
    let d = t.elapsed();
    if r.status != 200 {
        return Err(format!("PUT /api/{name}: {} {}", r.status, r.text()).into());
    }
    Ok(d)
}

struct Row {
    size: Size,
    zone: usize,
    first_put_ms: f64,
    warm: u64,
    rated: Vec<Duration>,
    /// Worker CPU time (user + system, both workers) per `PUT` of the latency phase, ms.
    rated_cpu_ms: f64,
    late: usize,
    fast: Vec<Duration>,
    fast_secs: f64,
    cycles: u64,
    slab_before: Vec<(u64, u64, u64)>,
    slab_after: Vec<(u64, u64, u64)>,
    /// (pid, VmRSS, RssAnon) before and after, KiB.
    mem_before: Vec<(u32, u64, u64)>,
    mem_after: Vec<(u32, u64, u64)>,
    workers_same: bool,
}

fn run_size(size: Size, secs: u64, rate: u64, cycles: u64) -> Result<Row, Failed> {
    let mut churns: Vec<Churn> = (0..size.upstreams)
        .map(|u| Churn::new(&format!("u{u}"), u, size.servers, (u as u64) << 32))
        .collect();
    let m = Master::start(&config(&churns))?;
    let workers = m.workers();
    let t = Instant::now();
    for ch in &churns {
        timed_put(&m, &ch.name, &ch.base_body())?;
    }
    let first_put_ms = t.elapsed().as_secs_f64() * 1000.0 / size.upstreams as f64;
    // Warm-up (`Churn::warm_up_puts`): every base server removed and added back once.
    let warm = churns[0].warm_up_puts();
    for ch in churns.iter_mut() {
        for _ in 0..warm {
            let (body, _) = ch.next_body();
            timed_put(&m, &ch.name, &body)?;
        }
    }
    let names: Vec<String> = churns.iter().map(|c| c.name.clone()).collect();
    let slab_before = names
        .iter()
        .map(|n| slab_figures(&m, n))
        .collect::<Result<Vec<_>, _>>()?;
    let mem = |ws: &std::collections::BTreeSet<u32>| {
        ws.iter()
            .map(|&p| {
                let (rss, anon) = worker_memory(p);
                (p, rss, anon)
            })
            .collect::<Vec<_>>()
    };
    let mem_before = mem(&workers);
    let worker_cpu = || -> u64 {
        workers
            .iter()
            .filter_map(|&p| ngx_harness::procfs::cpu_ticks(p))
            .sum()
    };
    let cpu0 = worker_cpu();

    // Latency phase: `rate` PUTs a second, over the upstreams in turn.
    let total_rated = (secs * rate).min(cycles);
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let mut rated = Vec::with_capacity(total_rated as usize);
    let mut late = 0;
    let start = Instant::now();
    for k in 0..total_rated {
        let ch = &mut churns[k as usize % size.upstreams];
        let (body, _) = ch.next_body();
        let at = start + period * k as u32;
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        } else if now - at > period {
            late += 1;
        }
        rated.push(timed_put(&m, &ch.name, &body)?);
    }
    let rated_cpu_ms = (worker_cpu() - cpu0) as f64 * 1000.0
        / ngx_harness::procfs::clock_ticks_per_second() as f64
        / total_rated.max(1) as f64;
    // The rest back to back, until every upstream made its share and is back on its base set.
    let per_upstream = cycles.div_ceil(size.upstreams as u64);
    let mut fast = Vec::new();
    let tf = Instant::now();
    let trace = std::env::var_os("LIVE_SCALE_TRACE").is_some();
    for ch in churns.iter_mut() {
        while ch.puts - warm < per_upstream || ch.puts % 2 == 1 {
            let (body, base) = ch.next_body();
            fast.push(timed_put(&m, &ch.name, &body)?);
            if trace && (base || ch.puts % 100 == 1) {
                println!(
                    "trace {} put {} base {base}: {:?}",
                    ch.name,
                    ch.puts,
                    slab_figures(&m, &ch.name)?
                );
            }
        }
    }
    let fast_secs = tf.elapsed().as_secs_f64();
    let done: u64 = churns.iter().map(|c| c.puts - warm).sum();
    let slab_after = names
        .iter()
        .map(|n| slab_figures(&m, n))
        .collect::<Result<Vec<_>, _>>()?;
    let mem_after = mem(&workers);
    let workers_same = m.workers() == workers && !m.error_log().contains("exited on signal");
    rated.sort();
    fast.sort();
    Ok(Row {
        size,
        zone: zone_bytes(size.servers),
        first_put_ms,
        warm,
        rated,
        rated_cpu_ms,
        late,
        fast,
        fast_secs,
        cycles: done,
        slab_before,
        slab_after,
        mem_before,
        mem_after,
        workers_same,
    })
}

fn label(s: Size) -> String {
    if s.upstreams == 1 {
        format!("{}", s.servers)
    } else {
        format!("{} × {}", s.upstreams, s.servers)
    }
}

/// Slab figures of one or many zones: the zone's own, or (many) how many zones are unchanged.
fn slab_text(before: &[(u64, u64, u64)], after: &[(u64, u64, u64)]) -> (String, String) {
    if before.len() == 1 {
        let (b, a) = (before[0], after[0]);
        return (
            format!("{} / {} → {} / {}", b.0, b.1, a.0, a.1),
            format!("{}", a.2),
        );
    }
    let same_chunks = before.iter().zip(after).filter(|(b, a)| b.0 == a.0).count();
    let same_pages = before.iter().zip(after).filter(|(b, a)| b.1 == a.1).count();
    let pages_delta: i64 = before
        .iter()
        .zip(after)
        .map(|(b, a)| a.1 as i64 - b.1 as i64)
        .sum();
    let fails: u64 = after.iter().map(|a| a.2).sum();
    (
        format!(
            "{} zones: chunks same in {same_chunks}, pages_free same in {same_pages} (sum Δ {pages_delta})",
            before.len()
        ),
        format!("{fails}"),
    )
}

fn mem_text(before: &[(u32, u64, u64)], after: &[(u32, u64, u64)]) -> (String, String) {
    let rss = before
        .iter()
        .zip(after)
        .map(|(b, a)| format!("{}→{}", b.1, a.1))
        .collect::<Vec<_>>()
        .join(", ");
    let anon = before
        .iter()
        .zip(after)
        .map(|(b, a)| format!("{}→{}", b.2, a.2))
        .collect::<Vec<_>>()
        .join(", ");
    (rss, anon)
}

fn main() {
    let sizes = parse_sizes(
        &std::env::var("LIVE_SCALE_SIZES")
            .unwrap_or_else(|_| "1,10,100,1000,10000,100x1000".into()),
    );
    let secs = env_num("LIVE_SCALE_SECS", 60);
    let rate = env_num("LIVE_SCALE_RATE", 10).max(1);
    let cycles = env_num("LIVE_SCALE_CYCLES", 10_000);
    println!(
        "live API scale benchmark: {secs} s at {rate} PUT/s per size, {cycles} change PUTs per size after the warm-up"
    );
    let mut rows = Vec::new();
    let mut failed = false;
    for s in sizes {
        let t = Instant::now();
        match run_size(s, secs, rate, cycles) {
            Ok(r) => {
                println!(
                    "size {}: done in {:.0} s (p50 {:.2} ms, p99 {:.2} ms at {rate}/s)",
                    label(s),
                    t.elapsed().as_secs_f64(),
                    quantile_ms(&r.rated, 0.5),
                    quantile_ms(&r.rated, 0.99)
                );
                rows.push(r);
            }
            Err(e) => {
                println!("size {}: FAILED: {:?}", label(s), e.message());
                failed = true;
            }
        }
    }
    println!();
    println!("| servers | zone | first PUT of the set, ms | PUTs at {rate}/s (late) | PUT p50 / p99 / max ms at {rate}/s | worker CPU per PUT, ms | back-to-back PUTs: p50 / p99 ms, PUT/s | change cycles after warm-up (warm-up) | slab chunks_used / pages_free: before → after | alloc_failures | worker VmRSS KiB before→after | worker RssAnon KiB before→after | workers kept |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let (slab, fails) = slab_text(&r.slab_before, &r.slab_after);
        let (rss, anon) = mem_text(&r.mem_before, &r.mem_after);
        println!(
            "| {} | {} KiB{} | {:.1} | {} ({}) | {:.2} / {:.2} / {:.2} | {:.2} | {:.2} / {:.2}, {:.0} | {} ({}) | {} | {} | {} | {} | {} |",
            label(r.size),
            r.zone / 1024,
            if r.size.upstreams > 1 { " each" } else { "" },
            r.first_put_ms,
            r.rated.len(),
            r.late,
            quantile_ms(&r.rated, 0.5),
            quantile_ms(&r.rated, 0.99),
            r.rated.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
            r.rated_cpu_ms,
            quantile_ms(&r.fast, 0.5),
            quantile_ms(&r.fast, 0.99),
            r.fast.len() as f64 / r.fast_secs.max(1e-9),
            r.cycles,
            r.warm,
            slab,
            fails,
            rss,
            anon,
            if r.workers_same { "yes" } else { "NO" },
        );
    }
    if failed {
        std::process::exit(1);
    }
}
