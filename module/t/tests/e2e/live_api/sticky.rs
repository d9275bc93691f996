//! `peer.notify` and the live balancer. The wrapper forwards the balancer's `notify`
//! (`balancer.rs`, `notify_peer`), but no stock nginx module gives it one to forward: HTTP
//! upstreams call `peer.notify` only from nginx 1.29.6 (`NGX_HTTP_UPSTREAM_NOTIFY_HEADER`), and
//! there only the `sticky` module sets it (and `keepalive` passes on one set below it). `sticky`
//! wraps the balancer's `peer.init` itself, so the API refuses its upstreams and never stands
//! between it and nginx. This case shows both: a `sticky` upstream is refused, and a `sticky
//! learn ... header` upstream (learning through `notify`) keeps learning with the API in the
//! same configuration.

use ngx_harness::{check, check_eq, http_request, CaseResult, Completion, Failed};

use super::helpers::json;
use super::master::Master;

const CONF: &str = "upstream stl { zone stl 64k; server 127.0.0.1:{P1}; server 127.0.0.1:{P2};\n\
     sticky learn create=$upstream_cookie_sid lookup=$cookie_sid zone=sess:1m header; }\n\
     upstream stc { zone stc 64k; server 127.0.0.1:{P1}; sticky cookie srv; }\n\
     upstream plain { zone plain 64k; server 127.0.0.1:{P1}; }\n\
     server { listen 127.0.0.1:{P0} reuseport; add_header X-Worker $pid always;\n\
     location / { proxy_pass http://stl; }\n\
     location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; } }\n\
     server { listen 127.0.0.1:{P1}; location / { add_header Set-Cookie \"sid=one\"; return 200 \"b1\\n\"; } }\n\
     server { listen 127.0.0.1:{P2}; location / { add_header Set-Cookie \"sid=two\"; return 200 \"b2\\n\"; } }\n";

pub fn case_sticky_upstreams_are_refused_and_keep_learning() -> Result<Completion, Failed> {
    let v = super::nginx_version()?;
    if v < (1, 29, 6) {
        let why = format!(
            "nginx {}.{}.{} has no `sticky` and calls no HTTP peer.notify (open-source nginx has both from 1.29.6)",
            v.0, v.1, v.2
        );
        eprintln!("skipped: {why}");
        return Ok(Completion::ignored_with(why));
    }
    run().map(|()| Completion::Completed)
}

fn run() -> CaseResult {
    let m = Master::start(CONF)?;
    let listed: Vec<String> = m.get_json("/")?["upstreams"]
        .as_array()
        .ok_or("no upstreams array")?
        .iter()
        .filter_map(|u| u["name"].as_str().map(str::to_string))
        .collect();
    check_eq(listed, vec!["plain".to_string()], "upstreams listed")?;
    for name in ["stl", "stc"] {
        for r in [
            m.api("GET", &format!("/{name}"), "")?,
            m.put(name, r#"{"servers":[{"address":"127.0.0.1:1"}]}"#)?,
        ] {
            check_eq(r.status, 409, &format!("{name}: status ({})", r.text()))?;
            let msg = json(&r)?["error"].as_str().unwrap_or("").to_string();
            check(msg.contains("unrecognised"), || {
                format!("{name}: {msg:?} does not name the balancer unrecognised")
            })?;
        }
    }
    // Learning after the header goes through peer.notify: a session learnt from the first
    // answer's cookie sends every later request with it to the same server, over new
    // connections (both workers), where round robin alone would alternate.
    let first = http_request(m.port(0), "GET", "/", &[], b"")?;
    check_eq(first.status, 200, "first request")?;
    let body = first.text().trim().to_string();
    let sid = if body == "b1" { "sid=one" } else { "sid=two" };
    let mut workers = std::collections::BTreeSet::new();
    for n in 0..12 {
        let r = http_request(m.port(0), "GET", "/", &[("Cookie", sid)], b"")?;
        workers.insert(r.header("X-Worker").unwrap_or("").to_string());
        check_eq(
            r.text().trim(),
            body.as_str(),
            &format!("request {n} with {sid}"),
        )?;
    }
    eprintln!("12 requests with {sid} all reached {body} (workers {workers:?})");
    m.check_workers_unchanged()
}
