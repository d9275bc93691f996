//! Cases for who may change sets (`upstreams_api` without `write=on` is read-only; a `PUT` needs
//! a `Host` of the listener, `localhost`, a `host=` of the location or a unix socket; every
//! applied `PUT` is logged) and for the small API items: a `GET` answer sent back by `PUT`,
//! `max_conns`, addresses that name no server, and routes of a location without a trailing `/`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::case::Case;
use ngx_harness::{check, check_eq, http_request, http_request_unix, CaseResult};

use super::helpers::*;
use super::master::{Master, SlowBackend};

/// The standard configuration plus a second server on `{P6}` with a read-only location, locations
/// with `host=` parameters and one without a trailing slash, and the API on a unix socket.
fn with_access_locations() -> String {
    format!(
        "{}server {{ listen 127.0.0.1:{{P6}};\n\
         location /ro/ {{ upstreams_api; }}\n\
         location /named/ {{ upstreams_api write=on host=api.internal; }}\n\
         location /any/ {{ upstreams_api write=on host=*; }}\n\
         location /v {{ upstreams_api write=on; }}\n\
         }}\n\
         server {{ listen unix:{{PREFIX}}/api.sock; location /api/ {{ upstreams_api write=on; }} }}\n",
        standard()
    )
}

fn on_p6(
    m: &Master,
    method: &str,
    path: &str,
    host: Option<&str>,
    body: &str,
) -> Result<ngx_harness::Response, ngx_harness::Failed> {
    let headers: Vec<(&str, &str)> = host.map(|h| ("Host", h)).into_iter().collect();
    http_request(m.port(6), method, path, &headers, body.as_bytes())
}

fn generation(m: &Master) -> Result<u64, ngx_harness::Failed> {
    Ok(m.get_json("/app")?["generation"]
        .as_u64()
        .ok_or("no generation")?)
}

fn case_read_only_unless_write_on() -> CaseResult {
    let m = Master::start(&with_access_locations())?;
    let g = generation(&m)?;
    let list = json(&on_p6(&m, "GET", "/ro/", None, "")?)?;
    check_eq(list["write"].as_bool(), Some(false), "GET /ro/ write")?;
    check(
        list["upstreams"].as_array().is_some_and(|a| !a.is_empty()),
        || format!("a read-only location still lists: {list}"),
    )?;
    check_eq(
        on_p6(&m, "GET", "/ro/app", None, "")?.status,
        200,
        "GET /ro/app",
    )?;
    let r = on_p6(&m, "PUT", "/ro/app", None, &set_body(&m, &[2], &[]))?;
    check_eq(
        r.status,
        405,
        &format!("PUT on the read-only location ({})", r.text()),
    )?;
    check(r.text().contains("upstreams_api write=on;"), || {
        format!("the 405 does not say how to enable writes: {}", r.text())
    })?;
    check_eq(generation(&m)?, g, "generation after the refused PUT")?;
    check_eq(
        addresses(&m.get_json("/app")?),
        vec![addr(&m, 1)],
        "set after the refused PUT",
    )?;
    check_eq(
        m.get_json("/")?["write"].as_bool(),
        Some(true),
        "GET / of the write=on location",
    )?;
    Ok(())
}

