//! The NGINX Plus-compatible API, write side: `POST`/`PATCH`/`DELETE` of servers change the
//! traffic of both workers without new workers, ids stay with their server and are never given
//! twice, every refused write changes nothing, two concurrent writers lose no server (each write
//! is the native `PUT` with compare-and-set on the generation, planned again on a conflict), and
//! a reload starts a new zone (ids from 0, `generation` counts the reload).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::case::Case;
use ngx_harness::{check, check_eq, http_request, CaseResult, Failed};

use super::helpers::*;
use super::master::Master;
use super::plus::{call, check_error, conf, get};

const SERVERS: &str = "/api/8/http/upstreams/app/servers";

/// `(server, id)` of `GET .../servers`.
fn ids(m: &Master) -> Result<BTreeMap<String, u64>, Failed> {
    let v = get(m, SERVERS)?;
    let a = v.as_array().ok_or_else(|| format!("servers: {v}"))?;
    Ok(a.iter()
        .map(|s| {
            (
                s["server"].as_str().unwrap_or("?").to_string(),
                s["id"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect())
}

/// Answers of `n` front requests, counted.
fn answers(m: &Master, n: usize) -> Result<BTreeMap<String, usize>, Failed> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        *seen.entry(m.front()?.1).or_default() += 1;
    }
    Ok(seen)
}

fn case_writes_change_traffic_of_both_workers() -> CaseResult {
    let m = Master::start(&conf(""))?;
    let (a1, a3) = (addr(&m, 1), addr(&m, 3));
    // POST: b3 joins with weight 2.
    let (s, v) = call(
        &m,
        "POST",
        &format!("{SERVERS}/"),
        &format!(r#"{{"server":"{a3}","weight":2}}"#),
    )?;
    check_eq(s, 201, &format!("POST b3: {v}"))?;
    check_eq(v["id"].as_u64(), Some(2), "the new server's id")?;
    check_eq(v["weight"].as_u64(), Some(2), "its weight")?;
    let seen = both_workers_answer(&m, &["b1", "b3"], 6)?;
    check_eq(seen.len(), 2, "both workers answered")?;
    let a = answers(&m, 30)?;
    check(
        a.get("b3").copied().unwrap_or(0) > 0 && a.get("b1").copied().unwrap_or(0) > 0,
        || format!("traffic does not reach b1 and b3: {a:?}"),
    )?;
    // PATCH: b1 down; only b3 answers, in both workers.
    let (s, v) = call(&m, "PATCH", &format!("{SERVERS}/0/"), r#"{"down":true}"#)?;
    check_eq(s, 200, &format!("PATCH 0: {v}"))?;
    check_eq(
        (v["id"].as_u64(), v["down"].as_bool()),
        (Some(0), Some(true)),
        "patched server",
    )?;
    let peer = &get(&m, "/api/8/http/upstreams/app")?["peers"][0];
    check_eq(
        peer["state"].as_str(),
        Some("down"),
        "peer state of a down server",
    )?;
    until_both_answer(&m, &["b3"])?;
    both_workers_answer(&m, &["b3"], 5)?;
    // PATCH weight of b3 keeps its id.
    let (s, _) = call(
        &m,
        "PATCH",
        &format!("{SERVERS}/2"),
        r#"{"weight":5,"drain":false}"#,
    )?;
    check_eq(s, 200, "PATCH 2")?;
    check_eq(ids(&m)?.get(&a3).copied(), Some(2), "b3 keeps id 2")?;
    // DELETE b1: the servers left are the answer.
    let (s, v) = call(&m, "DELETE", &format!("{SERVERS}/0/"), "")?;
    check_eq(s, 200, &format!("DELETE 0: {v}"))?;
    let left: Vec<u64> = v
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["id"].as_u64()).collect())
        .unwrap_or_default();
    check_eq(left, vec![2, 1], "servers left (primary, then backup)")?;
    // b1 back (with its old id, which is ignored): a new id, never 0 again.
    let (s, v) = call(
        &m,
        "POST",
        SERVERS,
        &format!(r#"{{"server":"{a1}","id":0}}"#),
    )?;
    check_eq(s, 201, &format!("POST b1 again: {v}"))?;
    check_eq(v["id"].as_u64(), Some(3), "b1 gets a new id")?;
    let a = answers(&m, 40)?;
    check(
        a.keys().all(|k| k == "b1" || k == "b3") && a.len() == 2,
        || format!("after b1 came back: {a:?}"),
    )?;
    check(m.error_log().contains("changed upstream \"app\""), || {
        format!("no notice of the change: {}", m.error_log())
    })?;
    m.check_workers_unchanged()
}

fn case_refused_writes_change_nothing() -> CaseResult {
    let m = Master::start(&conf(""))?;
    let before = get(&m, "/native/app")?;
    let a1 = addr(&m, 1);
    let ro = "/ro/8/http/upstreams/app/servers";
    check_error(
        call(&m, "POST", ro, r#"{"server":"127.0.0.1:1"}"#)?,
        405,
        "MethodDisabled",
        "read-only POST",
    )?;
    check_error(
        call(&m, "DELETE", &format!("{ro}/1"), "")?,
        405,
        "MethodDisabled",
        "read-only DELETE",
    )?;
    check_error(
        call(&m, "PATCH", &format!("{ro}/1"), "{}")?,
        405,
        "MethodDisabled",
        "read-only PATCH",
    )?;
    let r = http_request(
        m.port(0),
        "DELETE",
        &format!("{SERVERS}/1"),
        &[("Host", "evil.example")],
        b"",
    )?;
    check_error(
        (r.status, json(&r)?),
        403,
        "HostNotAllowed",
        "Host evil.example",
    )?;
    for (method, path, body, status, code) in [
        (
            "POST",
            SERVERS.to_string(),
            "nope".to_string(),
            415,
            "JsonError",
        ),
        (
            "POST",
            SERVERS.to_string(),
            r#"{"weight":1}"#.to_string(),
            400,
            "UpstreamConfFormatError",
        ),
        (
            "POST",
            SERVERS.to_string(),
            format!(r#"{{"server":"{a1}"}}"#),
            409,
            "EntryExists",
        ),
        (
            "POST",
            SERVERS.to_string(),
            r#"{"server":"backend.example:80"}"#.into(),
            400,
            "UpstreamBadAddress",
        ),
        (
            "POST",
            SERVERS.to_string(),
            r#"{"server":"127.0.0.1:9","slow_start":"5s"}"#.into(),
            400,
            "UpstreamBadSlowStart",
        ),
        (
            "POST",
            SERVERS.to_string(),
            r#"{"server":"127.0.0.1:9","weight":0}"#.into(),
            400,
            "UpstreamBadWeight",
        ),
        (
            "POST",
            SERVERS.to_string(),
            r#"{"server":"127.0.0.1:9","what":1}"#.into(),
            400,
            "UpstreamConfFormatError",
        ),
        (
            "PATCH",
            format!("{SERVERS}/0"),
            r#"{"server":"127.0.0.1:9"}"#.into(),
            400,
            "UpstreamServerImmutable",
        ),
        (
            "PATCH",
            format!("{SERVERS}/0"),
            r#"{"backup":true}"#.into(),
            400,
            "UpstreamServerImmutable",
        ),
        (
            "PATCH",
            format!("{SERVERS}/0"),
            r#"{"fail_timeout":"1500ms"}"#.into(),
            400,
            "UpstreamBadFailTimeout",
        ),
        (
            "PATCH",
            format!("{SERVERS}/9"),
            "{}".into(),
            404,
            "UpstreamServerNotFound",
        ),
        (
            "DELETE",
            format!("{SERVERS}/0"),
            String::new(),
            400,
            "UpstreamServerImmutable",
        ),
        (
            "DELETE",
            format!("{SERVERS}/9"),
            String::new(),
            404,
            "UpstreamServerNotFound",
        ),
        (
            "POST",
            "/api/8/http/upstreams/nozone/servers".into(),
            r#"{"server":"127.0.0.1:9"}"#.into(),
            400,
            "UpstreamStatic",
        ),
        (
            "POST",
            "/api/8/http/upstreams/nope/servers".into(),
            r#"{"server":"127.0.0.1:9"}"#.into(),
            404,
            "UpstreamNotFound",
        ),
        (
            "POST",
            format!("{SERVERS}/0"),
            "{}".into(),
            405,
            "MethodNotSupported",
        ),
        (
            "DELETE",
            "/api/8/connections".into(),
            String::new(),
            405,
            "MethodNotSupported",
        ),
    ] {
        let what = format!("{method} {path} {body}");
        check_error(call(&m, method, &path, &body)?, status, code, &what)?;
    }
    check_eq(
        get(&m, "/native/app")?,
        before,
        "the set after the refused writes",
    )?;
    m.check_workers_unchanged()
}

fn case_concurrent_writers_lose_no_server() -> CaseResult {
    let m = Master::start(&conf(""))?;
    let (port, dead) = (m.port(0), m.dead);
    let (nwriters, per) = (4, 25);
    let writers: Vec<_> = (1..=nwriters)
        .map(|w| {
            std::thread::spawn(move || -> Result<(), String> {
                for i in 0..per {
                    let body = format!(r#"{{"server":"127.0.{w}.{}:{dead}","down":true}}"#, i + 1);
                    let r = http_request(port, "POST", SERVERS, &[], body.as_bytes())
                        .map_err(|e| format!("{e:?}"))?;
                    if r.status != 201 {
                        return Err(format!("writer {w} POST {i}: {} {}", r.status, r.text()));
                    }
                }
                Ok(())
            })
        })
        .collect();
    // A third writer changes b1's weight meanwhile.
    for i in 0..per {
        let (s, v) = call(
            &m,
            "PATCH",
            &format!("{SERVERS}/0"),
            &format!(r#"{{"weight":{}}}"#, i % 3 + 1),
        )?;
        check_eq(s, 200, &format!("PATCH {i}: {v}"))?;
    }
    for w in writers {
        w.join().map_err(|_| "writer panicked")??;
    }
    let all = ids(&m)?;
    check_eq(
        all.len(),
        2 + nwriters * per,
        &format!("servers after the concurrent POSTs: {all:?}"),
    )?;
    let distinct: BTreeSet<u64> = all.values().copied().collect();
    check_eq(distinct.len(), all.len(), "ids are distinct")?;
    check_eq(
        all.get(&addr(&m, 1)).copied(),
        Some(0),
        "b1 kept id 0 through the PATCHes",
    )?;
    m.check_workers_unchanged()
}

fn case_reload_starts_a_new_zone() -> CaseResult {
    let mut m = Master::start(&conf(""))?;
    let (s, _) = call(
        &m,
        "POST",
        SERVERS,
        &format!(r#"{{"server":"{}"}}"#, addr(&m, 3)),
    )?;
    check_eq(s, 201, "POST b3")?;
    let first = get(&m, "/api/8/nginx")?;
    m.reload(&conf(""))?;
    let n = get(&m, "/api/8/nginx")?;
    check_eq(
        n["generation"].as_u64(),
        Some(1),
        "generation after a reload",
    )?;
    check(
        n["load_timestamp"].as_str() > first["load_timestamp"].as_str(),
        || format!("load_timestamp did not move: {first} then {n}"),
    )?;
    let ids: Vec<u64> = ids(&m)?
        .values()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    check_eq(ids, vec![0, 1], "the configured servers of the new zone")?;
    let p: &Value = &get(&m, "/api/8/http/upstreams/app")?["peers"][0];
    check_eq(p["id"].as_u64(), Some(0), "b1's id in the new zone")?;
    Ok(())
}

pub fn trials() -> Vec<Case> {
    vec![
        Case::test(
            "plus_writes_change_traffic_of_both_workers",
            case_writes_change_traffic_of_both_workers,
        ),
        Case::test(
            "plus_refused_writes_change_nothing",
            case_refused_writes_change_nothing,
        ),
        Case::test(
            "plus_concurrent_writers_lose_no_server",
            case_concurrent_writers_lose_no_server,
        ),
        Case::test(
            "plus_reload_starts_a_new_zone",
            case_reload_starts_a_new_zone,
        ),
    ]
}
