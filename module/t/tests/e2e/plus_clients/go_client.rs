//! Debian's nginx-plus-go-client 0.10.0 (through `module/t/plus-go`) against nginx with the
//! module: it reads the upstreams and every statistic the exporter reads, and its writes
//! (`AddHTTPServer`, `UpdateHTTPServers`, `DeleteHTTPServer`) change where traffic goes in both
//! workers without new workers; two clients merging their servers at once lose none.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;

use ngx_harness::{check, check_eq, http_request, Completion, Failed};
use serde_json::Value;

use super::helpers::addr;
use super::master::Master;
use super::tools::{conf, go_client, go_client_raw, go_command, require};

/// `(major, minor, patch)` text of `nginx -v`.
fn nginx_version_text() -> Result<String, Failed> {
    let out = std::process::Command::new(ngx_harness::nginx_bin())
        .arg("-v")
        .output()
        .map_err(|e| format!("nginx -v: {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    Ok(text
        .split("nginx/")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| format!("nginx -v said {text:?}"))?
        .to_string())
}

/// The `(ID, Server)` pairs of one upstream in the client's `Upstreams` map.
fn peers(ups: &Value, name: &str) -> Result<Vec<(u64, String)>, Failed> {
    let p = ups[name]["Peers"]
        .as_array()
        .ok_or_else(|| format!("the client saw no upstream {name:?} (or no Peers): {ups}"))?;
    p.iter()
        .map(|p| {
            Ok((
                p["ID"].as_u64().ok_or("peer without ID")?,
                p["Server"]
                    .as_str()
                    .ok_or("peer without Server")?
                    .to_string(),
            ))
        })
        .collect()
}

fn servers_of(ups: &Value, name: &str) -> Result<BTreeSet<String>, Failed> {
    Ok(peers(ups, name)?.into_iter().map(|(_, s)| s).collect())
}

/// `(ID, server)` of the client's `GetHTTPServers`.
fn http_servers(m: &Master, upstream: &str) -> Result<BTreeMap<String, u64>, Failed> {
    let v = go_client(m.port(0), "servers", &[upstream])?;
    v.as_array()
        .ok_or_else(|| format!("servers: not an array: {v}"))?
        .iter()
        .map(|s| {
            Ok((
                s["server"]
                    .as_str()
                    .ok_or("server without address")?
                    .to_string(),
                s["id"].as_u64().unwrap_or(0),
            ))
        })
        .collect()
}

/// Front requests on new connections until every backend of `want` answered and both workers
/// answered; every answer must be a 200 from a backend in `want`. Returns the answers counted
/// per backend.
pub fn traffic_goes_to(
    m: &Master,
    want: &[&str],
    what: &str,
) -> Result<BTreeMap<String, usize>, Failed> {
    let mut by_backend: BTreeMap<String, usize> = BTreeMap::new();
    let mut workers = BTreeSet::new();
    for n in 0..400 {
        let r = http_request(m.port(0), "GET", "/", &[], b"")?;
        let b = r.header("X-Backend").unwrap_or("-").to_string();
        check(r.status == 200 && want.contains(&b.as_str()), || {
            format!(
                "{what}: request {n} answered {} by {b:?} (worker {:?}); only {want:?} may answer",
                r.status,
                r.header("X-Worker")
            )
        })?;
        workers.insert(r.header("X-Worker").unwrap_or("").to_string());
        *by_backend.entry(b).or_default() += 1;
        if workers.len() >= 2 && want.iter().all(|w| by_backend.contains_key(*w)) && n >= 20 {
            return Ok(by_backend);
        }
    }
    Err(format!(
        "{what}: in 400 requests not every one of {want:?} answered in both workers: {by_backend:?}, workers {workers:?}"
    )
    .into())
}

