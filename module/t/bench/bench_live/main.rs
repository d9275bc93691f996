//! Zero-reload server changes under keep-alive load, through the daemon.
//!
//! ```sh
//! cargo build --release -p tributary -p tributary-plugin-static -p ngx-combined-upstreams
//! python3 scripts/bench-live.py [--seconds 60] [--segment-seconds 10] [--interval-ms 100]
//!                               [--modes none,live,reload[,weights]] [--no-probe] [--json FILE]
//!                               [--think-ms N] [--connections 32]
//! # = cargo bench -p combined-upstreams-tests --bench bench_live -- [the same options]
//! ```
//! One stack per mode, all started first and kept up for the whole run: a fresh nginx (master + 2
//! workers, the combined-upstreams module loaded, its upstreams API on a unix socket; `ngx_harness`)
//! with 4 backends and a front server proxying to the upstream `bench` (keepalive 16), and a fresh
//! `tributary serve` (static plugin) managing it with `--apply live` or `--apply reload` (`none`:
//! live mode, no changes: the baseline; `weights`, not run by default: live mode, each change only
//! flips the one server's weight between 1 and 2 — all the work of a live change, no traffic moved,
//! no prober; `twin`, not run by default: a second `none`, to see how far two identical stacks
//! differ on the machine). The modes then take turns in segments of `--segment-seconds` (order
//! rotated every round) until each had `--seconds`. In a segment `wrk -c32` keeps keep-alive
//! connections on the mode's front server (with `--think-ms N` each connection waits N ms after an
//! answer) while (live, reload) a driver saves the binding every `--interval-ms` (rotating over the
//! 4 backends) through the daemon's API, without waiting; after each save a prober opens new
//! connections to the front server until an answer comes from the new set.
//!
//! Reported per mode: requests/s, p50/p99/max latency over all its segments (wrk's latency
//! histograms merged exactly) and the spread of the segments' p99; non-2xx and socket errors;
//! reloads and worker processes started (nginx's error log); nginx RSS peak (master + workers, 100 ms
//! samples); CPU seconds of nginx, of the daemon and of the commands it ran. Change latency, with the
//! definitions of docs/live-api.md: decided→visible and decided→confirmed (daemon) and their parts
//! from the daemon's "applied live" log lines; decided→seen (outside) and save→seen from the
//! probers. Ratios against `none` of the same run. Every process started is stopped at the end.
//! Environment: `COMBINED_UPSTREAMS_MODULE`, `NGINX_BIN`, `BENCH_PROFILE` (`release`, or `debug`
//! for the debug builds of the daemon and plugin), `TRIBUTARY_BIN` (another build of the daemon),
//! `CARGO_TARGET_DIR`.

#[path = "../common/mod.rs"]
mod common;
mod report;
mod stack;

use std::path::PathBuf;

use common::{Res, Scratch};
use stack::{Bins, Stack};

/// Modes without changes: `none`, the baseline, and `twin`, a second stack like it.
pub const IDLE: [&str; 2] = ["none", "twin"];

/// The command line (the options of the former `scripts/bench-live.py`).
pub struct Args {
    pub seconds: u64,
    pub segment_seconds: u64,
    pub interval_ms: u64,
    pub connections: usize,
    pub modes: Vec<String>,
    pub json: Option<PathBuf>,
    pub think_ms: u64,
    pub no_probe: bool,
}

const USAGE: &str = "options: --seconds N (60) --segment-seconds N (10) --interval-ms N (100) \
    --connections N (32) --modes none,live,reload[,weights,twin] --json FILE --think-ms N (0) --no-probe";

