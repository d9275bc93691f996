//! The API's edges: a compare-and-set conflict, bad inputs that change nothing, a reload that
//! restores the configured set, zone memory over many changes, other balancers (least_conn,
//! keepalive), `resolve` servers refused, and set changes under traffic with retries.

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ngx_harness::{check, check_eq, http_request, CaseResult, Completion, Failed};

use super::helpers::*;
use super::master::Master;
use super::nginx_version;

pub(super) fn case_compare_and_set_conflict() -> CaseResult {
    let m = Master::start(&standard())?;
    let g = m.get_json("/app")?["generation"]
        .as_u64()
        .ok_or("no generation")?;
    let with_gen = |servers: &[usize], g: u64| {
        let b = set_body(&m, servers, &[]);
        format!("{},\"generation\":{g}}}", &b[..b.len() - 1])
    };
    let r = m.put("app", &with_gen(&[2], g))?;
    check_eq(
        r.status,
        200,
        &format!("PUT with the current generation ({})", r.text()),
    )?;
    let r = m.put("app", &with_gen(&[3], g))?;
    check_eq(r.status, 409, "PUT with a stale generation")?;
    check(r.text().contains("generation is"), || {
        format!("409 text: {}", r.text())
    })?;
    check_eq(
        addresses(&m.get_json("/app")?),
        vec![addr(&m, 2)],
        "set after the conflict",
    )?;
    Ok(())
}

