//! The NGINX Plus-compatible API (`upstreams_api plus`), read side: every endpoint the
//! Plus clients read, with Plus's field names, types, status codes and error codes. The Plus
//! location is `/api` (so `GET /api` lists the versions, as the Go client asks it), the native
//! API is `/native/` on the same server, `/ro` is a read-only Plus location.

use serde_json::Value;

use crate::case::Case;
use ngx_harness::{check, check_eq, http_request, CaseResult, Failed};

use super::helpers::*;
use super::master::Master;

/// `app` (round robin, b1 and backup b2), `lc` (least_conn, b1), `hs` (hash: not live),
/// `nozone`; the front proxies `/` to `app`.
pub fn conf(host: &str) -> String {
    format!(
        "upstream app {{ zone app 1m; server 127.0.0.1:{{P1}}; server 127.0.0.1:{{P2}} backup; }}\n\
         upstream lc {{ zone lc 64k; least_conn; server 127.0.0.1:{{P1}}; }}\n\
         upstream hs {{ zone other 64k; hash $uri; server 127.0.0.1:{{P1}}; }}\n\
         upstream nozone {{ server 127.0.0.1:{{P1}}; }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream off; }}\n\
         location /api {{ allow 127.0.0.1; deny all; upstreams_api plus write=on {host}; }}\n\
         location /ro {{ upstreams_api plus; }}\n\
         location /native/ {{ upstreams_api write=on; }}\n\
         }}\n{}",
        (1..=5).map(backend).collect::<String>()
    )
}

/// A request to the server: (status, JSON body).
pub fn call(m: &Master, method: &str, path: &str, body: &str) -> Result<(u16, Value), Failed> {
    let r = http_request(m.port(0), method, path, &[], body.as_bytes())?;
    let v = if r.body.is_empty() {
        Value::Null
    } else {
        json(&r)?
    };
    Ok((r.status, v))
}

/// `GET path`, which must answer 200.
pub fn get(m: &Master, path: &str) -> Result<Value, Failed> {
    let (s, v) = call(m, "GET", path, "")?;
    check_eq(s, 200, &format!("GET {path}: {v}"))?;
    Ok(v)
}

/// Checks an error answer: status, Plus's code, and the object's shape.
pub fn check_error(got: (u16, Value), status: u16, code: &str, what: &str) -> CaseResult {
    let (s, v) = got;
    check_eq(s, status, &format!("{what}: status ({v})"))?;
    check_eq(v["error"]["status"].as_u64(), Some(u64::from(status)), what)?;
    check_eq(
        v["error"]["code"].as_str(),
        Some(code),
        &format!("{what}: code ({v})"),
    )?;
    check(
        v["error"]["text"].as_str().is_some_and(|t| !t.is_empty()),
        || format!("{what}: no text: {v}"),
    )?;
    let id = v["request_id"].as_str().unwrap_or_default();
    check(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        || format!("{what}: request_id is not $request_id: {v}"),
    )?;
    check(v["href"].as_str().is_some(), || {
        format!("{what}: no href: {v}")
    })
}

fn check_u64_fields(v: &Value, fields: &[&str], what: &str) -> CaseResult {
    for f in fields {
        check(v[*f].is_u64(), || {
            format!("{what}: \"{f}\" is not an integer: {v}")
        })?;
    }
    Ok(())
}

