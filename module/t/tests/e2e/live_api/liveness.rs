//! Live API cases for liveness under churn and faults: a request's tries stay bounded while sets
//! keep changing, a `PUT` answers 503 (instead of spinning for ever) when a worker died holding
//! the gate's read side, and no request fails in the window between a request's balancer `init`
//! and its selection while sets change (nginx's own `resolve` has such a window).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ngx_harness::procfs::{self, Sig};
use ngx_harness::Wrk;
use ngx_harness::{check, check_eq, http_request, CaseResult, Failed};

use super::helpers::*;
use super::master::Master;

/// A backend that accepts every connection and never answers (keeps them open), counting them.
struct HungBackend {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HungBackend {
    fn start() -> Result<HungBackend, Failed> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        let (accepted, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (n, st) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !st.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, _)) => {
                        n.fetch_add(1, Ordering::SeqCst);
                        held.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(HungBackend {
            port,
            accepted,
            stop,
            thread: Some(thread),
        })
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for HungBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn case_retries_stay_bounded_while_sets_keep_changing() -> CaseResult {
    // Two backends that accept and never answer, proxy_read_timeout 300ms, max_fails 0,
    // proxy_next_upstream_tries 0 (no cap): stock nginx tries each once (≈ 600 ms, 2
    // connections) and answers 504. A PUT flipping a weight every 100 ms for 5 s must not
    // give the request new tries for servers it already tried.
    let conf = format!(
        "upstream app {{ zone app 1m; server 127.0.0.1:{{P1}}; }}\n{}",
        front("app", "proxy_read_timeout 300ms; proxy_connect_timeout 1s;")
    );
    let m = Master::start(&conf)?;
    m.expect_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
    let (a, b) = (HungBackend::start()?, HungBackend::start()?);
    let body = |w: u32| {
        format!(
            r#"{{"servers":[{{"address":"127.0.0.1:{}","weight":{w},"max_fails":0}},{{"address":"127.0.0.1:{}","max_fails":0}}]}}"#,
            a.port, b.port
        )
    };
    check_eq(m.put("app", &body(1))?.status, 200, "PUT the hung pair")?;
    let port = m.port(0);
    let bodies = [body(2), body(1)];
    let churn = std::thread::spawn(move || {
        let (mut ok, mut other) = (0, Vec::new());
        let t = Instant::now();
        let mut i = 0;
        while t.elapsed() < Duration::from_secs(5) {
            match http_request(port, "PUT", "/api/app", &[], bodies[i % 2].as_bytes()) {
                Ok(r) if r.status == 200 => ok += 1,
                Ok(r) => other.push(r.status),
                Err(_) => other.push(0),
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        (ok, other)
    });
    std::thread::sleep(Duration::from_millis(150));
    let t = Instant::now();
    let r = http_request(port, "GET", "/", &[], b"")?;
    let took = t.elapsed();
    let conns = a.accepted() + b.accepted();
    let (ok, other) = churn.join().map_err(|_| "PUT thread panicked")?;
    eprintln!(
        "request ended {} after {} ms, {conns} upstream connections; {ok} PUTs answered 200 meanwhile",
        r.status,
        took.as_millis()
    );
    check(other.is_empty() && ok >= 20, || {
        format!("the PUTs every 100 ms: {ok} answered 200, others {other:?}")
    })?;
    check_eq(
        r.status,
        504,
        "the request's status (both servers timed out)",
    )?;
    check(took < Duration::from_millis(1500), || {
        format!(
            "the request took {} ms (stock nginx: ≈ 600 ms; it went on while the PUTs did)",
            took.as_millis()
        )
    })?;
    check_eq(conns, 2, "upstream connections of the request")?;
    m.check_workers_unchanged()
}

/// `gdb` attached to a worker, stopped at a breakpoint once it is hit; killed on drop.
struct Gdb {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Gdb {
    /// Attaches to `pid` with a breakpoint on `function` and lets it run; returns once gdb has
    /// the breakpoint set.
    fn attach(pid: u32, function: &str) -> Result<Gdb, Failed> {
        let mut child = Command::new("gdb")
            .args(["-nx", "-batch", "-p", &pid.to_string()])
            .args(["-ex", "set pagination off"])
            .args(["-ex", &format!("break {function}")])
            .args(["-ex", "echo READY\\n"])
            .args(["-ex", "continue"])
            .args(["-ex", "echo HIT\\n"])
            .args(["-ex", "shell sleep 120"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start gdb (scripts/setup.sh test installs it): {e}"))?;
        let out = child.stdout.take().ok_or("no gdb stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let g = Gdb { child, lines };
        g.wait_for("READY", Duration::from_secs(30))?;
        Ok(g)
    }

    fn wait_for(&self, word: &str, within: Duration) -> CaseResult {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.trim() == word => return Ok(()),
                Ok(_) => {}
                Err(_) => return Err(format!("gdb did not say {word} within {within:?}").into()),
            }
        }
    }
}

impl Drop for Gdb {
    fn drop(&mut self) {
        procfs::signal(self.child.id(), Sig::Kill);
        let _ = self.child.wait();
    }
}

/// Sends a `PUT` from a thread; its answer (status, body, time) or an error after `within`.
fn put_within(m: &Master, body: &str, within: Duration) -> Result<(u16, String, Duration), Failed> {
    let (port, body) = (m.port(0), body.to_string());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = http_request(port, "PUT", "/api/app", &[], body.as_bytes());
        let _ = tx.send(r.map(|r| (r.status, r.text(), t.elapsed())));
    });
    rx.recv_timeout(within)
        .map_err(|_| format!("the PUT got no answer within {within:?} (a write lock spins)"))?
}

/// The CPU share (percent of one CPU) of each of `pids` over `window`.
fn cpu_shares(pids: &[u32], window: Duration) -> Vec<(u32, f64)> {
    let before: Vec<u64> = pids
        .iter()
        .map(|p| procfs::cpu_ticks(*p).unwrap_or(0))
        .collect();
    std::thread::sleep(window);
    let tck = procfs::clock_ticks_per_second().max(1) as f64;
    pids.iter()
        .zip(before)
        .map(|(p, b)| {
            let used = procfs::cpu_ticks(*p).unwrap_or(b).saturating_sub(b) as f64 / tck;
            (*p, used / window.as_secs_f64() * 100.0)
        })
        .collect()
}

pub fn case_worker_killed_holding_the_gate_leaves_puts_busy_not_stuck() -> CaseResult {
    // A worker stopped (gdb) inside the balancer's init, which runs with the gate read-held, is
    // SIGKILLed there: the gate keeps a reader for ever. Requests still work (readers never
    // wait for readers); a PUT must answer 503 within about a second, not spin; no worker may
    // spin; a reload (a new zone) must complete and make PUTs work again.
    let mut m = Master::start(&standard())?;
    // The case SIGKILLs workers: the master logs each as "exited on signal 9".
    m.expect_log("exited on signal 9");
    let w = *m.workers().iter().next().ok_or("no worker")?;
    let gdb = Gdb::attach(w, "ngx_http_upstream_init_round_robin_peer")?;
    // Requests on new connections until one lands on the stopped worker and hits the
    // breakpoint (the others are answered by the other worker).
    let port = m.port(0);
    let mut hit = false;
    for _ in 0..60 {
        std::thread::spawn(move || {
            let _ = http_request(port, "GET", "/", &[], b"");
        });
        if gdb.wait_for("HIT", Duration::from_millis(200)).is_ok() {
            hit = true;
            break;
        }
    }
    check(hit, || {
        "no request reached the breakpoint in the worker".into()
    })?;
    check(procfs::signal(w, Sig::Kill), || format!("SIGKILL {w}"))?;
    drop(gdb);
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.workers().contains(&w) || m.workers().len() != 2 {
        check(Instant::now() < deadline, || {
            format!("the master did not replace worker {w}: {:?}", m.workers())
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    both_workers_answer(&m, &["b1"], 3)?;
    let mut took = Vec::new();
    for n in 1..=2 {
        let (status, text, t) = put_within(&m, &set_body(&m, &[2], &[]), Duration::from_secs(5))?;
        check_eq(
            status,
            503,
            &format!("PUT {n} with a dead reader on the gate ({text})"),
        )?;
        check(text.contains("busy, retry"), || {
            format!("PUT {n} answer: {text}")
        })?;
        check(t < Duration::from_millis(1800), || {
            format!("PUT {n} answered after {} ms", t.as_millis())
        })?;
        took.push(t.as_millis());
    }
    both_workers_answer(&m, &["b1"], 3)?;
    let workers: Vec<u32> = m.workers().into_iter().collect();
    let shares = cpu_shares(&workers, Duration::from_secs(1));
    check(shares.iter().all(|(_, s)| *s < 5.0), || {
        format!("worker CPU over 1 s after the PUTs (percent): {shares:?}")
    })?;
    m.reload(&standard())?;
    check_eq(
        m.put("app", &set_body(&m, &[2], &[]))?.status,
        200,
        "PUT after the reload (a new zone)",
    )?;
    both_workers_answer(&m, &["b2"], 3)?;
    eprintln!("PUTs answered 503 after {took:?} ms; worker CPU {shares:?} %; the reload completed");
    Ok(())
}

pub fn case_no_request_fails_while_sets_change_every_10ms() -> CaseResult {
    // 4 workers under saturating keep-alive load (wrk), a PUT every 10 ms rotating over sets of
    // live servers: no request may get a 502 and nginx may never log "no live upstreams"
    // (nginx's own `resolve` gives one to a request whose init and selection straddle a
    // change). `LIVE_RACE_SECS` sets the duration (default 10).
    let secs: u64 = std::env::var("LIVE_RACE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let m = Master::start_workers(&standard(), 4)?;
    let sets = [
        set_body(&m, &[1], &[]),
        set_body(&m, &[2, 3], &[]),
        set_body(&m, &[1, 4, 5], &[]),
        set_body(&m, &[5], &[4]),
        set_body(&m, &[3, 2, 1], &[]),
    ];
    let wrk = Wrk::start(m.port(0), &["/"], 2, 32, Duration::from_secs(secs + 60))?;
    let port = m.port(0);
    let t = Instant::now();
    let (mut ok, mut other) = (0u64, Vec::new());
    let mut i = 0;
    while t.elapsed() < Duration::from_secs(secs) {
        match http_request(
            port,
            "PUT",
            "/api/app",
            &[],
            sets[i % sets.len()].as_bytes(),
        ) {
            Ok(r) if r.status == 200 => ok += 1,
            Ok(r) => other.push((r.status, r.text())),
            Err(e) => other.push((0, format!("{e:?}"))),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = wrk.stop()?;
    let log = m.error_log();
    let nolive = log.matches("no live upstreams").count();
    let rebalanced = m.get_json("/app")?["rebalanced"].as_u64().unwrap_or(0);
    eprintln!(
        "{secs} s, 4 workers: {} requests ({:.0}/s), {} non-2xx, {} socket errors; {ok} PUTs \
         answered 200, {} other; {nolive} \"no live upstreams\" lines; {rebalanced} requests \
         rebalanced",
        report.requests,
        report.requests as f64 / secs as f64,
        report.non_2xx_3xx,
        report.socket_errors(),
        other.len()
    );
    check(report.requests > 0, || {
        format!("wrk made no requests:\n{}", report.output)
    })?;
    check_eq(report.non_2xx_3xx, 0, "answers other than 2xx/3xx (502s)")?;
    check_eq(nolive, 0, "\"no live upstreams\" lines in the error log")?;
    check(other.is_empty(), || {
        format!("PUTs not answered 200: {:?}", &other[..other.len().min(5)])
    })?;
    m.check_workers_unchanged()
}

pub fn case_a_long_request_on_a_removed_server_costs_other_requests_nothing() -> CaseResult {
    // A request holds a server that is then removed (retired while busy, for the whole case).
    // Load through `app` (whose `free`s find a retired peer and sweep the chain at most once per
    // 100 ms) is served without an error, the held request is answered once released, and `GET`
    // shows the retired server with its age. What it costs the other requests, as ratios against
    // an upstream with nothing retired, is the bench `retired_cost` (module/t/bench).
    let secs: u64 = std::env::var("LIVE_RETIRED_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let conf = format!(
        "upstream app {{ zone app 1m; server 127.0.0.1:{{P1}}; server 127.0.0.1:{{P2}}; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream_tries 0; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n}}\n{}",
        (1..=2).map(backend).collect::<String>()
    );
    let m = Master::start(&conf)?;
    let slow = super::master::SlowBackend::start()?;
    let only_slow = format!(r#"{{"servers":[{{"address":"127.0.0.1:{}"}}]}}"#, slow.port);
    check_eq(m.put("app", &only_slow)?.status, 200, "PUT the slow server")?;
    let port = m.port(0);
    let held =
        std::thread::spawn(move || http_request(port, "GET", "/", &[], b"").map(|r| r.status));
    slow.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the slow server got no connection")?;
    let r = json(&m.put("app", &set_body(&m, &[1, 2], &[]))?)?;
    check_eq(
        r["retiring"].as_u64(),
        Some(1),
        "the slow server retired while busy",
    )?;
    let with = Wrk::start(port, &["/"], 1, 8, Duration::from_secs(secs + 60))?;
    std::thread::sleep(Duration::from_secs(secs));
    let with = with.stop()?;
    let v = m.get_json("/app")?;
    slow.release.store(true, Ordering::SeqCst);
    let held = held.join().map_err(|_| "request thread panicked")??;
    eprintln!(
        "{secs} s with a busy retired server: {:.0} req/s, p99 {:?} ms; GET: {}",
        with.per_second, with.p99_ms, v["retired"]
    );
    check_eq(held, 200, "the held request's answer once released")?;
    check(with.requests > 0, || "wrk sent no request".into())?;
    check_eq(with.non_2xx_3xx, 0, "answers other than 2xx")?;
    let retired = v["retired"]
        .as_array()
        .ok_or("GET shows no retired servers")?;
    check_eq(retired.len(), 1, "retired servers in GET")?;
    check_eq(
        retired[0]["address"].as_str(),
        Some(format!("127.0.0.1:{}", slow.port).as_str()),
        "the retired server's address",
    )?;
    check_eq(retired[0]["active"].as_u64(), Some(1), "its connections")?;
    let age = retired[0]["age_ms"].as_u64().unwrap_or(0);
    check(age >= secs * 1000 && age < (secs + 30) * 1000, || {
        format!("its age {age} ms (retired about {secs} s before)")
    })?;
    m.check_workers_unchanged()
}
