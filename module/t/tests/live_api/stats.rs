//! Per-server ids and statistics of live upstreams (issue 24): `GET /api/NAME` shows `"id"` and
//! `"stats"` for every server. Ids are given when a server enters the set, kept across `PUT`s
//! that keep it and never given twice in the zone.

use std::collections::BTreeSet;

use ngx_harness::{check, check_eq, CaseResult, Failed, Trial};

use super::helpers::*;
use super::master::Master;

/// Backends on `{P1}`…`{P3}` answering by path: `/ok` 200, `/nf` 404, `/err` 500, `/redir` 302,
/// `/big` 200 with a 1000-byte body, `/slow` 200 after 300 ms (`echo`-free: `return` and a
/// proxied sleep are not available, so `/slow` is a `limit_rate`d body).
fn by_path_backend(i: usize) -> String {
    format!(
        "server {{ listen 127.0.0.1:{{P{i}}};\n\
         location = /ok {{ return 200 \"ok{i}\\n\"; }}\n\
         location = /nf {{ return 404; }}\n\
         location = /err {{ return 500; }}\n\
         location = /redir {{ return 302 /ok; }}\n\
         }}\n"
    )
}

/// `app` (round robin) with `servers` of the backends; the front proxies `/` to it without
/// retries (so every request is one try), and `/api/` is the API.
fn conf(servers: &[usize], upstream_extra: &str) -> String {
    let list: String = servers
        .iter()
        .map(|i| format!("server 127.0.0.1:{{P{i}}};"))
        .collect();
    format!(
        "upstream app {{ zone app 1m; {list} {upstream_extra} }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass http://app; proxy_next_upstream off; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n{}",
        (1..=3).map(by_path_backend).collect::<String>()
    )
}

/// `(address, id)` of the servers of `GET /api/app`.
fn ids(m: &Master) -> Result<Vec<(String, u64)>, Failed> {
    let v = m.get_json("/app")?;
    let servers = v["servers"].as_array().ok_or("no servers")?;
    servers
        .iter()
        .map(|s| {
            let a = s["address"].as_str().ok_or("no address")?.to_string();
            let id = s["id"]
                .as_u64()
                .ok_or_else(|| format!("server {a} has no id: {s}"))?;
            Ok((a, id))
        })
        .collect()
}

fn id_of(all: &[(String, u64)], address: &str) -> Result<u64, Failed> {
    all.iter()
        .find(|(a, _)| a == address)
        .map(|(_, id)| *id)
        .ok_or_else(|| format!("{address} not in {all:?}").into())
}

fn case_ids_are_kept_and_never_reused() -> CaseResult {
    let m = Master::start(&conf(&[1, 2], ""))?;
    let (a1, a2, a3) = (addr(&m, 1), addr(&m, 2), addr(&m, 3));
    let first = ids(&m)?;
    // The configured servers are the zone's first: 0 and 1.
    check_eq(
        first.clone(),
        vec![(a1.clone(), 0), (a2.clone(), 1)],
        "ids at start",
    )?;
    // Keep 1, drop 2, add 3.
    let r = m.put("app", &set_body(&m, &[1, 3], &[]))?;
    check_eq(r.status, 200, &format!("PUT 1,3: {}", r.text()))?;
    let second = ids(&m)?;
    check_eq(id_of(&second, &a1)?, 0, "id of the kept server")?;
    let id3 = id_of(&second, &a3)?;
    check(id3 >= 2, || format!("new server got id {id3}, used before"))?;
    // 2 comes back: a new id, not its old one.
    let r = m.put("app", &set_body(&m, &[1, 2, 3], &[]))?;
    check_eq(r.status, 200, &format!("PUT 1,2,3: {}", r.text()))?;
    let third = ids(&m)?;
    check_eq(id_of(&third, &a1)?, 0, "id of the kept server")?;
    check_eq(id_of(&third, &a3)?, id3, "id of server 3 kept")?;
    let id2 = id_of(&third, &a2)?;
    check(id2 != 1 && id2 != 0 && id2 != id3, || {
        format!("re-added server got id {id2}: ids seen {first:?} {second:?}")
    })?;
    // A server that moves to the backup list is a new peer: it gets a new id too, and all ids
    // of the set differ.
    let r = m.put("app", &set_body(&m, &[1, 2], &[3]))?;
    check_eq(r.status, 200, &format!("PUT 1,2 + backup 3: {}", r.text()))?;
    let fourth = ids(&m)?;
    let unique: BTreeSet<u64> = fourth.iter().map(|(_, id)| *id).collect();
    check_eq(unique.len(), fourth.len(), "ids are unique in the set")?;
    check(id_of(&fourth, &a3)? > id2, || {
        format!("server 3 moved to backup kept an old id: {fourth:?}")
    })?;
    // The GET answer with ids (and stats) is still a valid PUT body.
    let body = m.api("GET", "/app", "")?.text();
    let r = m.put("app", &body)?;
    check_eq(
        r.status,
        200,
        &format!("PUT of the GET answer: {}", r.text()),
    )?;
    check_eq(ids(&m)?, fourth, "ids after PUT of the GET answer")?;
    m.check_workers_unchanged()
}

pub fn trials() -> Vec<Trial> {
    vec![Trial::test(
        "stats_ids_are_kept_and_never_reused",
        case_ids_are_kept_and_never_reused,
    )]
}
