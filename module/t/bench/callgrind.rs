//! Instructions per request of the nginx worker under valgrind's callgrind for upstrand requests,
//! as ratios to a plain `proxy_pass` measured in the same run: a deterministic figure beside the
//! req/s of the `upstrand` bench, which a shared machine cannot resolve to a few percent.
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! module/t/bench/callgrind.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
//! # = COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench callgrind
//! ```
//! Needs valgrind (`callgrind_control`). Two nginx: the backends (`return` servers; master + 1
//! worker) run normally; the front nginx runs as one process (`master_process off`: the process is
//! the worker, so callgrind sees every instruction of the request path) under
//! `valgrind --tool=callgrind --instr-atstart=no`. After a warm-up with instrumentation off
//! (keep-alive connections to the backends are open, pools allocated), instrumentation is switched
//! on and for each endpoint: `callgrind_control -z` (zero), `REQUESTS` requests over one keep-alive
//! connection, every answer checked to be 200, `callgrind_control -d` (dump); the dump's `totals:`
//! (Ir) divided by `REQUESTS` is the instructions per request. Endpoints:
//! - `plain`      `proxy_pass http://ok;` (baseline)
//! - `var`        `set $u ok; proxy_pass http://$u;` (nginx's own cost of a variable proxy_pass)
//! - `first`      upstrand whose first upstream answers 200
//! - `hop`        one failover hop 503 -> 200 (target ratio < 2)
//! - `intercept`  both upstreams 503, then the `intercept_statuses` location
//! - `live`       proxy_pass to a live upstream (a `zone`, made live by the `upstreams_api`
//!   location): the balancer wrapper and the per-server statistics counters
//!
//! `BASE_SO=PATH` measures every endpoint again, in the same run, with a second module under a
//! second front nginx, and prints each endpoint's ratio SO / BASE_SO. `ROUNDS` (default 2) repeats
//! the endpoint cycle. `ANNOTATE=1` also prints `callgrind_annotate`'s top functions of the last
//! hop dump; `KEEP=FILE` copies that dump to FILE. Environment: `NGINX_BIN`, `REQUESTS` (default
//! 1000), `ROUNDS`, `ANNOTATE`, `KEEP`, `BASE_SO`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{env_num, env_str, median_u64, Res, Scratch};
use ngx_harness::{free_ports, KeepAlive, Nginx, Options, MODULE_ENV, PORTS};

