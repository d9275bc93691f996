//! One mode's stack (nginx with the module on `ngx_harness`, `tributary serve` with the static
//! plugin managing it) and one measured segment of it (wrk, the change driver, the probers, the RSS
//! sampler).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ngx_harness::{free_ports, http_get, http_request, nginx_bin, procfs, Nginx};
use rustix::process::{kill_process, Pid, Signal};

use crate::common::Res;

/// Wall-clock seconds since the epoch (the daemon logs its decisions in wall-clock time).
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `utime, stime, cutime, cstime` of `/proc/PID/stat` in seconds (zeros when the process is gone).
fn stat_cpu(pid: u32) -> [f64; 4] {
    let hz = procfs::clock_ticks_per_second() as f64;
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = text.rfind(')').map_or("", |i| &text[i + 1..]);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(0.0) / hz)
        .collect();
    if f.len() == 4 {
        [f[0], f[1], f[2], f[3]]
    } else {
        [0.0; 4]
    }
}

/// What the paths of the binaries are.
pub struct Bins {
    pub tributary: PathBuf,
    pub static_plugin: PathBuf,
    pub root: PathBuf,
}

/// nginx + tributary for one mode.
pub struct Stack {
    pub mode: String,
    pub nginx: Nginx,
    daemon: Option<Daemon>,
    pub dlog: PathBuf,
    pub api_port: u16,
    token: String,
    /// One backend per set, rotating: (address, the body its answers carry).
    pub sets: Vec<(String, String)>,
    pub i: u64,
    _dir: crate::common::Scratch,
}