pub(super) fn case_bad_inputs_change_nothing() -> CaseResult {
    let m = Master::start(&standard())?;
    check_eq(
        m.put("app", &set_body(&m, &[2, 3], &[4]))?.status,
        200,
        "PUT",
    )?;
    let before = m.get_json("/app")?;
    let many: Vec<String> = (0..16_385)
        .map(|i| format!(r#"{{"address":"10.1.{}.{}:80"}}"#, i / 250, i % 250 + 1))
        .collect();
    let tiny_many: Vec<String> = (0..300)
        .map(|i| format!(r#"{{"address":"10.1.{}.{}:80"}}"#, i / 250, i % 250 + 1))
        .collect();
    let huge = format!(
        r#"{{"servers":[{{"address":"10.0.0.1:80"}}]{}}}"#,
        " ".repeat(4 * 1024 * 1024)
    );
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("PUT", "/app", "{\"servers\":".into(), 400, "bad JSON"),
        ("PUT", "/app", "".into(), 400, "empty body"),
        (
            "PUT",
            "/nope",
            set_body(&m, &[1], &[]),
            404,
            "no upstream \\\"nope\\\"",
        ),
        (
            "PUT",
            "/nozone",
            set_body(&m, &[1], &[]),
            409,
            "has no zone",
        ),
        ("PUT", "/ih", set_body(&m, &[1], &[]), 409, "ip_hash"),
        (
            "PUT",
            "/hs",
            set_body(&m, &[1], &[]),
            409,
            "hash consistent",
        ),
        ("PUT", "/rnd", set_body(&m, &[1], &[]), 409, "random"),
        (
            "PUT",
            "/app",
            r#"{"servers":[{"address":"localhost:80"}]}"#.into(),
            400,
            "addresses only",
        ),
        (
            "PUT",
            "/app",
            format!(r#"{{"servers":[{}]}}"#, many.join(",")),
            400,
            "at most 16384",
        ),
        ("PUT", "/app", huge, 413, "larger than"),
        (
            "PUT",
            "/tiny",
            format!(r#"{{"servers":[{}]}}"#, tiny_many.join(",")),
            507,
            "too small: about",
        ),
        ("DELETE", "/app", String::new(), 405, "GET or PUT"),
        ("POST", "/", String::new(), 405, "use GET"),
        ("GET", "/a/b", String::new(), 404, "no such API resource"),
    ];
    for (method, path, body, status, text) in cases {
        let r = m.api(method, path, &body)?;
        check_eq(r.status, status, &format!("{method} {path} ({})", r.text()))?;
        check(r.text().contains(text), || {
            format!("{method} {path}: {:?} lacks {text:?}", r.text())
        })?;
        check(r.header("Content-Type") == Some("application/json"), || {
            format!(
                "{method} {path}: content type {:?}",
                r.header("Content-Type")
            )
        })?;
        check_eq(
            &m.get_json("/app")?,
            &before,
            &format!("app after {method} {path}"),
        )?;
    }
    check_eq(
        addresses(&m.get_json("/tiny")?),
        vec![addr(&m, 1)],
        "tiny after the 507",
    )?;
    check_eq(
        m.get_json("/tiny?slab")?["alloc_failures"]
            .as_u64()
            .map(|f| f > 0),
        Some(true),
        "tiny zone saw the failed allocation",
    )?;
    check(!m.error_log().contains("no memory"), || {
        "a [crit] no-memory line for the refused change (the 507 says it)".into()
    })?;
    m.check_workers_unchanged()
}

pub(super) fn case_reload_restores_the_configured_set() -> CaseResult {
    let mut m = Master::start(&standard())?;
    let g0 = m.get_json("/app")?["generation"].as_u64();
    check_eq(
        m.put("app", &set_body(&m, &[2, 3], &[4]))?.status,
        200,
        "PUT",
    )?;
    check_eq(m.put("lc", &set_body(&m, &[5], &[]))?.status, 200, "PUT lc")?;
    std::thread::sleep(Duration::from_millis(5));
    let http = m.http.clone();
    m.reload(&http)?;
    let app = m.get_json("/app")?;
    check_eq(addresses(&app), vec![addr(&m, 1)], "app after reload")?;
    check_eq(
        addresses(&m.get_json("/lc")?),
        vec![addr(&m, 1)],
        "lc after reload",
    )?;
    check(app["generation"].as_u64() != g0, || {
        "generation repeated after reload".into()
    })?;
    both_workers_answer(&m, &["b1"], 5)?;
    // And live changes work on the new zone.
    check_eq(
        m.put("app", &set_body(&m, &[3], &[]))?.status,
        200,
        "PUT after reload",
    )?;
    both_workers_answer(&m, &["b3"], 5)?;
    m.check_workers_unchanged()
}

pub(super) fn case_least_conn_and_keepalive_take_live_changes() -> CaseResult {
    for up in ["lc", "rk", "lck"] {
        let m = Master::start(&format!(
            "upstream lc {{ zone app 64k; least_conn; server 127.0.0.1:{{P1}}; }}\n\
             upstream rk {{ zone rk 64k; server 127.0.0.1:{{P1}}; keepalive 4; }}\n\
             upstream lck {{ zone rk; least_conn; server 127.0.0.1:{{P1}}; keepalive 4; }}\n{}",
            front(
                up,
                "proxy_http_version 1.1; proxy_set_header Connection \"\";"
            )
        ))?;
        m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
        both_workers_answer(&m, &["b1"], 5)?;
        check_eq(
            m.put(up, &set_body(&m, &[2, 3], &[4]))?.status,
            200,
            &format!("PUT {up}"),
        )?;
        let seen = both_workers_answer(&m, &["b2", "b3"], 30)?;
        check_eq(seen.len(), 2, "workers")?;
        // Only the backup left alive: the dead primary fails over to it.
        let body = format!(
            r#"{{"servers":[{{"address":"127.0.0.1:{}"}},{{"address":"127.0.0.1:{}","backup":true}}]}}"#,
            m.dead,
            m.port(4)
        );
        check_eq(
            m.put(up, &body)?.status,
            200,
            &format!("PUT {up} dead+backup"),
        )?;
        both_workers_answer(&m, &["b4"], 5)?;
        m.check_workers_unchanged()?;
    }
    Ok(())
}

/// nginx 1.27.3+ resolves `server NAME resolve` names itself and rewrites the set from a timer:
/// such an upstream is refused (409), left out of `GET /`, and keeps its set. The resolver is a
/// port where nothing answers, so `localhost` never resolves and the upstream's servers stay the
/// configured address (b1) plus a name without addresses.
pub(super) fn case_resolve_servers_are_refused() -> Result<Completion, Failed> {
    let v = nginx_version()?;
    if v < (1, 27, 3) {
        let why = format!(
            "nginx {}.{}.{} has no `server ... resolve` (open-source nginx has it from 1.27.3)",
            v.0, v.1, v.2
        );
        eprintln!("skipped: {why}");
        return Ok(Completion::ignored_with(why));
    }
    let conf = standard_for("rs").replace(
        "upstream app {",
        "upstream rs { zone rs 64k; resolver 127.0.0.1:{DEAD} valid=1s; resolver_timeout 1s;\n\
         server 127.0.0.1:{P1}; server localhost:{P2} resolve; }\n\
         upstream app {",
    );
    let mut m = Master::start(&conf)?;
    // The resolver is a dead port on purpose: nginx logs its queries' failures.
    m.expect_log("while resolving, resolver: 127.0.0.1:");
    m.expect_log("could not be resolved");
    let refused = "upstream \"rs\" has servers with the \"resolve\" parameter";
    let check_refused = |what: &str, r: &ngx_harness::Response| -> CaseResult {
        check_eq(r.status, 409, &format!("{what} status ({})", r.text()))?;
        let msg = json(r)?["error"].as_str().unwrap_or("").to_string();
        check(msg.starts_with(refused), || {
            format!("{what}: error {msg:?} does not start with {refused:?}")
        })
    };
    let names = |m: &Master| -> Result<Vec<String>, Failed> {
        Ok(m.get_json("/")?["upstreams"]
            .as_array()
            .ok_or("no upstreams array")?
            .iter()
            .map(|u| u["name"].as_str().unwrap_or("").to_string())
            .collect())
    };
    let listed = names(&m)?;
    check(
        listed.iter().any(|n| n == "app") && !listed.iter().any(|n| n == "rs"),
        || format!("GET / lists {listed:?}: want app, not rs"),
    )?;
    both_workers_answer(&m, &["b1"], 3)?;
    check_refused("PUT rs", &m.put("rs", &set_body(&m, &[2, 3], &[4]))?)?;
    check_refused("GET rs", &m.api("GET", "/rs", "")?)?;
    // Nothing changed: both workers still send every request to b1 only.
    both_workers_answer(&m, &["b1"], 10)?;
    // The other upstreams of the same configuration still take changes.
    check_eq(
        m.put("app", &set_body(&m, &[3], &[]))?.status,
        200,
        "PUT app",
    )?;
    // Still refused after a reload (the classification is made per configuration).
    let http = m.http.clone();
    m.reload(&http)?;
    check_refused(
        "PUT rs after a reload",
        &m.put("rs", &set_body(&m, &[2], &[]))?,
    )?;
    both_workers_answer(&m, &["b1"], 3)?;
    let log = m.error_log();
    check(!log.contains("[alert]") && !log.contains("[crit]"), || {
        format!("[alert] or [crit] in the error log:\n{log}")
    })?;
    m.check_workers_unchanged()?;
    Ok(Completion::Completed)
}

pub(super) fn case_set_changes_under_traffic_with_retries() -> CaseResult {
    for up in ["app", "lck"] {
        set_changes_under_traffic_with_retries(up)
            .map_err(|e| format!("upstream {up}: {}", e.message().unwrap_or("failed")))?;
    }
    Ok(())
}

fn set_changes_under_traffic_with_retries(up: &str) -> CaseResult {
    // Many dead servers force each request through several tries, so sets change between a
    // request's init and its later tries; the set grows past 64 servers (the size where
    // nginx's tried bitmap stops fitting in one word) and shrinks again. Every request must get
    // 200: one given the small set's 5 tries and sent into the big set of fresh dead servers
    // continues with the big set's tries (it used to end with 502 after 5 dead servers, about
    // once in 20,000 requests under load).
    // A second access log of every request's status and tries, for the failure message.
    let base = standard_for(up);
    let plain_log = "access_log {PREFIX}/logs/up.log up;";
    check(base.contains(plain_log), || {
        "standard_for() changed: no up.log access_log".into()
    })?;
    let conf = base.replace(
        plain_log,
        &format!("{plain_log} access_log {{PREFIX}}/logs/tries.log tries;"),
    );
    let conf = format!(
        "log_format tries '$status $msec $pid u=$upstream_addr s=$upstream_status t=$upstream_connect_time';\n{conf}"
    );
    let m = Master::start(&conf)?;
    m.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for _ in 0..4 {
        let (stop, bad, total, port) = (stop.clone(), bad.clone(), total.clone(), m.port(0));
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match http_request(port, "GET", "/", &[], b"") {
                    Ok(r) if r.status == 200 => {}
                    other => {
                        // What went wrong, for the failure message (a status and body, or the
                        // client's error).
                        let what = match other {
                            Ok(r) => format!("HTTP {} {:?}", r.status, r.text()),
                            Err(e) => format!("client error: {e:?}"),
                        };
                        if bad.fetch_add(1, Ordering::SeqCst) < 3 {
                            eprintln!("not 200: {what}");
                        }
                    }
                }
                total.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let dead_base = 20_000 + (m.dead as usize % 5000);
    for round in 0..60 {
        let n = if round % 2 == 0 { 100 } else { 3 };
        let mut s: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    r#"{{"address":"127.0.0.{}:{}"}}"#,
                    2 + i % 200,
                    dead_base + i
                )
            })
            .collect();
        s.push(format!(
            r#"{{"address":"127.0.0.1:{}"}}"#,
            m.port(1 + round % 5)
        ));
        s.push(format!(
            r#"{{"address":"127.0.0.1:{}","backup":true}}"#,
            m.port(1 + (round + 1) % 5)
        ));
        let r = m.put(up, &format!(r#"{{"servers":[{}]}}"#, s.join(",")))?;
        check_eq(r.status, 200, &format!("PUT round {round} ({})", r.text()))?;
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let (bad, total) = (bad.load(Ordering::SeqCst), total.load(Ordering::SeqCst));
    eprintln!("{total} requests during 60 set changes, {bad} not 200");
    check(total > 100, || format!("only {total} requests"))?;
    if bad > 0 {
        let tries = fs::read_to_string(m.dir.join("logs/tries.log")).unwrap_or_default();
        for line in tries.lines().filter(|l| !l.starts_with("200 ")).take(3) {
            eprintln!("access log of a request not answered 200: {line}");
        }
        let log = m.error_log();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("connect() failed (111"))
            .collect();
        eprintln!(
            "error log without the expected connection refusals (last 30 of {}):\n{}",
            lines.len(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        );
    }
    check_eq(bad, 0, "requests that did not end in 200")?;
    m.check_workers_unchanged()
}