const BACK: &str = "\
server { listen 127.0.0.1:{P1}; return 200 \"ok\\n\"; }
server { listen 127.0.0.1:{P2}; return 503 \"busy\\n\"; }
server { listen 127.0.0.1:{P3}; return 503 \"busy too\\n\"; }
";

const FRONT: &str = "\
upstream ok    { server 127.0.0.1:{P1}; keepalive 8; }
upstream busy  { server 127.0.0.1:{P2}; keepalive 8; }
upstream busy2 { server 127.0.0.1:{P3}; keepalive 8; }
upstream live  { zone live 64k; server 127.0.0.1:{P1}; keepalive 8; }
upstrand first     { upstream ok; upstream busy; order per_request; next_upstream_statuses 5xx; }
upstrand hop       { upstream busy; upstream ok; order per_request; next_upstream_statuses 5xx; }
upstrand intercept { upstream busy; upstream busy2; order per_request; next_upstream_statuses 5xx;
                     intercept_statuses 5xx /failover; }
server {
  listen 127.0.0.1:{P0};
  keepalive_requests 1000000;
  proxy_http_version 1.1; proxy_set_header Connection \"\";
  location /plain     { proxy_pass http://ok; }
  location /var       { set $u ok; proxy_pass http://$u; }
  location /first     { proxy_pass http://$upstrand_first; }
  location /hop       { proxy_pass http://$upstrand_hop; }
  location /intercept { proxy_pass http://$upstrand_intercept; }
  location /failover  { internal; return 200 \"failover\\n\"; }
  location /live      { proxy_pass http://live; }
  location /api/      { upstreams_api; }
}
";

/// The request headers curl sends (the bash bench used curl): the same request as before, so the
/// figures stay comparable with earlier runs.
const CLIENT_HEADERS: [(&str, &str); 2] = [("User-Agent", "curl/7.88.1"), ("Accept", "*/*")];

const ENDPOINTS: [&str; 6] = ["plain", "var", "first", "hop", "intercept", "live"];

struct Run {
    requests: u64,
    rounds: u64,
    ports: Vec<u16>,
    dir: Scratch,
    /// Ir per request by (tag, endpoint), one value per round.
    ir: BTreeMap<(String, String), Vec<u64>>,
}

/// `count` GETs of `/endpoint` on one keep-alive connection; fails unless every answer is 200.
fn requests(port: u16, endpoint: &str, count: u64) -> Res<()> {
    let mut conn = KeepAlive::open(port)?;
    let host = format!("127.0.0.1:{port}");
    let headers = [
        ("Host", host.as_str()),
        CLIENT_HEADERS[0],
        CLIENT_HEADERS[1],
    ];
    let mut other: BTreeMap<u16, u64> = BTreeMap::new();
    for i in 1..=count {
        let r = conn.get_with(&format!("/{endpoint}?i={i}"), &headers)?;
        if r.status != 200 {
            *other.entry(r.status).or_default() += 1;
        }
    }
    if !other.is_empty() {
        return Err(format!("/{endpoint} answered other than 200: {other:?} of {count}").into());
    }
    Ok(())
}

/// `callgrind_control ARGS PID`.
fn control(pid: u32, args: &[&str]) -> Res<()> {
    let st = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("run callgrind_control: {e}"))?;
    if !st.success() {
        return Err(format!("callgrind_control {args:?} {pid}: {st}").into());
    }
    Ok(())
}

/// The `totals:` (or `summary:`) Ir of a dump, waiting up to 10 s for callgrind to write it.
fn totals(file: &Path) -> Res<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let found = text.lines().find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        });
        if let Some(t) = found {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(format!("no totals in dump {}", file.display()).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Run {
    /// Starts a front nginx with module `so` under callgrind, runs the rounds, fills `ir[tag:*]`.
    fn measure(&mut self, so: &Path, tag: &str) -> Res<()> {
        // The harness loads the module named by this variable; the front of BASE_SO loads another.
        std::env::set_var(MODULE_ENV, so);
        let out = self.dir.path().join(tag);
        let out_arg = format!("--callgrind-out-file={}", out.display());
        let front = Options::new()
            .single_process() // the process is the worker: callgrind sees the whole request path
            .ports(&self.ports)
            .wrapper(&[
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                &out_arg,
            ])
            .timeouts(Duration::from_secs(120), Duration::from_secs(60))
            .start(FRONT)?;
        let pid = front.pid().ok_or("front nginx not running")?;
        let port = front.port();
        for e in ENDPOINTS {
            requests(port, e, 20)?; // warm-up, uninstrumented
        }
        control(pid, &["-i", "on"])?;
        for e in ENDPOINTS {
            requests(port, e, 5)?; // warm-up of the instrumented code paths
        }
        let mut dump = 0;
        for r in 1..=self.rounds {
            let mut line = format!("{tag} round {r}:");
            for e in ENDPOINTS {
                control(pid, &["-z"])?;
                requests(port, e, self.requests)?;
                control(pid, &["-d", e])?;
                dump += 1;
                let file = PathBuf::from(format!("{}.{dump}", out.display()));
                let per = totals(&file)? / self.requests;
                self.ir
                    .entry((tag.to_string(), e.to_string()))
                    .or_default()
                    .push(per);
                line.push_str(&format!(" {e} {per}"));
                if e == "hop" && tag == "so" {
                    std::fs::copy(&file, self.dir.path().join("hop.out"))
                        .map_err(|err| format!("copy {}: {err}", file.display()))?;
                }
            }
            println!("{line} Ir/request");
        }
        front.stop()
    }

    fn median(&self, tag: &str, endpoint: &str) -> u64 {
        self.ir
            .get(&(tag.to_string(), endpoint.to_string()))
            .map_or(0, |v| median_u64(v))
    }
}

fn run() -> Res<()> {
    let so = common::module_so()?;
    let base_so = match std::env::var("BASE_SO") {
        Ok(b) if !b.is_empty() => Some(
            Path::new(&b)
                .canonicalize()
                .map_err(|_| format!("BASE_SO not found: {b}"))?,
        ),
        _ => None,
    };
    common::require(
        "callgrind",
        &["valgrind", "callgrind_control"],
        "apt-get install valgrind",
    )?;
    let mut run = Run {
        requests: env_num("REQUESTS", 1000u64)?.max(1),
        rounds: env_num("ROUNDS", 2u64)?.max(1),
        ports: free_ports(PORTS),
        dir: Scratch::new("callgrind")?,
        ir: BTreeMap::new(),
    };
    // The backends: an ordinary nginx (master + 1 worker) on P1..P3, sharing the port table.
    let back = Nginx::options().workers(1).ports(&run.ports).start(BACK)?;
    run.measure(&so, "so")?;
    if let Some(b) = &base_so {
        run.measure(b, "base")?;
    }
    back.stop()?;

    println!();
    println!("module: {}", so.display());
    println!(
        "instructions (Ir) per request of the nginx worker, {} requests per endpoint, median of {} rounds",
        run.requests, run.rounds
    );
    let base = run.median("so", "plain") as f64;
    println!(
        "{:<40} {:>12} {:>7} {:>7}",
        "endpoint", "Ir/request", "ratio", "target"
    );
    for (label, key, target) in [
        ("plain proxy_pass (baseline)", "plain", "-"),
        ("proxy_pass http://$u (set $u ok)", "var", "report"),
        ("upstrand, first upstream answers 200", "first", "report"),
        ("upstrand, one failover hop 503 -> 200", "hop", "< 2"),
        (
            "upstrand, 503, 503, intercept location",
            "intercept",
            "report",
        ),
        ("live upstream (zone, upstreams_api)", "live", "report"),
    ] {
        let v = run.median("so", key);
        println!(
            "{label:<40} {v:>12} {:>7} {target:>7}",
            common::ratio3(v as f64, base)
        );
    }
    if let Some(b) = &base_so {
        println!();
        println!(
            "the same endpoints with BASE_SO={} (same run): Ir/request, and SO / BASE_SO",
            b.display()
        );
        println!(
            "{:<12} {:>12} {:>12} {:>9}",
            "endpoint", "SO", "BASE_SO", "ratio"
        );
        for e in ENDPOINTS {
            let (a, b) = (run.median("so", e), run.median("base", e));
            println!("{e:<12} {a:>12} {b:>12} {:>9.4}", a as f64 / b as f64);
        }
    }
    let hop = run.dir.path().join("hop.out");
    let keep = env_str("KEEP", "");
    if !keep.is_empty() {
        std::fs::copy(&hop, &keep).map_err(|e| format!("copy the hop dump to {keep}: {e}"))?;
        println!("hop dump kept in {keep}");
    }
    if env_str("ANNOTATE", "0") == "1" {
        println!();
        println!("top functions of the hop endpoint (callgrind_annotate, self cost):");
        let out = Command::new("callgrind_annotate")
            .arg(&hop)
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("run callgrind_annotate: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        for l in text.lines().skip_while(|l| !l.contains("Ir")).take(40) {
            println!("{l}");
        }
    }
    Ok(())
}

fn main() {
    common::main("callgrind", run);
}