fn case_put_needs_a_host_of_the_listener() -> CaseResult {
    let m = Master::start(&with_access_locations())?;
    let body = |i| set_body(&m, &[i], &[]);
    for host in ["evil.example", "evil.example:8081", "127.0.0.2", "[::1]"] {
        let g = generation(&m)?;
        let r = http_request(
            m.port(0),
            "PUT",
            "/api/app",
            &[("Host", host)],
            body(2).as_bytes(),
        )?;
        check_eq(
            r.status,
            403,
            &format!("PUT with Host {host} ({})", r.text()),
        )?;
        let bare = host.split(':').next().unwrap_or(host);
        let bare = if host.starts_with('[') { host } else { bare };
        check(
            r.text().contains(bare) && r.text().contains("host="),
            || format!("the 403 names neither the host nor the fix: {}", r.text()),
        )?;
        check_eq(generation(&m)?, g, "generation after a refused PUT")?;
    }
    let own = format!("127.0.0.1:{}", m.port(0));
    for (i, host) in [(2, own.as_str()), (3, "127.0.0.1"), (4, "localhost:1")] {
        let r = http_request(
            m.port(0),
            "PUT",
            "/api/app",
            &[("Host", host)],
            body(i).as_bytes(),
        )?;
        check_eq(
            r.status,
            200,
            &format!("PUT with Host {host} ({})", r.text()),
        )?;
    }
    // host=NAME adds a name (any port); host=* accepts any Host.
    let r = on_p6(&m, "PUT", "/named/app", Some("API.internal:9000"), &body(5))?;
    check_eq(r.status, 200, &format!("PUT /named/ ({})", r.text()))?;
    let r = on_p6(&m, "PUT", "/named/app", Some("other.internal"), &body(1))?;
    check_eq(r.status, 403, "PUT /named/ with another name")?;
    let r = on_p6(&m, "PUT", "/any/app", Some("whatever.example"), &body(1))?;
    check_eq(r.status, 200, &format!("PUT /any/ ({})", r.text()))?;
    // A unix socket takes any Host.
    let sock = m.dir.join("api.sock");
    let r = http_request_unix(
        &sock,
        "PUT",
        "/api/app",
        &[("Host", "evil.example")],
        body(3).as_bytes(),
    )?;
    check_eq(
        r.status,
        200,
        &format!("PUT over the unix socket ({})", r.text()),
    )?;
    check_eq(
        addresses(&m.get_json("/app")?),
        vec![addr(&m, 3)],
        "set after the unix socket's PUT",
    )?;
    Ok(())
}

fn case_applied_put_is_logged() -> CaseResult {
    let m = Master::start(&standard())?;
    let r = json(&m.put("app", &set_body(&m, &[2, 3], &[]))?)?;
    let g = r["generation"].as_u64().ok_or("no generation")?;
    // The same set again changes nothing and logs nothing.
    check_eq(
        json(&m.put("app", &set_body(&m, &[3, 2], &[]))?)?["changed"].as_bool(),
        Some(false),
        "changed (same set)",
    )?;
    let lines: Vec<String> = m
        .error_log()
        .lines()
        .filter(|l| l.contains("upstreams_api: client"))
        .map(str::to_string)
        .collect();
    check_eq(lines.len(), 1, &format!("notice lines: {lines:?}"))?;
    let line = &lines[0];
    check(line.contains("[notice]"), || {
        format!("not a notice: {line}")
    })?;
    let body = format!(
        "upstreams_api: client 127.0.0.1 changed upstream \"app\": added 2 ({} {}), removed 1 ({}), generation {g}",
        addr(&m, 2),
        addr(&m, 3),
        addr(&m, 1)
    );
    check(line.contains(&body), || {
        format!("log line {line:?} does not contain {body:?}")
    })
}

fn case_get_answer_goes_back_by_put() -> CaseResult {
    let m = Master::start(&standard())?;
    check_eq(
        m.put("app", &set_body(&m, &[1, 2], &[3]))?.status,
        200,
        "PUT",
    )?;
    // Failures and active connections are in the answer; the whole answer goes back.
    let _ = m.front()?;
    let got = m.api("GET", "/app", "")?;
    check_eq(got.status, 200, "GET")?;
    let text = got.text();
    let r = m.put("app", text.trim())?;
    check_eq(
        r.status,
        200,
        &format!("PUT of the GET answer ({})", r.text()),
    )?;
    let v = json(&r)?;
    check_eq(v["changed"].as_bool(), Some(false), "changed")?;
    for field in ["\"active\"", "\"fails\"", "\"max_conns\""] {
        check(text.contains(field), || {
            format!("GET has no {field}: {text}")
        })?;
    }
    Ok(())
}