/// (a) `GetUpstreams` and `GetStats` succeed and report the configured servers, each with its
/// own id, `up`; `GetStats`'s nginx is this nginx (version, master and worker PIDs).
pub fn case_reads_upstreams_and_stats() -> Result<Completion, Failed> {
    if let Some(skip) = require(&["go"])? {
        return Ok(skip);
    }
    let m = Master::start(&conf(
        "upstream app { zone app 1m; server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; }\n\
         upstream quiet { zone quiet 64k; server 127.0.0.1:{P3}; }",
    ))?;
    let ups = go_client(m.port(0), "upstreams", &[])?;
    let names: BTreeSet<&str> = ups
        .as_object()
        .ok_or_else(|| format!("GetUpstreams: not a map: {ups}"))?
        .keys()
        .map(String::as_str)
        .collect();
    check_eq(names, ["app", "quiet"].into(), "upstreams the client saw")?;
    check_eq(
        servers_of(&ups, "app")?,
        [addr(&m, 1), addr(&m, 2)].into(),
        "app's servers",
    )?;
    check_eq(
        servers_of(&ups, "quiet")?,
        [addr(&m, 3)].into(),
        "quiet's servers",
    )?;
    let ids: BTreeSet<u64> = peers(&ups, "app")?.into_iter().map(|(i, _)| i).collect();
    check_eq(ids.len(), 2, "app's servers have distinct ids")?;
    for (name, zone) in [("app", "app"), ("quiet", "quiet")] {
        check_eq(
            ups[name]["Zone"].as_str(),
            Some(zone),
            &format!("{name}'s Zone"),
        )?;
        for p in ups[name]["Peers"].as_array().into_iter().flatten() {
            check_eq(p["State"].as_str(), Some("up"), &format!("{name}: {p}"))?;
            check_eq(p["Weight"].as_u64(), Some(1), &format!("{name}: {p}"))?;
            check_eq(p["Backup"].as_bool(), Some(false), &format!("{name}: {p}"))?;
        }
    }
    // GetHTTPServers gives the same ids (the ids are what its writes address).
    let by_server = http_servers(&m, "app")?;
    let from_peers: BTreeMap<String, u64> = peers(&ups, "app")?
        .into_iter()
        .map(|(i, s)| (s, i))
        .collect();
    check_eq(
        by_server,
        from_peers,
        "GetHTTPServers ids = GetUpstreams ids",
    )?;

    let stats = go_client(m.port(0), "stats", &[])?;
    let info = &stats["NginxInfo"];
    check_eq(
        info["Version"].as_str().map(str::to_string),
        Some(nginx_version_text()?),
        "GetStats: nginx version",
    )?;
    check_eq(
        info["ppid"].as_u64(),
        Some(u64::from(m.master_pid())),
        &format!("GetStats: ppid is the master ({info})"),
    )?;
    let pid = info["pid"].as_u64().unwrap_or(0) as u32;
    check(m.workers().contains(&pid), || {
        format!("GetStats: pid {pid} is not a worker of {:?}", m.workers())
    })?;
    check_eq(
        servers_of(&stats["Upstreams"], "app")?,
        [addr(&m, 1), addr(&m, 2)].into(),
        "GetStats: app's servers",
    )?;
    check(stats["Slabs"]["app"].is_object(), || {
        format!("GetStats: no slab of zone app: {}", stats["Slabs"])
    })?;
    check(
        stats["Connections"]["Accepted"].as_u64().unwrap_or(0) >= 1,
        || format!("GetStats: connections {}", stats["Connections"]),
    )?;
    // An upstream the module does not have: Plus's 404 error object, which the client reads.
    let out = go_client_raw(m.port(0), "servers", &["nosuch"])?;
    let err = String::from_utf8_lossy(&out.stderr);
    check(
        !out.status.success()
            && err.contains("error.status=404")
            && err.contains("error.code=UpstreamNotFound"),
        || {
            format!(
                "servers nosuch: want the client's 404 UpstreamNotFound error, got {}: {err}",
                out.status
            )
        },
    )?;
    m.check_workers_unchanged()?;
    Ok(Completion::Completed)
}

fn diff_servers(v: &Value, key: &str) -> BTreeSet<String> {
    v[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["server"].as_str().map(str::to_string))
        .collect()
}

