//! "end to end: rolling replacement": registry → daemon → zone → probes. A real daemon
//! in live mode with the real `file` plugin (the test rewrites its registry file), real nginx
//! (`master_process on`, 2 workers, the combined-upstreams module) and 20 backends in the test,
//! replaced one by one by 20 new ones under a steady keep-alive client load. Each new backend
//! answers 503 while it warms up, and one old backend silently stops answering (accepts, never
//! answers) during the roll. With the binding's `probe … mandatory` and `drain_secs`: no reload,
//! no warming 503 reaches a client, non-2xx ≤ 0.01 % of requests. The same roll without them lets
//! the warming 503s through (the second test shows and counts them).
//!
//! Time is scaled down so the test takes seconds: a new backend warms for [`WARM`] (the issue's
//! 5 s), one replacement every [`STEP`]; the probe runs every 200 ms. The ratio of warming time to
//! probe interval is what matters, and it is larger here than with 5 s and a 1 s interval.

use crate::common;
mod load;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::Daemon;
use load::{Backend, Load, Tally, CLIENTS};
use serde_json::{json, Value};
use tributary_fakes::daemon::{plugin_folder, sibling_bin, FAST};
use tributary_testkit::Nginx;

/// How long a new backend answers 503 after it starts.
const WARM: Duration = Duration::from_millis(1500);
/// One replacement (a new backend registered, an old one deregistered) per step.
const STEP: Duration = Duration::from_millis(400);
/// Backends before and after the roll.
const N: usize = 20;
/// The old backend that stops answering, and the step at which it does.
const HUNG: usize = 12;
const HUNG_AT: usize = 3;

fn services(path: &Path, backends: &[&Backend]) {
    let servers: Vec<Value> = backends
        .iter()
        .map(|b| json!({"address": "127.0.0.1", "port": b.port}))
        .collect();
    std::fs::write(path, json!({ "web": servers }).to_string()).unwrap();
}

/// The live API's servers of `web`.
fn live_servers(nginx: &Nginx) -> Vec<Value> {
    let v = common::live::module(nginx, "GET", "web", None);
    v["servers"].as_array().unwrap().clone()
}

/// What one roll saw.
struct Roll {
    tally: Tally,
    took: Duration,
    reloads: usize,
    /// Proxied requests that reached a new backend while it was warming (each answered 503).
    warming_proxied: usize,
    /// Whether the live API showed the silent backend `unhealthy` before its replacement step.
    silent_seen_unhealthy: Option<Duration>,
    /// The live set at the end: address → health.
    final_set: BTreeMap<String, String>,
    new_addrs: Vec<String>,
}

