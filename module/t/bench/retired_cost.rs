//! What a busy retired server costs the other requests of its upstream. A request holds a
//! server that a `PUT` then removes (it is retired while busy and stays so for the whole run);
//! the requests of that upstream (`app`) find a retired peer in every `free`, which sweeps the
//! retired chain at most once per 100 ms. The baseline is `app2`: the same servers in the same
//! nginx, nothing retired. Rounds alternate the two (`wrk -t1`, one after the other, the order
//! flipped each round); the medians of the per-round ratios app/app2 are reported for
//! requests/s, p99 latency and requests per worker CPU-second (the measure to read on a shared
//! machine). The correctness side (the held request is answered, no other request fails, `GET`
//! shows the retired server with its age) is the live API test
//! `a_long_request_on_a_removed_server_costs_other_requests_nothing`.
//!
//! ```sh
//! cargo build --release -p ngx-combined-upstreams
//! COMBINED_UPSTREAMS_MODULE=SO cargo bench -p combined-upstreams-tests --bench retired_cost
//! ```
//! Environment: `NGINX_BIN`, `ROUNDS` (default 5), `DURATION` (wrk seconds, default 3), `CONNS`
//! (default 8). Non-2xx answers or socket errors fail the run (exit 1).

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::{env_num, median, Res};
use ngx_harness::{http_request, Nginx};

/// Two upstreams over the same two backends, the live API, and the front.
const CONF: &str = "upstream app { zone app 1m; server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; }\n\
    upstream app2 { zone app2 1m; server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; }\n\
    server { listen 127.0.0.1:{P1}; location / { return 200 \"b1\\n\"; } }\n\
    server { listen 127.0.0.1:{P2}; location / { return 200 \"b2\\n\"; } }\n\
    server { listen 127.0.0.1:{P0} reuseport;\n\
      location / { proxy_pass http://app; proxy_next_upstream_tries 0; }\n\
      location /two/ { proxy_pass http://app2/; }\n\
      location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }\n}\n";

/// A server that accepts, reads the request and answers only once released.
struct Held {
    port: u16,
    release: Arc<AtomicBool>,
    accepted: mpsc::Receiver<()>,
}

fn held_server() -> Res<Held> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    let release = Arc::new(AtomicBool::new(false));
    let (tx, accepted) = mpsc::channel();
    let rel = release.clone();
    std::thread::spawn(move || {
        let Some(Ok(mut s)) = l.incoming().next() else {
            return;
        };
        let _ = tx.send(());
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = s.read(&mut [0u8; 4096]);
        while !rel.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ =
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nheld\n");
    });
    Ok(Held {
        port,
        release,
        accepted,
    })
}

/// One side's figures in one round.
#[derive(Clone, Copy)]
struct Sample {
    rps: f64,
    p99_ms: f64,
    per_cpu_s: f64,
    bad: u64,
}

fn measure(n: &Nginx, path: &str, duration: u64, conns: usize) -> Res<Sample> {
    let workers = n.workers();
    let t0 = common::ticks(&workers);
    let r = common::wrk(n.port(), path, 1, conns, duration, None)?;
    let t = common::ticks(&workers) - t0;
    Ok(Sample {
        rps: r.per_second,
        p99_ms: r.p99_ms.unwrap_or(0.0),
        per_cpu_s: r.requests as f64 / common::ticks_secs(t).max(1e-9),
        bad: r.non_2xx_3xx + r.socket_errors(),
    })
}

fn put(n: &Nginx, body: &str) -> Res<serde_json::Value> {
    let r = http_request(n.port(), "PUT", "/api/app", &[], body.as_bytes())?;
    if r.status != 200 {
        return Err(format!("PUT /api/app answered {}: {}", r.status, r.text()).into());
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("PUT answer: {e}").into())
}

fn run() -> Res<()> {
    common::module_so()?;
    common::require("retired-cost", &["wrk"], "apt-get install wrk")?;
    let rounds = env_num("ROUNDS", 5usize)?.max(1);
    let duration = env_num("DURATION", 3u64)?.max(1);
    let conns = env_num("CONNS", 8usize)?.max(1);
    let n = Nginx::options().start(CONF)?;
    let held = held_server()?;
    put(
        &n,
        &format!(r#"{{"servers":[{{"address":"127.0.0.1:{}"}}]}}"#, held.port),
    )?;
    let port = n.port();
    let request =
        std::thread::spawn(move || http_request(port, "GET", "/", &[], b"").map(|r| r.status));
    held.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the held server got no connection")?;
    let set = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}"}}]}}"#,
        n.ports()[1],
        n.ports()[2]
    );
    let v = put(&n, &set)?;
    if v["retiring"].as_u64() != Some(1) {
        return Err(format!("the held server was not retired while busy: {v}").into());
    }
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            with.push(measure(&n, "/", duration, conns)?);
            without.push(measure(&n, "/two/", duration, conns)?);
        } else {
            without.push(measure(&n, "/two/", duration, conns)?);
            with.push(measure(&n, "/", duration, conns)?);
        }
    }
    let view = http_request(n.port(), "GET", "/api/app", &[], b"")?;
    let view: serde_json::Value = serde_json::from_slice(&view.body).unwrap_or_default();
    held.release.store(true, Ordering::SeqCst);
    let status = request
        .join()
        .map_err(|_| "the held request's thread panicked")??;
    let ratio = |f: fn(&Sample) -> f64| {
        median(
            &with
                .iter()
                .zip(&without)
                .map(|(a, b)| f(a) / f(b))
                .collect::<Vec<_>>(),
        )
    };
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    println!(
        "retired-cost: {rounds} rounds x 2 x {duration} s, wrk -t1 -c{conns}, 2 workers; retired \
         in GET: {}",
        view["retired"]
    );
    for (name, v) in [
        ("with a busy retired server", &with),
        ("nothing retired", &without),
    ] {
        println!(
            "  {name:<27} req/s {:>9.0}  p99 {:>7.2} ms  req per worker CPU-s {:>8.0}",
            med(v, |s| s.rps),
            med(v, |s| s.p99_ms),
            med(v, |s| s.per_cpu_s),
        );
    }
    println!(
        "  ratio with/without: req/s {:.3}, p99 {:.3}, requests per worker CPU-second {:.3} \
         (medians of per-round ratios; on a shared machine read the CPU ratio)",
        ratio(|s| s.rps),
        ratio(|s| s.p99_ms),
        ratio(|s| s.per_cpu_s),
    );
    let bad: u64 = with.iter().chain(&without).map(|s| s.bad).sum();
    if bad > 0 {
        return Err(format!("{bad} non-2xx answers or socket errors").into());
    }
    if status != 200 {
        return Err(format!("the held request was answered {status}").into());
    }
    n.stop()
}

fn main() {
    common::main("retired-cost", run);
}
