//! What the module benches (`module/t/bench/*.rs`, `harness = false`) share on top of
//! `ngx_harness`: environment knobs, medians and ratios, a `wrk` run to completion (optionally
//! pinned to a CPU), CPU time of nginx workers from `/proc`, a scratch directory, and the exit
//! convention (an error is printed as `<bench>: <message>` and the process exits 1).
//!
//! Each bench runs nginx through `ngx_harness` (`Options::start`: master + workers unless the bench
//! says otherwise, free 127.0.0.1 ports, stop with `SIGQUIT`, error log checked). The module `.so` is
//! `$COMBINED_UPSTREAMS_MODULE` (the `.sh` wrappers set it from their `[SO]` argument) or the
//! release build.

#![allow(dead_code)] // each bench uses a part

pub mod memcheck;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ngx_harness::{procfs, Failed, WrkReport};

/// A bench's result: the error names what went wrong.
pub type Res<T> = Result<T, Failed>;

/// Runs the bench; on error prints `name: message` on stderr and exits 1.
pub fn main(name: &str, bench: impl FnOnce() -> Res<()>) {
    if let Err(e) = bench() {
        eprintln!("{name}: {}", e.message().unwrap_or("failed"));
        std::process::exit(1);
    }
}

/// `$name` parsed as a number, else `default` (an unparsable value is an error, not the default).
pub fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Res<T> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a number").into()),
        _ => Ok(default),
    }
}

/// `$name` or `default`.
pub fn env_str(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Fails unless every tool is found on `PATH` (`hint` says how to install them).
pub fn require(bench: &str, tools: &[&str], hint: &str) -> Res<()> {
    for t in tools {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(t).is_file()));
        if !found {
            return Err(
                format!("{t} not found ({hint}); {bench} needs {}", tools.join(", ")).into(),
            );
        }
    }
    Ok(())
}

/// The module `.so` the bench measures, made absolute; fails when it is missing.
pub fn module_so() -> Res<PathBuf> {
    let so = ngx_harness::module_path();
    so.canonicalize().map_err(|_| {
        format!(
            "module not found at {} (cargo build --release -p ngx-combined-upstreams)",
            so.display()
        )
        .into()
    })
}

/// Median of `v` (the mean of the two middle values for an even count); 0 when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Median of integers, the even case rounded down (as the bash benches printed it).
pub fn median_u64(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    match s.len() {
        0 => 0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2,
    }
}

/// `a / b` with three decimals.
pub fn ratio3(a: f64, b: f64) -> String {
    format!("{:.3}", a / b)
}

/// Runs `wrk` to completion against 127.0.0.1:`port``path` (`--latency`), optionally pinned to
/// `cpu` with `taskset`; fails on a non-zero exit or an unreadable summary.
pub fn wrk(
    port: u16,
    path: &str,
    threads: usize,
    conns: usize,
    secs: u64,
    cpu: Option<usize>,
) -> Res<WrkReport> {
    let mut c = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg("wrk");
            c
        }
        None => Command::new("wrk"),
    };
    let out = c
        .arg(format!("-t{threads}"))
        .arg(format!("-c{conns}"))
        .arg(format!("-d{secs}s"))
        .arg("--latency")
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "wrk exited {}: {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(WrkReport::parse(&text).ok_or_else(|| format!("cannot read wrk's summary:\n{text}"))?)
}

/// CPU ticks (user + system) the given processes used so far (a process gone counts 0).
pub fn ticks(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| procfs::cpu_ticks(*p)).sum()
}

/// Ticks as seconds.
pub fn ticks_secs(t: u64) -> f64 {
    t as f64 / procfs::clock_ticks_per_second() as f64
}

/// A scratch directory, removed on drop unless kept.
pub struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    /// A new directory under the temp dir, named after the bench.
    pub fn new(name: &str) -> Res<Scratch> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("cu-bench-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
        Ok(Scratch { path, keep: false })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place at drop.
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Sleeps `ms` milliseconds.
pub fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}