fn case_versions_nginx_and_counters() -> CaseResult {
    let m = Master::start(&conf(""))?;
    check_eq(
        get(&m, "/api")?,
        serde_json::json!([4, 5, 6, 7, 8, 9]),
        "GET /api",
    )?;
    check_eq(get(&m, "/api/")?, get(&m, "/api")?, "GET /api/")?;
    let root = get(&m, "/api/8/")?;
    for e in [
        "nginx",
        "processes",
        "connections",
        "slabs",
        "http",
        "resolvers",
        "ssl",
    ] {
        check(
            root.as_array().is_some_and(|a| a.iter().any(|x| x == e)),
            || format!("/api/8/ lacks {e}: {root}"),
        )?;
    }
    let http = get(&m, "/api/8/http")?;
    check(
        http.as_array()
            .is_some_and(|a| a.iter().any(|x| x == "upstreams")),
        || format!("/api/8/http/: {http}"),
    )?;
    let n = get(&m, "/api/8/nginx")?;
    check(
        n["version"]
            .as_str()
            .is_some_and(|v| v.split('.').count() == 3),
        || format!("version: {n}"),
    )?;
    check_eq(n["address"].as_str(), Some("127.0.0.1"), "nginx address")?;
    check_eq(
        n["generation"].as_u64(),
        Some(0),
        "nginx generation before a reload",
    )?;
    check_eq(
        n["ppid"].as_u64(),
        Some(u64::from(m.master_pid())),
        "ppid is the master",
    )?;
    let pid = n["pid"].as_u64().unwrap_or(0) as u32;
    check(m.workers().contains(&pid), || {
        format!("pid {pid} is no worker: {n}")
    })?;
    for f in ["timestamp", "load_timestamp"] {
        check(
            n[f].as_str()
                .is_some_and(|t| t.len() == 24 && t.ends_with('Z')),
            || format!("{f}: {n}"),
        )?;
    }
    // nginx's own counters (stub status): real numbers that move.
    let c1 = get(&m, "/api/8/connections")?;
    check_u64_fields(
        &c1,
        &["accepted", "dropped", "active", "idle"],
        "connections",
    )?;
    let r1 = get(&m, "/api/8/http/requests")?;
    check_u64_fields(&r1, &["total", "current"], "http/requests")?;
    check(r1["current"].as_u64() >= Some(1), || {
        format!("this request is current: {r1}")
    })?;
    for _ in 0..5 {
        m.front()?;
    }
    let r2 = get(&m, "/api/8/http/requests")?;
    check(
        r2["total"].as_u64() >= Some(r1["total"].as_u64().unwrap_or(0) + 6),
        || format!("total did not count 6 requests: {r1} then {r2}"),
    )?;
    let c2 = get(&m, "/api/8/connections")?;
    check(
        c2["accepted"].as_u64() >= Some(c1["accepted"].as_u64().unwrap_or(0) + 6),
        || format!("accepted did not count 6 connections: {c1} then {c2}"),
    )?;
    // Slabs of the live upstreams' zones.
    let s = get(&m, "/api/8/slabs")?;
    for z in ["app", "lc"] {
        check_u64_fields(
            &s[z]["pages"],
            &["used", "free"],
            &format!("slabs {z} pages"),
        )?;
        check(s[z]["pages"]["used"].as_u64() > Some(0), || {
            format!("{z} uses pages: {s}")
        })?;
        check_u64_fields(
            &s[z]["slots"]["8"],
            &["used", "free", "reqs", "fails"],
            "slot 8",
        )?;
    }
    check(s.get("other").is_none(), || {
        format!("a zone of no live upstream: {s}")
    })?;
    check_eq(get(&m, "/api/8/slabs/app")?, s["app"].clone(), "slabs/app")?;
    check_error(
        call(&m, "GET", "/api/8/slabs/nope", "")?,
        404,
        "SlabNotFound",
        "slabs/nope",
    )?;
    // What open-source nginx does not keep: Plus's answer when none is configured.
    for p in [
        "processes",
        "ssl",
        "resolvers",
        "http/caches",
        "http/server_zones",
        "http/location_zones",
        "http/limit_reqs",
        "http/limit_conns",
        "http/keyvals",
    ] {
        check_eq(get(&m, &format!("/api/8/{p}"))?, serde_json::json!({}), p)?;
    }
    for (p, code) in [
        ("http/caches/c", "CacheNotFound"),
        ("http/server_zones/z", "ServerZoneNotFound"),
        ("http/keyvals/k", "KeyvalZoneNotFound"),
    ] {
        check_error(call(&m, "GET", &format!("/api/8/{p}"), "")?, 404, code, p)?;
    }
    for p in [
        "/api/8/stream/upstreams",
        "/api/8/stream/server_zones",
        "/api/8/stream/zone_sync",
        "/api/8/stream/limit_conns",
        "/api/4/http/location_zones",
        "/api/5/http/limit_reqs",
        "/api/8/nothing",
    ] {
        check_error(call(&m, "GET", p, "")?, 404, "PathNotFound", p)?;
    }
    check_error(
        call(&m, "GET", "/api/3/nginx", "")?,
        404,
        "UnknownVersion",
        "v3",
    )?;
    check_error(
        call(&m, "GET", "/api/10/", "")?,
        404,
        "UnknownVersion",
        "v10",
    )?;
    m.check_workers_unchanged()
}