fn parse_args() -> Res<Args> {
    let mut a = Args {
        seconds: 60,
        segment_seconds: 10,
        interval_ms: 100,
        connections: 32,
        modes: vec!["none".into(), "live".into(), "reload".into()],
        json: None,
        think_ms: 0,
        no_probe: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value; {USAGE}"))
        };
        let num = |v: String| -> Res<u64> {
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number").into())
        };
        match name.as_str() {
            "--bench" => {} // added by `cargo bench`
            "--seconds" => a.seconds = num(value()?)?,
            "--segment-seconds" => a.segment_seconds = num(value()?)?.max(1),
            "--interval-ms" => a.interval_ms = num(value()?)?.max(1),
            "--connections" => a.connections = num(value()?)? as usize,
            "--think-ms" => a.think_ms = num(value()?)?,
            "--json" => a.json = Some(PathBuf::from(value()?)),
            "--no-probe" => a.no_probe = true,
            "--modes" => {
                a.modes = value()?.split(',').map(str::to_string).collect();
                for m in &a.modes {
                    if !["none", "live", "reload", "weights", "twin"].contains(&m.as_str()) {
                        return Err(format!("unknown mode {m:?}; {USAGE}").into());
                    }
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {arg:?}; {USAGE}").into()),
        }
    }
    Ok(a)
}

fn loadavg() -> String {
    let t = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let f: Vec<&str> = t.split_whitespace().take(3).collect();
    format!("{f:?}")
}

fn run() -> Res<()> {
    let a = parse_args()?;
    let root = ngx_harness::workspace_root()
        .canonicalize()
        .map_err(|e| format!("workspace root: {e}"))?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let profile = common::env_str("BENCH_PROFILE", "release");
    let bins = Bins {
        tributary: std::env::var_os("TRIBUTARY_BIN")
            .map_or_else(|| target.join(&profile).join("tributary"), PathBuf::from),
        static_plugin: target.join(&profile).join("tributary-plugin-static"),
        root,
    };
    common::module_so()?;
    for need in [&bins.tributary, &bins.static_plugin] {
        if !need.is_file() {
            return Err(format!(
                "{} is missing (cargo build --release -p tributary -p tributary-plugin-static -p \
                 ngx-combined-upstreams)",
                need.display()
            )
            .into());
        }
    }
    common::require("bench-live", &["wrk"], "scripts/setup.sh")?;
    let rounds = (a.seconds / a.segment_seconds).max(1);
    println!(
        "load average at start: {}  cpus: {}",
        loadavg(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!(
        "{rounds} rounds of {} s per mode ({}; order rotated each round), wrk -c{}{}, a change every {} ms in live/reload",
        a.segment_seconds,
        a.modes.join(", "),
        a.connections,
        if a.think_ms > 0 {
            format!(" with {} ms think time", a.think_ms)
        } else {
            String::new()
        },
        a.interval_ms
    );
    let scratch = Scratch::new("bench-live")?;
    let lua = scratch.path().join("hist.lua");
    let mut script = stack::WRK_LUA.to_string();
    if a.think_ms > 0 {
        script.push_str(&format!("delay = function() return {} end\n", a.think_ms));
    }
    std::fs::write(&lua, script).map_err(|e| format!("write hist.lua: {e}"))?;

    let mut stacks: Vec<Stack> = Vec::new();
    let measured = (|| -> Res<Vec<Vec<stack::Segment>>> {
        for m in &a.modes {
            stacks.push(Stack::start(m, &bins)?);
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        let mut segs: Vec<Vec<stack::Segment>> = a.modes.iter().map(|_| Vec::new()).collect();
        let n = a.modes.len();
        for r in 0..rounds as usize {
            for k in 0..n {
                let idx = (r % n + k) % n;
                let st = &mut stacks[idx];
                let idle = IDLE.contains(&st.mode.as_str());
                let s = stack::run_segment(
                    st,
                    a.segment_seconds,
                    a.interval_ms,
                    a.connections,
                    &lua,
                    !idle,
                    !a.no_probe,
                )?;
                println!(
                    "  round {} {}: p99 {:.2} ms, {:.0} req/s, {} reloads",
                    r + 1,
                    st.mode,
                    report::hist_pct(&s.hist, 0.99) / 1000.0,
                    s.requests as f64 / s.seconds,
                    s.reloads
                );
                segs[idx].push(s);
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
        Ok(segs)
    })();
    let mut results = Vec::new();
    if let Ok(segs) = &measured {
        for (st, segs) in stacks.iter().zip(segs) {
            let lines = if st.mode == "reload" {
                Vec::new()
            } else {
                report::live_lines(&st.dlog)
            };
            results.push(report::summarize(&st.mode, segs, lines));
        }
    }
    let problems: Vec<String> = stacks.into_iter().filter_map(Stack::stop).collect();
    measured?;
    report::print(&results);
    println!("load average at end: {}", loadavg());
    if let Some(path) = &a.json {
        let v: Vec<serde_json::Value> = results.iter().map(report::Summary::to_json).collect();
        std::fs::write(path, serde_json::to_string_pretty(&v).unwrap_or_default())
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    if !problems.is_empty() {
        return Err(problems.join("\n").into());
    }
    Ok(())
}

fn main() {
    common::main("bench-live", run);
}
