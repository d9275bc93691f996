//! The figures of `bench_live`: per-mode summaries of the segments, the daemon's "applied live"
//! lines, and the printed table, change latencies and ratios against `none`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::stack::{Probe, Segment};
use crate::IDLE;

/// The value (µs) at quantile `q` of a {value: count} histogram, as wrk computes it.
pub fn hist_pct(hist: &BTreeMap<u64, u64>, q: f64) -> f64 {
    let total: u64 = hist.values().sum();
    if total == 0 {
        return f64::NAN;
    }
    let want = q * total as f64;
    let mut acc = 0u64;
    for (v, n) in hist {
        acc += n;
        if acc as f64 >= want {
            return *v as f64;
        }
    }
    hist.keys().last().map_or(f64::NAN, |v| *v as f64)
}

/// The value at quantile `q` of `v` (nearest rank, ties to the even rank).
pub fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    // Python's round() (the former script's): halves to even.
    let i = (q * (s.len() - 1) as f64).round_ties_even() as usize;
    s[i.min(s.len() - 1)]
}

/// One "applied live" line: its numeric fields and `first_server`.
#[derive(Default, Clone)]
pub struct LiveLine {
    pub fields: BTreeMap<String, f64>,
    pub first_server: Option<String>,
}

/// The daemon's "applied live" lines.
pub fn live_lines(path: &Path) -> Vec<LiveLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("applied live"))
        .map(|l| {
            let mut out = LiveLine::default();
            for tok in l.split_whitespace() {
                let Some((k, v)) = tok.split_once('=') else {
                    continue;
                };
                let key_ok = !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_');
                if !key_ok {
                    continue;
                }
                if k == "first_server" {
                    out.first_server = Some(v.trim_matches('"').to_string());
                } else if v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                    if let Ok(n) = v.parse() {
                        out.fields.insert(k.to_string(), n);
                    }
                }
            }
            out
        })
        .collect()
}

/// One mode over all its segments.
pub struct Summary {
    pub mode: String,
    pub segments: usize,
    pub seconds: f64,
    pub requests: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub segment_p99_ms: Vec<f64>,
    pub non2xx: u64,
    pub socket_errors: u64,
    pub changes_sent: u64,
    pub put_errors: u64,
    pub reloads: usize,
    pub workers_started: usize,
    pub rss_peak_kib: u64,
    /// nginx, daemon, the daemon's commands (CPU seconds).
    pub cpu: [f64; 3],
    pub save_seen_ms: Vec<f64>,
    pub decided_seen_ms: Vec<f64>,
    pub not_seen_within_2s: usize,
    pub live: Vec<LiveLine>,
}

pub fn summarize(mode: &str, segs: &[Segment], lines: Vec<LiveLine>) -> Summary {
    let mut hist = BTreeMap::new();
    for s in segs {
        for (v, n) in &s.hist {
            *hist.entry(*v).or_insert(0) += n;
        }
    }
    let seconds: f64 = segs.iter().map(|s| s.seconds).sum();
    let probes: Vec<&Probe> = segs.iter().flat_map(|s| &s.probes).collect();
    let (mut save_seen, mut decided_seen, mut unseen) = (Vec::new(), Vec::new(), 0);
    for (sent, seen, _) in &probes {
        match seen {
            None => unseen += 1,
            Some(seen) => save_seen.push((seen - sent) * 1000.0),
        }
    }
    // A decision carries the bytes of the newest save of its set sent before it (saves that
    // arrive while a change is applied are coalesced); that save's prober saw the change when it
    // first got an answer from the set.
    for l in &lines {
        let d = l.fields.get("decided_unix_ms").copied().unwrap_or(0.0) / 1000.0;
        let newest = probes
            .iter()
            .filter(|p| Some(&p.2) == l.first_server.as_ref() && p.0 <= d)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, Some(seen), _)) = newest {
            if *seen >= d {
                decided_seen.push((seen - d) * 1000.0);
            }
        }
    }
    let err: Vec<u64> = (0..5)
        .map(|i| segs.iter().map(|s| s.errors[i]).sum())
        .collect();
    let requests: u64 = segs.iter().map(|s| s.requests).sum();
    let sum3 = |i: usize| segs.iter().map(|s| s.cpu[i]).sum::<f64>();
    Summary {
        mode: mode.to_string(),
        segments: segs.len(),
        seconds,
        requests,
        rps: requests as f64 / seconds,
        p50_ms: hist_pct(&hist, 0.5) / 1000.0,
        p99_ms: hist_pct(&hist, 0.99) / 1000.0,
        max_ms: hist.keys().last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
        segment_p99_ms: segs
            .iter()
            .map(|s| hist_pct(&s.hist, 0.99) / 1000.0)
            .collect(),
        non2xx: err[3],
        socket_errors: err[0] + err[1] + err[2] + err[4],
        changes_sent: segs.iter().map(|s| s.changes_sent).sum(),
        put_errors: segs.iter().map(|s| s.put_errors).sum(),
        reloads: segs.iter().map(|s| s.reloads).sum(),
        workers_started: segs.iter().map(|s| s.workers_started).sum(),
        rss_peak_kib: segs.iter().map(|s| s.rss_peak_kib).max().unwrap_or(0),
        cpu: [sum3(0), sum3(1), sum3(2)],
        save_seen_ms: save_seen,
        decided_seen_ms: decided_seen,
        not_seen_within_2s: unseen,
        live: lines,
    }
}