fn case_upstreams_peers_and_servers() -> CaseResult {
    let m = Master::start(&conf(""))?;
    let (a1, a2) = (addr(&m, 1), addr(&m, 2));
    for _ in 0..4 {
        m.front()?;
    }
    let all = get(&m, "/api/8/http/upstreams")?;
    let names: Vec<String> = all
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    check_eq(
        names,
        vec!["app".to_string(), "lc".to_string()],
        "live upstreams only",
    )?;
    let app = get(&m, "/api/8/http/upstreams/app")?;
    check_eq(&app, &all["app"], "http/upstreams/app")?;
    check_eq(app["zone"].as_str(), Some("app"), "zone")?;
    check_eq(app["zombies"].as_u64(), Some(0), "zombies")?;
    let peers = app["peers"].as_array().ok_or("no peers")?;
    check_eq(peers.len(), 2, "peers")?;
    let (p1, p2) = (&peers[0], &peers[1]);
    check_eq(p1["server"].as_str(), Some(a1.as_str()), "peer 1 server")?;
    check_eq(p1["name"].as_str(), Some(a1.as_str()), "peer 1 name")?;
    check_eq(
        (p1["id"].as_u64(), p2["id"].as_u64()),
        (Some(0), Some(1)),
        "ids",
    )?;
    check_eq(
        (p1["backup"].as_bool(), p2["backup"].as_bool()),
        (Some(false), Some(true)),
        "backup",
    )?;
    check_eq(p1["state"].as_str(), Some("up"), "state")?;
    check_u64_fields(
        p1,
        &[
            "weight",
            "active",
            "max_conns",
            "requests",
            "sent",
            "received",
            "fails",
            "unavail",
            "downtime",
        ],
        "peer",
    )?;
    check_u64_fields(
        &p1["responses"],
        &["1xx", "2xx", "3xx", "4xx", "5xx", "total"],
        "responses",
    )?;
    check_u64_fields(
        &p1["health_checks"],
        &["checks", "fails", "unhealthy"],
        "health_checks",
    )?;
    // The configuration view of the servers.
    let servers = get(&m, "/api/8/http/upstreams/app/servers")?;
    check_eq(servers.as_array().map(Vec::len), Some(2), "servers")?;
    let s2 = get(&m, "/api/8/http/upstreams/app/servers/1")?;
    check_eq(&s2, &servers[1], "servers/1")?;
    check_eq(
        s2,
        serde_json::json!({"id": 1, "server": a2, "weight": 1, "max_conns": 0, "max_fails": 1,
            "fail_timeout": "10s", "slow_start": "0s", "route": "", "backup": true,
            "down": false, "drain": false}),
        "server 1",
    )?;
    // Every version serves the same upstream part.
    for v in [4, 5, 6, 7, 9] {
        check_eq(
            get(&m, &format!("/api/{v}/http/upstreams/app/servers/"))?,
            servers.clone(),
            "v",
        )?;
    }
    // The native API shows the same ids.
    let native = get(&m, "/native/app")?;
    check_eq(native["servers"][1]["id"].as_u64(), Some(1), "native id")?;
    // Errors.
    check_error(
        call(&m, "GET", "/api/8/http/upstreams/nope", "")?,
        404,
        "UpstreamNotFound",
        "nope",
    )?;
    for name in ["nozone", "hs"] {
        let p = format!("/api/8/http/upstreams/{name}/servers");
        check_error(call(&m, "GET", &p, "")?, 400, "UpstreamStatic", name)?;
    }
    let p = "/api/8/http/upstreams/app/servers/7";
    check_error(
        call(&m, "GET", p, "")?,
        404,
        "UpstreamServerNotFound",
        "id 7",
    )?;
    let p = "/api/8/http/upstreams/app/servers/x";
    check_error(call(&m, "GET", p, "")?, 400, "UpstreamBadServerId", "id x")?;
    check_error(
        call(&m, "PUT", "/api/8/http/upstreams/app", "{}")?,
        405,
        "MethodNotSupported",
        "PUT",
    )?;
    m.check_workers_unchanged()
}