fn case_max_conns_is_carried_and_applied() -> CaseResult {
    let m = Master::start(&standard())?;
    m.expect_log("no live upstreams while connecting to upstream");
    let slow = SlowBackend::start()?;
    let body = format!(
        r#"{{"servers":[{{"address":"127.0.0.1:{}","max_conns":1}}]}}"#,
        slow.port
    );
    let r = m.put("app", &body)?;
    check_eq(r.status, 200, &format!("PUT with max_conns ({})", r.text()))?;
    let v = m.get_json("/app")?;
    check_eq(v["servers"][0]["max_conns"].as_u64(), Some(1), "max_conns")?;
    // One request holds the only server's one connection: the next finds no server (502).
    let port0 = m.port(0);
    let held =
        std::thread::spawn(move || http_request(port0, "GET", "/", &[], b"").map(|r| r.status));
    slow.accepted
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "slow backend got no connection")?;
    let second = http_request(port0, "GET", "/", &[], b"")?;
    check_eq(second.status, 502, "a request beyond max_conns")?;
    slow.release.store(true, Ordering::SeqCst);
    check_eq(
        held.join().map_err(|_| "request thread panicked")??,
        200,
        "the held request",
    )?;
    // Changing only max_conns is a change; 0 (no limit) is the default and shown as such.
    let r = json(&m.put("app", &set_body(&m, &[1], &[]))?)?;
    check_eq(r["changed"].as_bool(), Some(true), "changed")?;
    check_eq(
        m.get_json("/app")?["servers"][0]["max_conns"].as_u64(),
        Some(0),
        "max_conns after a PUT without it",
    )?;
    m.check_workers_unchanged()
}

fn case_unusable_addresses_are_refused() -> CaseResult {
    let m = Master::start(&standard())?;
    let g = generation(&m)?;
    for a in [
        "0.0.0.0:80",
        "[::]:80",
        "224.0.0.1:80",
        "[ff02::1]:80",
        "255.255.255.255:80",
    ] {
        let r = m.put("app", &format!(r#"{{"servers":[{{"address":"{a}"}}]}}"#))?;
        check_eq(r.status, 400, &format!("PUT {a} ({})", r.text()))?;
        check(r.text().contains(a), || {
            format!("the 400 does not name {a}: {}", r.text())
        })?;
    }
    check_eq(generation(&m)?, g, "generation")?;
    check_eq(addresses(&m.get_json("/app")?), vec![addr(&m, 1)], "set")
}

fn case_location_without_slash_routes_below_it_only() -> CaseResult {
    let m = Master::start(&with_access_locations())?;
    let r = on_p6(&m, "GET", "/vapp", None, "")?;
    check_eq(r.status, 404, &format!("GET /vapp ({})", r.text()))?;
    let r = on_p6(&m, "PUT", "/vapp", None, &set_body(&m, &[2], &[]))?;
    check_eq(r.status, 404, &format!("PUT /vapp ({})", r.text()))?;
    check_eq(addresses(&m.get_json("/app")?), vec![addr(&m, 1)], "set")?;
    check_eq(
        on_p6(&m, "GET", "/v/app", None, "")?.status,
        200,
        "GET /v/app",
    )?;
    check_eq(on_p6(&m, "GET", "/v", None, "")?.status, 200, "GET /v")?;
    Ok(())
}

/// The trials of this file.
pub fn trials() -> Vec<Case> {
    vec![
        Case::test("read_only_unless_write_on", case_read_only_unless_write_on),
        Case::test(
            "put_needs_a_host_of_the_listener",
            case_put_needs_a_host_of_the_listener,
        ),
        Case::test("applied_put_is_logged", case_applied_put_is_logged),
        Case::test(
            "get_answer_goes_back_by_put",
            case_get_answer_goes_back_by_put,
        ),
        Case::test(
            "max_conns_is_carried_and_applied",
            case_max_conns_is_carried_and_applied,
        ),
        Case::test(
            "unusable_addresses_are_refused",
            case_unusable_addresses_are_refused,
        ),
        Case::test(
            "location_without_slash_routes_below_it_only",
            case_location_without_slash_routes_below_it_only,
        ),
    ]
}
