//! The module benchmark against hand-written nginx configuration, both measured in the same run
//! on this machine (compare the ratios, not the absolute numbers).
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/run.sh
//! # = cargo bench -p combined-upstreams-tests --bench run
//! ```
//! 1. Requests per second (`wrk`) through an upstream built with `add_upstream` vs the same
//!    servers written by hand: both wrk run at the same time in each round (half the connections
//!    each, one nginx worker); the median of the per-round ratios is reported. Target >= 0.98.
//! 2. `nginx -t` CPU time (user + system, from `/proc/PID/schedstat` of the exited process before
//!    it is reaped) for 1,000 upstreams built with `add_upstream` vs the same 1,000 upstreams
//!    written out by hand (both configurations load the module), median of `TRIES` runs.
//!    Target <= 1.2.
//!
//! Environment: `COMBINED_UPSTREAMS_MODULE`, `NGINX_BIN`, `ROUNDS` (default 5), `DURATION` (wrk
//! seconds per round, default 5), `CONNS` (default 32), `TRIES` (default 15).

mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{env_num, median, ratio3, Res, Scratch};
use ngx_harness::{nginx_bin, Nginx};
use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};

const RPS_CONF: &str = "\
server { listen 127.0.0.1:{P1}; return 200 \"b1\"; }
server { listen 127.0.0.1:{P2}; return 200 \"b2\"; }
server { listen 127.0.0.1:{P3}; return 200 \"b3\"; }
server { listen 127.0.0.1:{P4}; return 200 \"b4\"; }
upstream a { server 127.0.0.1:{P1}; server 127.0.0.1:{P2} weight=2; }
upstream b { server 127.0.0.1:{P3}; server 127.0.0.1:{P4}; }
upstream combined { add_upstream a; add_upstream b weight=3; keepalive 16; }
upstream hand {
  server 127.0.0.1:{P1}; server 127.0.0.1:{P2} weight=2;
  server 127.0.0.1:{P3} weight=3; server 127.0.0.1:{P4} weight=3;
  keepalive 16;
}
server {
  listen 127.0.0.1:{P0};
  proxy_http_version 1.1; proxy_set_header Connection \"\";
  location /combined { proxy_pass http://combined; }
  location /hand { proxy_pass http://hand; }
}
";

/// Number of upstreams of the `nginx -t` part.
const N: usize = 1000;

/// A whole `nginx.conf` with `N` upstreams, built with `add_upstream` or written out by hand.
fn t_conf(so: &Path, dir: &Path, combined: bool) -> String {
    let d = dir.display();
    let mut s = format!(
        "load_module {so};\nworker_processes 1;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n\
         client_body_temp_path {d}/tmp/body; proxy_temp_path {d}/tmp/proxy;\n\
         fastcgi_temp_path {d}/tmp/fastcgi; uwsgi_temp_path {d}/tmp/uwsgi; scgi_temp_path {d}/tmp/scgi;\n",
        so = so.display()
    );
    for i in 0..10 {
        let h = i + 1;
        let _ = writeln!(
            s,
            "  upstream src{i} {{ server 127.0.0.{h}:80 weight=2 max_fails=3; server 127.0.0.{h}:81; }}"
        );
    }
    for i in 0..N {
        let (a, b) = (i % 10, (i + 1) % 10);
        let (ha, hb) = (a + 1, b + 1);
        if combined {
            let _ = writeln!(
                s,
                "  upstream u{i} {{ add_upstream src{a}; add_upstream src{b} weight=2 backup; }}"
            );
        } else {
            let _ = writeln!(
                s,
                "  upstream u{i} {{ server 127.0.0.{ha}:80 weight=2 max_fails=3; server 127.0.0.{ha}:81; \
                 server 127.0.0.{hb}:80 weight=4 max_fails=3 backup; server 127.0.0.{hb}:81 weight=2 backup; }}"
            );
        }
    }
    s.push_str("}\n");
    s
}

/// CPU seconds (user + system) of one `nginx -t -c conf`: read from `/proc/PID/schedstat` once the
/// process has exited and before it is reaped (nanoseconds; steadier than wall time on a shared
/// machine). Fails when `nginx -t` fails.
fn nginx_t_cpu(dir: &Path, conf: &Path) -> Res<f64> {
    let child = Command::new(nginx_bin())
        .arg("-t")
        .arg("-q")
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run {}: {e}", nginx_bin().display()))?;
    let pid = Pid::from_child(&child);
    // Stderr stays small (-q); the pipe cannot fill before nginx exits.
    waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
    )
    .map_err(|e| format!("waitid {pid:?}: {e}"))?;
    let sched = std::fs::read_to_string(format!("/proc/{}/schedstat", child.id()))
        .map_err(|e| format!("read schedstat of nginx -t: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for nginx -t: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nginx -t failed on {}: {}",
            conf.display(),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let ns: u64 = sched
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("bad schedstat {sched:?}"))?;
    Ok(ns as f64 / 1e9)
}

fn run() -> Res<()> {
    let so = common::module_so()?;
    common::require("bench", &["wrk"], "apt-get install wrk")?;
    let rounds = env_num("ROUNDS", 5usize)?.max(1);
    let duration = env_num("DURATION", 5u64)?.max(1);
    let conns = env_num("CONNS", 32usize)?.max(2);
    let tries = env_num("TRIES", 15usize)?.max(1);

    // ---- 1. requests per second ----
    let n = Nginx::options().workers(1).start(RPS_CONF)?;
    let port = n.port();
    let half = conns / 2;
    common::wrk(port, "/hand", 1, half, duration, None)?; // warm-up
    common::wrk(port, "/combined", 1, half, duration, None)?;
    // Each round runs both wrk at the same time against the same nginx worker, so load from
    // anything else on the machine hits both alike; the per-round ratio is what matters.
    let (mut hand, mut comb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..=rounds {
        let h = std::thread::spawn(move || common::wrk(port, "/hand", 1, half, duration, None));
        let c = common::wrk(port, "/combined", 1, half, duration, None)?;
        let h = h.join().map_err(|_| "wrk thread panicked")??;
        let ratio = c.per_second / h.per_second;
        println!(
            "round {r}: hand {:.2} req/s, add_upstream {:.2} req/s, ratio {ratio:.3}",
            h.per_second, c.per_second
        );
        hand.push(h.per_second);
        comb.push(c.per_second);
        ratios.push(ratio);
    }
    n.stop()?;

    // ---- 2. nginx -t with 1,000 upstreams ----
    let dir = Scratch::new("run")?;
    std::fs::create_dir_all(dir.path().join("tmp")).map_err(|e| format!("mkdir: {e}"))?;
    let (tc, th) = (
        dir.path().join("t-combined.conf"),
        dir.path().join("t-hand.conf"),
    );
    for (path, combined) in [(&tc, true), (&th, false)] {
        std::fs::write(path, t_conf(&so, dir.path(), combined))
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    let (mut cpu_h, mut cpu_c) = (Vec::new(), Vec::new());
    for _ in 0..tries {
        cpu_h.push(nginx_t_cpu(dir.path(), &th)?);
        cpu_c.push(nginx_t_cpu(dir.path(), &tc)?);
    }
    let (tmh, tmc) = (median(&cpu_h), median(&cpu_c));

    println!();
    println!(
        "{:<46} {:>12} {:>12} {:>8}",
        "measure", "hand", "module", "ratio"
    );
    println!(
        "{:<46} {:>12.0} {:>12.0} {:>8.3}",
        "req/s through the upstream (median, wrk)",
        median(&hand),
        median(&comb),
        median(&ratios)
    );
    println!(
        "{:<46} {:>12.4} {:>12.4} {:>8}",
        format!("nginx -t CPU seconds, {N} upstreams (median)"),
        tmh,
        tmc,
        ratio3(tmc, tmh)
    );
    Ok(())
}

fn main() {
    common::main("bench", run);
}