/// The whole scenario with the binding's `probe` and `drain_secs` set as given (`None`: unset).
fn roll(probe: Option<&str>, drain_secs: u64) -> Roll {
    let root = tempfile::tempdir().unwrap();
    // An answer that never comes is given up after 1 s and the request goes to the next server
    // (nginx's default `proxy_next_upstream error timeout`); the default 60 s would only make
    // the test longer, not different.
    let nginx = Nginx::builder()
        .workers(2)
        .live_api("")
        .http_snippet("proxy_read_timeout 1s;")
        // The hung old backend on purpose: each request it takes times out (then goes on).
        .expect_log("upstream timed out (110: Connection timed out) while reading response header")
        .start();
    let plugins = root.path().join("plugins");
    plugin_folder(
        &plugins,
        &common::workspace_root().join("plugins/file"),
        &sibling_bin(&common::tributary_bin(), "tributary-plugin-file"),
        None,
    );
    let api = nginx.live_api_address();
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend(["--apply", "live", "--live-api", &api]);
    let d = Daemon::start_with(root.path(), &nginx, &args);
    let file = root.path().join("services.json");
    let old: Vec<Backend> = (0..N).map(|_| Backend::start(Duration::ZERO)).collect();
    services(&file, &old.iter().collect::<Vec<_>>());
    let mut body = json!({"plugin": "file", "provider": "file", "service": "web",
                          "config": {"path": file.display().to_string()},
                          "drain_secs": drain_secs});
    if let Some(p) = probe {
        body["probe"] = json!(p);
    }
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/web?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    nginx.wait_settled(Duration::from_secs(10)).unwrap();
    // Every old server live and (with the probe) healthy before the load starts.
    let t = Instant::now();
    loop {
        let set = live_servers(&nginx);
        if set.len() == N
            && set
                .iter()
                .all(|s| s["health"].as_str().unwrap_or("healthy") == "healthy")
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{set:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let reloads = nginx.reloads_seen();

    let load = Load::start(nginx.port());
    std::thread::sleep(Duration::from_millis(500));
    let mut new: Vec<Backend> = Vec::new();
    let mut silent_seen_unhealthy = None;
    let silent_addr = old[HUNG].addr();
    let mut silent_since = None;
    let mut proxied_before_silence = 0;
    for i in 0..N {
        if i == HUNG_AT {
            old[HUNG].go_silent();
            silent_since = Some(Instant::now());
            proxied_before_silence = old[HUNG].proxied.load(Ordering::SeqCst);
        }
        new.push(Backend::start(WARM));
        let listed: Vec<&Backend> = old[i + 1..].iter().chain(new.iter()).collect();
        services(&file, &listed);
        let (status, o) = d.api("POST", "/api/v1/bindings/web/refresh", None);
        assert_eq!(status, 200, "{o}");
        assert_eq!(
            (&o["status"], &o["applied"]),
            (&json!("ok"), &json!("live")),
            "step {i}: {o}"
        );
        let step_end = Instant::now() + STEP;
        while Instant::now() < step_end {
            if let (Some(since), None, true) = (silent_since, silent_seen_unhealthy, i <= HUNG) {
                let unhealthy = live_servers(&nginx)
                    .iter()
                    .any(|s| s["address"] == silent_addr && s["health"] == "unhealthy");
                if unhealthy {
                    silent_seen_unhealthy = Some(since.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // An old backend goes away for good a while after it left discovery (its drain is over).
        if i >= 3 {
            old[i - 3].close();
        }
    }
    // The last new backends finish warming and take traffic.
    std::thread::sleep(WARM + Duration::from_millis(700));
    let (tally, took) = load.finish();
    // The end state, once it has settled (at most 5 s on a loaded machine).
    let t = Instant::now();
    let final_set: BTreeMap<String, String> = loop {
        let set: BTreeMap<String, String> = live_servers(&nginx)
            .iter()
            .map(|s| {
                let a = s["address"].as_str().unwrap().to_string();
                (a, s["health"].as_str().unwrap_or("-").to_string())
            })
            .collect();
        let settled = set.len() == N && set.values().all(|h| h == "healthy" || h == "-");
        if settled || t.elapsed() > Duration::from_secs(5) {
            break set;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let warming_proxied = new
        .iter()
        .map(|b| b.proxied_503.load(Ordering::SeqCst))
        .sum();
    let per_new: Vec<usize> = new
        .iter()
        .map(|b| b.proxied.load(Ordering::SeqCst))
        .collect();
    let probes: Vec<usize> = new
        .iter()
        .map(|b| b.probes.load(Ordering::SeqCst))
        .collect();
    eprintln!("proxied per new backend: {per_new:?}; probes per new backend: {probes:?}");
    eprintln!(
        "silent backend: {} proxied requests held unanswered (each retried by nginx on the next \
         server after proxy_read_timeout)",
        old[HUNG].proxied.load(Ordering::SeqCst) - proxied_before_silence
    );
    Roll {
        tally,
        took,
        reloads: nginx.reloads_seen() - reloads,
        warming_proxied,
        silent_seen_unhealthy,
        final_set,
        new_addrs: new.iter().map(Backend::addr).collect(),
    }
}

fn report(name: &str, r: &Roll) {
    let total = r.tally.total();
    eprintln!(
        "{name}: {total} requests in {:.1} s ({:.0} req/s, {CLIENTS} keep-alive clients), \
         non-2xx or unanswered {} ({:.4} %): {:?}, unanswered {}; warming 503s proxied {}; \
         reloads {}; silent backend unhealthy after {:?}",
        r.took.as_secs_f64(),
        total as f64 / r.took.as_secs_f64(),
        r.tally.failed(),
        100.0 * r.tally.failed() as f64 / total as f64,
        r.tally.bad,
        r.tally.errors,
        r.warming_proxied,
        r.reloads,
        r.silent_seen_unhealthy,
    );
}

#[test]
fn a_rolling_replacement_of_20_backends_under_load_fails_no_request_and_reloads_nothing() {
    let r = roll(
        Some("uri=/healthz interval=200ms timeout=200ms fails=2 passes=1 mandatory"),
        1,
    );
    report("probe mandatory + drain_secs 1", &r);
    let total = r.tally.total();
    assert!(total > 2_000, "too little load to judge: {total}");
    assert_eq!(r.reloads, 0, "reloads during the roll");
    assert_eq!(r.warming_proxied, 0, "requests sent to warming backends");
    assert!(
        r.tally.failed() * 10_000 <= total,
        "non-2xx over 0.01 %: {:?} of {total}",
        r.tally
    );
    assert!(
        r.silent_seen_unhealthy.is_some(),
        "the silent backend was never shown unhealthy"
    );
    // The end state: exactly the new backends, all healthy (every old one drained and removed).
    let want: BTreeMap<String, String> = r
        .new_addrs
        .iter()
        .map(|a| (a.clone(), "healthy".to_string()))
        .collect();
    assert_eq!(r.final_set, want);
}

/// The control: the same roll without `probe`/`drain_secs`. New backends take traffic as soon as
/// they are registered, so their warming 503s reach the clients — what the first test rules out.
#[test]
fn without_a_probe_the_same_roll_lets_warming_503s_reach_clients() {
    let r = roll(None, 0);
    report("no probe, drain_secs 0", &r);
    let total = r.tally.total();
    assert_eq!(r.reloads, 0, "reloads during the roll");
    assert!(r.warming_proxied > 0);
    assert!(
        r.tally.bad.get(&503).copied().unwrap_or(0) * 10_000 > total,
        "warming 503s under 0.01 % without a probe: {:?} of {total}",
        r.tally
    );
}