/// (b) `AddHTTPServer`, `UpdateHTTPServers` (an add, a delete and an update in one diff, then a
/// weight change) and `DeleteHTTPServer`: after each call returns, every request in both workers
/// goes where the change says, the workers are the same processes, and a server that stays keeps
/// its id.
pub fn case_writes_are_followed_by_traffic() -> Result<Completion, Failed> {
    if let Some(skip) = require(&["go"])? {
        return Ok(skip);
    }
    let m = Master::start(&conf(
        "upstream app { zone app 1m; server 127.0.0.1:{P1}; }",
    ))?;
    let port = m.port(0);
    let (b1, b2, b3, b4) = (addr(&m, 1), addr(&m, 2), addr(&m, 3), addr(&m, 4));
    traffic_goes_to(&m, &["b1"], "configured")?;

    go_client(port, "add", &["app", &b2])?;
    traffic_goes_to(&m, &["b1", "b2"], "after AddHTTPServer b2")?;
    m.check_workers_unchanged()?;
    let ids = http_servers(&m, "app")?;
    check_eq(ids.len(), 2, "servers after the add")?;
    check(ids[&b1] != ids[&b2], || {
        format!("b1 and b2 share an id: {ids:?}")
    })?;

    // One diff: b3 and b4 added, b1 deleted, b2 updated (down).
    let down_b2 = format!(r#"{{"server":"{b2}","down":true}}"#);
    let d = go_client(port, "update", &["app", &down_b2, &b3, &b4])?;
    check_eq(
        diff_servers(&d, "added"),
        [b3.clone(), b4.clone()].into(),
        "UpdateHTTPServers added",
    )?;
    check_eq(
        diff_servers(&d, "deleted"),
        [b1.clone()].into(),
        "UpdateHTTPServers deleted",
    )?;
    check_eq(
        diff_servers(&d, "updated"),
        [b2.clone()].into(),
        "UpdateHTTPServers updated",
    )?;
    traffic_goes_to(
        &m,
        &["b3", "b4"],
        "after UpdateHTTPServers (+b3 +b4 -b1 b2 down)",
    )?;
    m.check_workers_unchanged()?;
    let after = http_servers(&m, "app")?;
    check_eq(
        after.get(&b2),
        ids.get(&b2),
        "b2 keeps its id through the update",
    )?;
    check(!after.contains_key(&b1), || {
        format!("b1 still listed: {after:?}")
    })?;
    let used: BTreeSet<u64> = after.values().copied().collect();
    check_eq(used.len(), 3, &format!("distinct ids: {after:?}"))?;
    check(!used.contains(&ids[&b1]), || {
        format!("b1's id {} was reused: {after:?}", ids[&b1])
    })?;

    // An update only: b2 up again, b3 weight 3 (round robin: b3 three times as often).
    let up_b2 = format!(r#"{{"server":"{b2}","down":false}}"#);
    let heavy_b3 = format!(r#"{{"server":"{b3}","weight":3}}"#);
    let d = go_client(port, "update", &["app", &up_b2, &heavy_b3, &b4])?;
    check_eq(
        diff_servers(&d, "added"),
        BTreeSet::new(),
        "second update added",
    )?;
    check_eq(
        diff_servers(&d, "deleted"),
        BTreeSet::new(),
        "second update deleted",
    )?;
    check_eq(
        diff_servers(&d, "updated"),
        [b2.clone(), b3.clone()].into(),
        "second update updated",
    )?;
    traffic_goes_to(
        &m,
        &["b2", "b3", "b4"],
        "after UpdateHTTPServers (b2 up, b3 weight 3)",
    )?;
    // The weights, from 100 sequential requests (the zone's round robin is shared by the
    // workers: 1:3:1 gives 20/60/20; a few either way for the requests of the check above).
    let mut n: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..100 {
        let r = http_request(port, "GET", "/", &[], b"")?;
        *n.entry(r.header("X-Backend").unwrap_or("-").to_string())
            .or_default() += 1;
    }
    let b3n = n.get("b3").copied().unwrap_or(0);
    check((55..=65).contains(&b3n), || {
        format!("weight 3 of 5: b3 got {b3n} of 100: {n:?}")
    })?;
    m.check_workers_unchanged()?;

    go_client(port, "delete", &["app", &b3])?;
    traffic_goes_to(&m, &["b2", "b4"], "after DeleteHTTPServer b3")?;
    m.check_workers_unchanged()?;
    check_eq(
        http_servers(&m, "app")?
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>(),
        [b2, b4].into(),
        "servers at the end",
    )?;
    Ok(Completion::Completed)
}

/// How many addresses each of the two clients merges in, and from how many goroutines.
const GROW: usize = 60;
const GOROUTINES: &str = "8";

/// (c) Two clients at once (two processes), each merging its own 60 servers into `app` from 8
/// goroutines, one `UpdateHTTPServers` per server (the set just read plus the new one). The
/// clients read the set twice per call, so their diffs also delete each other's servers and add
/// some again, and calls fail and are retried when another writer was quicker: what counts is what
/// the API acknowledged, which `plus-go grow` records below the client from the HTTP exchanges
/// (every server a POST created, with its id from the 201 answer, and every id a DELETE removed).
/// Ids are never reused, so at the end the set must be exactly the configured server plus every
/// created id less every deleted one. A write the module lost (two read-modify-writes interleaved
/// in two workers) shows as a created id missing, or a deleted one back.
pub fn case_two_writers_lose_no_server() -> Result<Completion, Failed> {
    if let Some(skip) = require(&["go"])? {
        return Ok(skip);
    }
    let m = Master::start(&conf(
        "upstream app { zone app 1m; server 127.0.0.1:{P1}; }",
    ))?;
    let port = m.port(0);
    let mut want: BTreeMap<u64, String> = http_servers(&m, "app")?
        .into_iter()
        .map(|(a, i)| (i, a))
        .collect();
    // Addresses nothing serves (127.0.1.x, 127.0.2.x: loopback, distinct per client); no traffic
    // is sent here.
    let sets: Vec<Vec<String>> = (1..=2)
        .map(|w| {
            (1..=GROW)
                .map(|i| format!("127.0.{w}.{i}:{}", m.port(1)))
                .collect()
        })
        .collect();
    let children = sets
        .iter()
        .map(|s| {
            let args: Vec<&str> = ["app", GOROUTINES]
                .into_iter()
                .chain(s.iter().map(String::as_str))
                .collect();
            let mut c = go_command(port, "grow", &args)?;
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            Ok(c.spawn().map_err(|e| format!("start plus-go grow: {e}"))?)
        })
        .collect::<Result<Vec<_>, Failed>>()?;
    let (mut created, mut deleted, mut calls, mut retried) = (0, Vec::new(), 0, 0);
    // Every address created at least once (by its own client, or again by the other).
    let mut ever: BTreeSet<String> = BTreeSet::new();
    for (w, c) in children.into_iter().enumerate() {
        let out = c
            .wait_with_output()
            .map_err(|e| format!("wait plus-go: {e}"))?;
        check(out.status.success(), || {
            format!(
                "client {w} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let r: Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("client {w}: bad JSON: {e}"))?;
        for s in r["created"].as_array().into_iter().flatten() {
            let id = s["id"]
                .as_u64()
                .ok_or_else(|| format!("created without id: {s}"))?;
            let a = s["server"].as_str().unwrap_or_default().to_string();
            check(want.insert(id, a.clone()).is_none(), || {
                format!("id {id} created twice (for {a})")
            })?;
            ever.insert(a);
            created += 1;
        }
        deleted.extend(
            r["deleted_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_u64),
        );
        calls += r["calls"].as_u64().unwrap_or(0);
        retried += r["retried"].as_u64().unwrap_or(0);
        if r["retried"].as_u64().unwrap_or(0) > 0 {
            println!("client {w}: calls retried, e.g. {}", r["errors"]);
        }
    }
    check_eq(
        ever,
        sets.iter().flatten().cloned().collect(),
        "the servers the API created",
    )?;
    for id in &deleted {
        check(want.remove(id).is_some(), || {
            format!("id {id} deleted but never created (or deleted twice)")
        })?;
    }
    let have: BTreeMap<u64, String> = http_servers(&m, "app")?
        .into_iter()
        .map(|(a, i)| (i, a))
        .collect();
    let lost: Vec<_> = want.iter().filter(|(i, _)| !have.contains_key(i)).collect();
    let extra: Vec<_> = have.iter().filter(|(i, _)| !want.contains_key(i)).collect();
    check(lost.is_empty() && extra.is_empty() && want == have, || {
        format!(
            "lost servers (created, never deleted, not in the set) {lost:?}; servers in the set that were \
             deleted or never created {extra:?} ({created} created, {} deleted)",
            deleted.len()
        )
    })?;
    println!(
        "two clients: {calls} UpdateHTTPServers calls ({retried} retried), {created} servers created, {} deleted, {} in the set",
        deleted.len(),
        have.len()
    );
    m.check_workers_unchanged()?;
    Ok(Completion::Completed)
}