/// `app` with one server whose answer depends on the path: `/nf` 404, `/err` 500, else 200.
fn counting_conf() -> String {
    "upstream app { zone app 1m; server 127.0.0.1:{P1}; }\n\
     server { listen 127.0.0.1:{P0} reuseport;\n\
     add_header X-Worker $pid always;\n\
     location / { proxy_pass http://app; proxy_next_upstream off; }\n\
     location /api { upstreams_api plus; }\n\
     }\n\
     server { listen 127.0.0.1:{P1};\n\
     location = /nf { return 404; }\n\
     location = /err { return 500; }\n\
     location / { return 200 \"ok\\n\"; } }\n"
        .to_string()
}

fn case_peer_counters_count_the_requests_sent() -> CaseResult {
    let mut m = Master::start(&counting_conf())?;
    let mut workers = std::collections::BTreeSet::new();
    for (path, n) in [("/", 6), ("/nf", 3), ("/err", 2)] {
        for _ in 0..n {
            let r = http_request(m.port(0), "GET", path, &[], b"")?;
            workers.insert(r.header("X-Worker").unwrap_or_default().to_string());
        }
    }
    let p = &get(&m, "/api/8/http/upstreams/app")?["peers"][0];
    check_eq(p["requests"].as_u64(), Some(11), &format!("requests: {p}"))?;
    check_eq(
        &p["responses"],
        &serde_json::json!({"1xx": 0, "2xx": 6, "3xx": 0, "4xx": 3, "5xx": 2, "total": 11}),
        "responses by class",
    )?;
    check(
        p["sent"].as_u64() > Some(0) && p["received"].as_u64() > Some(0),
        || format!("bytes: {p}"),
    )?;
    check(
        p["selected"].as_str().is_some_and(|t| t.ends_with('Z')),
        || format!("selected: {p}"),
    )?;
    check(
        p["header_time"].is_u64() && p["response_time"].is_u64(),
        || format!("times: {p}"),
    )?;
    check_eq(p["state"].as_str(), Some("up"), "state")?;
    // A reload makes a new zone: its counters start at 0, as NGINX Plus's do.
    m.reload(&counting_conf())?;
    let p = &get(&m, "/api/8/http/upstreams/app")?["peers"][0];
    check_eq(
        p["requests"].as_u64(),
        Some(0),
        &format!("after a reload: {p}"),
    )?;
    check(p.get("selected").is_none(), || {
        format!("never selected in the new zone: {p}")
    })?;
    Ok(())
}

pub fn trials() -> Vec<Case> {
    let mut t = vec![
        Case::emerg(
            "plus_mode_word_comes_first",
            "server { listen 127.0.0.1:{P0}; location /api { upstreams_api write=on plus; } }",
            "plus must be the first parameter",
        ),
        Case::test(
            "plus_versions_nginx_and_counters",
            case_versions_nginx_and_counters,
        ),
        Case::test(
            "plus_upstreams_peers_and_servers",
            case_upstreams_peers_and_servers,
        ),
        Case::test(
            "plus_peer_counters_count_the_requests_sent",
            case_peer_counters_count_the_requests_sent,
        ),
    ];
    t.extend(super::plus_writes::trials());
    t
}
