//! Configurations, request bodies and checks shared by the live API cases.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ngx_harness::{check, Failed, Response};

use super::master::Master;

pub fn json(r: &Response) -> Result<serde_json::Value, Failed> {
    Ok(serde_json::from_slice(&r.body).map_err(|e| format!("bad JSON {:?}: {e}", r.text()))?)
}

/// A backend `server {}` on `{Pi}` answering its name.
pub fn backend(i: usize) -> String {
    format!("server {{ listen 127.0.0.1:{{P{i}}}; location / {{ return 200 \"b{i}\\n\"; }} }}\n")
}

/// The front server on `{P0}`: `/` proxies to `upstream`, `/api/` is the API (loopback only).
pub fn front(upstream: &str, extra: &str) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://{upstream}; proxy_next_upstream_tries 0; {extra} }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; client_max_body_size 8m; upstreams_api write=on; }}\n\
         }}\n{}",
        (1..=5).map(backend).collect::<String>()
    )
}

/// The standard configuration: `app` (round robin, zone) with b1; other upstreams to name.
pub fn standard() -> String {
    standard_for("app")
}

/// [`standard`] with the front server proxying to `upstream`, logging `$upstream_addr` to
/// `logs/up.log`.
pub fn standard_for(upstream: &str) -> String {
    format!(
        "log_format up '$upstream_addr';\n\
         upstream app {{ zone app 1m; server 127.0.0.1:{{P1}}; }}\n\
         upstream lc {{ zone app; least_conn; server 127.0.0.1:{{P1}}; }}\n\
         upstream rk {{ zone rk 1m; server 127.0.0.1:{{P1}}; keepalive 4; }}\n\
         upstream lck {{ zone rk; least_conn; server 127.0.0.1:{{P1}}; keepalive 4; }}\n\
         upstream ih {{ zone other 64k; ip_hash; server 127.0.0.1:{{P1}}; }}\n\
         upstream hs {{ zone other; hash $uri consistent; server 127.0.0.1:{{P1}}; }}\n\
         upstream rnd {{ zone other; random; server 127.0.0.1:{{P1}}; }}\n\
         upstream nozone {{ server 127.0.0.1:{{P1}}; }}\n\
         upstream tiny {{ zone tiny 32k; server 127.0.0.1:{{P1}}; }}\n{}",
        front(upstream, "access_log {PREFIX}/logs/up.log up;")
    )
}

/// A `PUT` body for these backends (`{Pi}` ports) and backups.
pub fn set_body(m: &Master, primary: &[usize], backup: &[usize]) -> String {
    let mut s: Vec<String> = primary
        .iter()
        .map(|i| format!(r#"{{"address":"127.0.0.1:{}"}}"#, m.port(*i)))
        .collect();
    s.extend(
        backup
            .iter()
            .map(|i| format!(r#"{{"address":"127.0.0.1:{}","backup":true}}"#, m.port(*i))),
    );
    format!(r#"{{"servers":[{}]}}"#, s.join(","))
}

/// The addresses of `GET /api/NAME`, with `(b)` for backups.
pub fn addresses(v: &serde_json::Value) -> Vec<String> {
    v["servers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let addr = s["address"].as_str().unwrap_or("?").to_string();
                    if s["backup"].as_bool() == Some(true) {
                        format!("{addr}(b)")
                    } else {
                        addr
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn addr(m: &Master, i: usize) -> String {
    format!("127.0.0.1:{}", m.port(i))
}

/// Sends front requests until both workers answered at least `per_worker` times; every answer
/// must be in `allowed`. Returns the answers counted per worker.
pub fn both_workers_answer(
    m: &Master,
    allowed: &[&str],
    per_worker: usize,
) -> Result<BTreeMap<u32, usize>, Failed> {
    let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
    for n in 0..5000 {
        let (w, body) = m.front()?;
        check(allowed.contains(&body.as_str()), || {
            format!("request {n}: answer {body:?} from worker {w}, allowed {allowed:?}")
        })?;
        *seen.entry(w).or_default() += 1;
        if seen.len() == 2 && seen.values().all(|c| *c >= per_worker) {
            return Ok(seen);
        }
    }
    Err(
        format!("both workers did not answer {per_worker} times each in 5000 requests: {seen:?}")
            .into(),
    )
}

/// Front requests (new connections) until both workers answered once; every answer must be in
/// `allowed`. Returns the time that took.
pub fn until_both_answer(m: &Master, allowed: &[&str]) -> Result<Duration, Failed> {
    let t = Instant::now();
    let mut seen = BTreeSet::new();
    while seen.len() < 2 {
        let (w, body) = m.front()?;
        check(allowed.contains(&body.as_str()), || {
            format!(
                "worker {w} answered {body:?} ({:?} after the PUT answer), allowed {allowed:?}",
                t.elapsed()
            )
        })?;
        seen.insert(w);
        check(t.elapsed() < Duration::from_secs(10), || {
            format!("only workers {seen:?} answered in 10 s")
        })?;
    }
    Ok(t.elapsed())
}

pub fn slab(m: &Master, name: &str) -> Result<(u64, u64), Failed> {
    let s = m.get_json(&format!("/{name}?slab"))?;
    Ok((
        s["chunks_used"].as_u64().ok_or("no chunks_used")?,
        s["pages_free"].as_u64().ok_or("no pages_free")?,
    ))
}