const HTTP: &str = "\
default_type text/plain;
include {PREFIX}/conf/upstreams/*.conf;
server { listen unix:{PREFIX}/logs/api.sock; location /api/ { upstreams_api write=on; } }
server { listen 127.0.0.1:{P1}; location / { return 200 \"b1\"; } }
server { listen 127.0.0.1:{P2}; location / { return 200 \"b2\"; } }
server { listen 127.0.0.1:{P3}; location / { return 200 \"b3\"; } }
server { listen 127.0.0.1:{P4}; location / { return 200 \"b4\"; } }
server {
  listen 127.0.0.1:{P0};
  location / { set $up bench; proxy_pass http://$up; proxy_http_version 1.1;
               proxy_set_header Connection \"\"; }
}
";

impl Stack {
    pub fn start(mode: &str, bins: &Bins) -> Res<Stack> {
        let nginx = Nginx::options().start(HTTP)?;
        let prefix = nginx.prefix().to_path_buf();
        std::fs::create_dir_all(prefix.join("conf/upstreams"))
            .map_err(|e| format!("mkdir conf/upstreams: {e}"))?;
        let dir = crate::common::Scratch::new(&format!("bench-live-{mode}"))?;
        let plugins = dir.path().join("plugins/static");
        std::fs::create_dir_all(&plugins).map_err(|e| format!("mkdir plugins: {e}"))?;
        let manifest_path = bins.root.join("plugins/static/plugin.json");
        let mut manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&manifest_path)
                .map_err(|e| format!("read {}: {e}", manifest_path.display()))?,
        )
        .map_err(|e| format!("{}: {e}", manifest_path.display()))?;
        manifest["executable"] = bins.static_plugin.display().to_string().into();
        std::fs::write(plugins.join("plugin.json"), manifest.to_string())
            .map_err(|e| format!("write plugin.json: {e}"))?;
        let ngx = format!(
            "{} -p {p} -c {p}/conf/nginx.conf -e {p}/logs/error.log",
            nginx_bin().display(),
            p = prefix.display()
        );
        let api_port = free_ports(1)[0];
        let dlog = dir.path().join("daemon.log");
        let apply = if mode == "reload" { "reload" } else { "live" };
        let daemon = Command::new(&bins.tributary)
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{api_port}")])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--plugins-dir")
            .arg(dir.path().join("plugins"))
            .arg("--conf-dir")
            .arg(prefix.join("conf"))
            .args(["--test-cmd", &format!("{ngx} -t")])
            .args(["--reload-cmd", &format!("{ngx} -s reload")])
            .args(["--min-reload-gap-ms", "100", "--batch-quiet-ms", "5"])
            .args(["--batch-max-ms", "50", "--apply", apply])
            .args([
                "--live-api",
                &format!("unix:{}/logs/api.sock:/api/", prefix.display()),
            ])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&dlog).map_err(|e| format!("daemon.log: {e}"))?)
            .spawn()
            .map_err(|e| format!("start {}: {e}", bins.tributary.display()))?;
        let sets = (0..4)
            .map(|k| {
                (
                    format!("127.0.0.1:{}", nginx.ports()[k + 1]),
                    format!("b{}", k + 1),
                )
            })
            .collect();
        let mut s = Stack {
            mode: mode.to_string(),
            nginx,
            daemon: Some(Daemon(daemon)),
            dlog,
            api_port,
            token: String::new(),
            sets,
            i: 0,
            _dir: dir,
        };
        wait_for(Duration::from_secs(30), "daemon", || {
            http_get(api_port, "/api/v1/health", &[]).is_ok_and(|r| r.status == 200)
        })?;
        s.token = std::fs::read_to_string(s._dir.path().join("data/token"))
            .map_err(|e| format!("read the daemon's token: {e}"))?
            .trim()
            .to_string();
        let (st, v) = s.api("PUT", "/api/v1/bindings/bench?wait=true", &s.body(0))?;
        if !(st == 200 || st == 201) || v["binding"]["last_outcome"]["status"] != "ok" {
            return Err(format!("first save of mode {mode}: {st} {v}").into());
        }
        let (front, want) = (s.nginx.port(), s.sets[0].1.clone());
        wait_for(Duration::from_secs(10), "first set", || {
            http_get(front, "/", &[]).is_ok_and(|r| r.text() == want)
        })?;
        Ok(s)
    }

    /// The binding's body for change `i`. `weights`: the same server, its weight alternating
    /// 1/2: every step of a live change without moving any traffic.
    pub fn body(&self, i: u64) -> String {
        let targets = if self.mode == "weights" {
            format!("{}:{}", self.sets[0].0, 1 + i % 2)
        } else {
            self.sets[(i % 4) as usize].0.clone()
        };
        serde_json::json!({"plugin": "static", "provider": "static", "service": "bench",
            "config": {"targets": targets}, "directives": ["keepalive 16;"]})
        .to_string()
    }

    /// A request to the daemon's API with the bearer token: (status, JSON body or null).
    pub fn api(&self, method: &str, path: &str, body: &str) -> Res<(u16, serde_json::Value)> {
        api_call(self.api_port, &self.token, method, path, body)
    }

    /// ("start worker process", "(SIGHUP) received") lines in nginx's error log so far.
    fn log_counts(&self) -> (usize, usize) {
        let log = self.nginx.error_log();
        (
            log.matches("start worker process").count(),
            log.matches("(SIGHUP) received").count(),
        )
    }

    /// (nginx: master with reaped workers + live workers, the daemon itself, the daemon's reaped
    /// commands), in CPU seconds.
    fn cpu(&self) -> [f64; 3] {
        let m = self.nginx.pid().map_or([0.0; 4], stat_cpu);
        let kids: f64 = self
            .nginx
            .workers()
            .into_iter()
            .map(|w| {
                let c = stat_cpu(w);
                c[0] + c[1]
            })
            .sum();
        let d = self
            .daemon
            .as_ref()
            .map_or([0.0; 4], |d| stat_cpu(d.0.id()));
        [m.iter().sum::<f64>() + kids, d[0] + d[1], d[2] + d[3]]
    }

    fn rss(&self) -> u64 {
        self.nginx.pid().map_or(0, |m| {
            procfs::rss_kib(m).unwrap_or(0)
                + procfs::children(m)
                    .into_iter()
                    .filter_map(procfs::rss_kib)
                    .sum::<u64>()
        })
    }

    /// Stops the daemon (SIGTERM, 10 s, then SIGKILL when dropped) and nginx (the harness's stop: its error
    /// log is checked); the problems found, if any.
    pub fn stop(mut self) -> Option<String> {
        if let Some(mut d) = self.daemon.take() {
            if let Some(pid) = i32::try_from(d.0.id()).ok().and_then(Pid::from_raw) {
                let _ = kill_process(pid, Signal::TERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(d.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.nginx
            .stop()
            .err()
            .map(|e| format!("nginx of mode {}: {}", self.mode, e.message().unwrap_or("")))
    }
}

/// The daemon's process, killed when dropped (a stack that failed to start leaves nothing).
pub struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn api_call(
    port: u16,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Res<(u16, serde_json::Value)> {
    let auth = format!("Bearer {token}");
    let r = http_request(
        port,
        method,
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )?;
    let v = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
    Ok((r.status, v))
}

fn wait_for(timeout: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Res<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("timed out waiting for {what}").into())
}

/// One prober's record: change sent (wall clock), first answer from the new set seen, its address.
pub type Probe = (f64, Option<f64>, String);

/// One measured segment of one mode.
#[derive(Default)]
pub struct Segment {
    pub requests: u64,
    /// connect, read, write, status, timeout (wrk's `summary.errors`).
    pub errors: [u64; 5],
    /// µs → count.
    pub hist: BTreeMap<u64, u64>,
    pub seconds: f64,
    pub workers_started: usize,
    pub reloads: usize,
    pub rss_peak_kib: u64,
    pub changes_sent: u64,
    pub put_errors: u64,
    pub probes: Vec<Probe>,
    pub cpu: [f64; 3],
}

/// wrk's latency histogram (µs value, count per distinct value), written at the end of a run.
pub const WRK_LUA: &str = r#"
done = function(summary, latency, requests)
  local f = io.open(os.getenv("WRK_HIST"), "w")
  local e = summary.errors
  f:write(string.format("requests %d\nerrors %d %d %d %d %d\n", summary.requests,
          e.connect, e.read, e.write, e.status, e.timeout))
  for i = 1, #latency do
    local v, n = latency(i)
    f:write(string.format("%d %d\n", v, n))
  end
  f:close()
end
"#;

fn read_hist(path: &Path, seg: &mut Segment) -> Res<()> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    for line in text.lines() {
        let p: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<u64>().unwrap_or(0);
        match p.first() {
            Some(&"requests") => seg.requests = p.get(1).map_or(0, |v| num(v)),
            Some(&"errors") => {
                for (i, v) in p[1..].iter().take(5).enumerate() {
                    seg.errors[i] = num(v);
                }
            }
            Some(v) if p.len() == 2 => *seg.hist.entry(num(v)).or_default() += num(p[1]),
            _ => {}
        }
    }
    Ok(())
}

/// Runs one segment: wrk on the front server for `seconds`, with (when `change`) a save every
/// `interval_ms` and (when `probing`) a prober per save.
pub fn run_segment(
    stack: &mut Stack,
    seconds: u64,
    interval_ms: u64,
    connections: usize,
    lua: &Path,
    change: bool,
    probing: bool,
) -> Res<Segment> {
    let (started0, reloads0) = stack.log_counts();
    let cpu0 = stack.cpu();
    let stop = AtomicBool::new(false);
    let rss_peak = AtomicU64::new(0);
    let probes: Mutex<Vec<Arc<Mutex<Probe>>>> = Mutex::new(Vec::new());
    let (put_errors, sent) = (AtomicU64::new(0), AtomicU64::new(0));
    let hist_path = lua.with_file_name(format!("hist-{}.txt", stack.mode));
    let front = stack.nginx.port();
    let mut i = stack.i;
    let t_start = Instant::now();
    let stack_ref = &*stack;
    let wrk = std::thread::scope(|s| -> Res<std::process::Output> {
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                rss_peak.fetch_max(stack_ref.rss(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        if change {
            let i = &mut i;
            let (stop, probes, put_errors, sent) = (&stop, &probes, &put_errors, &sent);
            s.spawn(move || {
                let mut t_next = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    t_next += Duration::from_millis(interval_ms);
                    *i += 1;
                    let t0 = now();
                    let body = stack_ref.body(*i);
                    match stack_ref.api("PUT", "/api/v1/bindings/bench", &body) {
                        Ok((200, _)) => {}
                        _ => {
                            put_errors.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    sent.fetch_add(1, Ordering::SeqCst);
                    if stack_ref.mode != "weights" && probing {
                        let (addr, want) = stack_ref.sets[(*i % 4) as usize].clone();
                        let slot = Arc::new(Mutex::new((t0, None, addr)));
                        if let Ok(mut p) = probes.lock() {
                            p.push(slot.clone());
                        }
                        // New connections to the front server until an answer comes from the new set.
                        s.spawn(move || {
                            while now() < t0 + 2.0 {
                                if http_get(front, "/", &[]).is_ok_and(|r| r.text() == want) {
                                    if let Ok(mut sl) = slot.lock() {
                                        sl.1 = Some(now());
                                    }
                                    return;
                                }
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        });
                    }
                    if let Some(pause) = t_next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(pause);
                    }
                }
            });
        }
        let out = Command::new("wrk")
            .args([
                "-t2",
                &format!("-c{connections}"),
                &format!("-d{seconds}s"),
                "-s",
            ])
            .arg(lua)
            .arg(format!("http://127.0.0.1:{front}/"))
            .env("WRK_HIST", &hist_path)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run wrk: {e}"));
        stop.store(true, Ordering::SeqCst);
        Ok(out?)
    })?;
    stack.i = i;
    let secs = t_start.elapsed().as_secs_f64();
    if !wrk.status.success() {
        return Err(format!("wrk: {}", String::from_utf8_lossy(&wrk.stderr)).into());
    }
    std::thread::sleep(Duration::from_millis(300));
    let (started, reloads) = stack.log_counts();
    let cpu1 = stack.cpu();
    let mut seg = Segment {
        seconds: secs,
        workers_started: started - started0,
        reloads: reloads - reloads0,
        rss_peak_kib: rss_peak.load(Ordering::SeqCst),
        changes_sent: sent.load(Ordering::SeqCst),
        put_errors: put_errors.load(Ordering::SeqCst),
        probes: probes
            .into_inner()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| p.lock().ok().map(|p| p.clone()))
            .collect(),
        cpu: [cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2]],
        ..Segment::default()
    };
    read_hist(&hist_path, &mut seg)?;
    Ok(seg)
}