impl Summary {
    pub fn to_json(&self) -> serde_json::Value {
        let live: Vec<serde_json::Value> = self
            .live
            .iter()
            .map(|l| {
                let mut m: serde_json::Map<String, serde_json::Value> = l
                    .fields
                    .iter()
                    .map(|(k, v)| (k.clone(), (*v).into()))
                    .collect();
                if let Some(f) = &l.first_server {
                    m.insert("first_server".into(), f.clone().into());
                }
                m.into()
            })
            .collect();
        serde_json::json!({
            "mode": self.mode, "segments": self.segments, "seconds": self.seconds,
            "requests": self.requests, "rps": self.rps, "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms, "max_ms": self.max_ms, "segment_p99_ms": self.segment_p99_ms,
            "non2xx": self.non2xx, "socket_errors": self.socket_errors,
            "changes_sent": self.changes_sent, "put_errors": self.put_errors,
            "reloads": self.reloads, "workers_started": self.workers_started,
            "rss_peak_kib": self.rss_peak_kib, "cpu_nginx_s": self.cpu[0],
            "cpu_daemon_s": self.cpu[1], "cpu_commands_s": self.cpu[2],
            "save_seen_ms": self.save_seen_ms, "decided_seen_ms": self.decided_seen_ms,
            "not_seen_within_2s": self.not_seen_within_2s, "live": live,
        })
    }

    fn col(&self, k: &str) -> Vec<f64> {
        self.live
            .iter()
            .filter_map(|l| l.fields.get(k).copied())
            .collect()
    }
}

/// `p50/p99/max` of `v`, or `-`.
fn fmt3(v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let max = v.iter().copied().fold(f64::MIN, f64::max);
    format!(
        "{:.digits$}/{:.digits$}/{max:.digits$}",
        pct(v, 0.5),
        pct(v, 0.99)
    )
}

fn min_max(v: &[f64]) -> (f64, f64) {
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

pub fn print(results: &[Summary]) {
    println!();
    println!(
        "| mode | req/s | p50 ms | p99 ms (segments min/median/max) | max ms | non-2xx | socket errors \
         | changes | reloads | workers started | nginx RSS peak MiB | CPU s nginx / daemon / its commands |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let sp = &r.segment_p99_ms;
        let (lo, hi) = min_max(sp);
        println!(
            "| {} | {:.0} | {:.2} | {:.2} ({lo:.1}/{:.1}/{hi:.1}) | {:.1} | {} | {} | {} | {} | {} | {:.1} | {:.1} / {:.1} / {:.1} |",
            r.mode,
            r.rps,
            r.p50_ms,
            r.p99_ms,
            pct(sp, 0.5),
            r.max_ms,
            r.non2xx,
            r.socket_errors,
            r.changes_sent,
            r.reloads,
            r.workers_started,
            r.rss_peak_kib as f64 / 1024.0,
            r.cpu[0],
            r.cpu[1],
            r.cpu[2]
        );
    }
    println!();
    println!("change latency, p50/p99/max ms (n):");
    for r in results {
        if IDLE.contains(&r.mode.as_str()) {
            continue;
        }
        println!(
            "  {}: save→seen {} ({}, {} not within 2 s); decided→seen (outside) {} ({})",
            r.mode,
            fmt3(&r.save_seen_ms, 1),
            r.save_seen_ms.len(),
            r.not_seen_within_2s,
            fmt3(&r.decided_seen_ms, 1),
            r.decided_seen_ms.len()
        );
        if !r.live.is_empty() {
            println!(
                "    daemon ({} live changes): decided→visible {}, decided→confirmed {}",
                r.live.len(),
                fmt3(&r.col("decided_to_visible_ms"), 1),
                fmt3(&r.col("decided_to_confirmed_ms"), 1)
            );
            let parts: Vec<String> = [
                "waited_ms",
                "write_ms",
                "test_ms",
                "list_wait_ms",
                "put_ms",
                "readback_ms",
            ]
            .iter()
            .map(|k| format!("{} {}", &k[..k.len() - 3], fmt3(&r.col(k), 2)))
            .collect();
            println!("    components p50/p99/max: {}", parts.join(", "));
            let vis = r.col("decided_to_visible_ms");
            println!(
                "    decided→visible under 50 ms: {}/{}",
                vis.iter().filter(|v| **v < 50.0).count(),
                vis.len()
            );
        }
    }
    let Some(base) = results.iter().find(|r| r.mode == "none") else {
        return;
    };
    for r in results.iter().filter(|r| r.mode != "none") {
        let per_round: Vec<f64> = r
            .segment_p99_ms
            .iter()
            .zip(&base.segment_p99_ms)
            .map(|(x, y)| x / y)
            .collect();
        let (lo, hi) = min_max(&per_round);
        let seg_med = pct(&r.segment_p99_ms, 0.5) / pct(&base.segment_p99_ms, 0.5);
        let cpu_per_req =
            (r.cpu[0] / r.requests.max(1) as f64) / (base.cpu[0] / base.requests.max(1) as f64);
        println!(
            "{} / none: req/s {:.3}, p99 {:.3} (median segment p99 {seg_med:.3}) (per round min/median/max \
             {lo:.2}/{:.2}/{hi:.2}), p50 {:.3}, max {:.3}, RSS peak {:.3}, nginx CPU per request {cpu_per_req:.3}",
            r.mode,
            r.rps / base.rps,
            r.p99_ms / base.p99_ms,
            pct(&per_round, 0.5),
            r.p50_ms / base.p50_ms,
            r.max_ms / base.max_ms,
            r.rss_peak_kib as f64 / base.rss_peak_kib.max(1) as f64,
        );
    }
}
