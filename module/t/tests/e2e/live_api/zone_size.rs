//! Cases for the size of the zone: a `PUT` the zone has no room for answers 507 with the size
//! the zone needs (text and fields), counting the TLS session nginx keeps per server in the same
//! zone (`proxy_ssl_session_reuse`, the default for `https` upstreams), and a zone of that size
//! takes the same change.

use std::path::PathBuf;
use std::process::Command;

use crate::case::Case;
use ngx_harness::{check, check_eq, CaseResult, Failed};

use super::helpers::*;
use super::master::{temp_dir, Master};

/// Servers in each of the two sets.
const SET: usize = 20;

/// A temporary directory with a self-signed certificate and key (`openssl req`), removed on drop.
struct Cert {
    dir: PathBuf,
}

impl Cert {
    fn make() -> Result<Cert, Failed> {
        let dir = temp_dir()?;
        let cert = Cert { dir };
        let out = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=localhost", "-keyout"])
            .arg(cert.key())
            .arg("-out")
            .arg(cert.crt())
            .output()
            .map_err(|e| format!("openssl req: {e} (install openssl)"))?;
        check(out.status.success(), || {
            format!(
                "openssl req failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok(cert)
    }

    fn crt(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Upstream `tls` (`zone tls SIZE`) with the servers on `first`, proxied over TLS with session
/// reuse; TLS backends of the same nginx on every port of `all`.
fn tls_conf(zone: &str, first: &[u16], all: &[u16], cert: &Cert) -> String {
    let servers: String = first
        .iter()
        .map(|p| format!("server 127.0.0.1:{p};"))
        .collect();
    let listens: String = all
        .iter()
        .map(|p| format!("listen 127.0.0.1:{p} ssl;\n"))
        .collect();
    format!(
        "upstream tls {{ zone tls {zone}; {servers} }}\n\
         server {{ listen 127.0.0.1:{{P0}} reuseport;\n\
         add_header X-Worker $pid always;\n\
         location / {{ proxy_pass https://tls; proxy_ssl_session_reuse on; }}\n\
         location /api/ {{ allow 127.0.0.1; deny all; upstreams_api write=on; }}\n\
         }}\n\
         server {{ {listens} ssl_certificate {}; ssl_certificate_key {};\n\
         location / {{ return 200 \"tls\\n\"; }} }}\n",
        cert.crt().display(),
        cert.key().display()
    )
}

fn body(ports: &[u16]) -> String {
    let s: Vec<String> = ports
        .iter()
        .map(|p| format!(r#"{{"address":"127.0.0.1:{p}"}}"#))
        .collect();
    format!(r#"{{"servers":[{}]}}"#, s.join(","))
}

/// Requests through the front until every server of the set was used over TLS (round robin:
/// three rounds).
fn request_each(m: &Master) -> CaseResult {
    for n in 0..3 * SET {
        let (_, text) = m.front()?;
        check_eq(text.as_str(), "tls", &format!("request {n} through TLS"))?;
    }
    Ok(())
}

/// `(pages_free, chunks_used, zone_bytes)` of the `tls` zone.
fn figures(m: &Master) -> Result<(u64, u64, u64), Failed> {
    let s = m.get_json("/tls?slab")?;
    Ok((
        s["pages_free"].as_u64().ok_or("no pages_free")?,
        s["chunks_used"].as_u64().ok_or("no chunks_used")?,
        // (0 when missing: checked against the 507's figure below)
        s["zone_bytes"].as_u64().unwrap_or(0),
    ))
}

fn case_full_zone_names_the_size_a_tls_set_needs() -> CaseResult {
    let cert = Cert::make()?;
    let ports = ngx_harness::free_ports(2 * SET);
    check_eq(ports.len(), 2 * SET, "free ports")?;
    let (first, second) = ports.split_at(SET);
    let mut m = Master::start(&tls_conf("64k", first, &ports, &cert))?;
    // A set that does not fit: nginx's slab allocator logs `[crit] ngx_slab_alloc() failed: no
    // memory` before the API answers 507.
    m.expect_log("ngx_slab_alloc() failed: no memory in upstream zone \"tls\"");
    let before = figures(&m)?;
    request_each(&m)?;
    let after = figures(&m)?;
    eprintln!(
        "zone 64k, {SET} TLS servers: slab (pages_free, chunks_used, zone_bytes) before requests {before:?}, after {after:?}"
    );
    let r = m.put("tls", &body(second))?;
    eprintln!("PUT of a disjoint set of {SET}: {} {}", r.status, r.text());
    if r.status == 200 {
        // It fits: nothing to name.
        return m.check_workers_unchanged();
    }
    check_eq(r.status, 507, &format!("PUT status ({})", r.text()))?;
    let v = json(&r)?;
    let needed = v["needed_bytes"]
        .as_u64()
        .ok_or_else(|| format!("507 without needed_bytes: {}", r.text()))?;
    let zone = v["zone_bytes"].as_u64().ok_or("no zone_bytes")?;
    check_eq(zone, after.2, "zone_bytes of the 507 and of ?slab")?;
    check(needed > zone, || {
        format!("needed {needed} not above the zone's {zone}")
    })?;
    let text = v["error"].as_str().unwrap_or("");
    let want = format!(
        "zone \"tls\" too small: about {needed} bytes needed for this set (zone is {zone})"
    );
    check(text.starts_with(&want), || {
        format!("{text:?} does not start with {want:?}")
    })?;
    check(v["tls_session_bytes"].as_u64().unwrap_or(0) > 0, || {
        format!("the estimate counts no TLS session: {}", r.text())
    })?;
    check_eq(
        v["servers_added"].as_u64(),
        Some(SET as u64),
        "servers_added",
    )?;
    check_eq(
        addresses(&m.get_json("/tls")?).len(),
        SET,
        "servers after the 507",
    )?;

    // A zone of the size named takes the same change, sessions stored.
    let k = needed.div_ceil(1024);
    m.reload(&tls_conf(&format!("{k}k"), first, &ports, &cert))?;
    let fresh = figures(&m)?;
    request_each(&m)?;
    let grown = figures(&m)?;
    eprintln!(
        "zone {k}k, {SET} TLS servers: slab before requests {fresh:?}, after {grown:?}: {} bytes of sessions per server",
        fresh.0.saturating_sub(grown.0) * 4096 / SET as u64
    );
    let r = m.put("tls", &body(second))?;
    eprintln!("zone {k}k: PUT {} {}", r.status, r.text());
    check_eq(
        r.status,
        200,
        &format!("PUT into a zone of {k}k ({})", r.text()),
    )?;
    request_each(&m)?;
    // nginx itself logs a [crit] line for each session it could not store in the full zone.
    m.check_workers_unchanged()
}

/// Servers a `PUT` adds to measure the zone bytes of a plain (no TLS) server.
const PLAIN: usize = 400;

/// `{"servers":[...]}` with `10.9.H.L:80` for `0..n`.
fn plain_body(n: usize) -> String {
    let s: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"address":"10.9.{}.{}:80"}}"#, i / 250, i % 250 + 1))
        .collect();
    format!(r#"{{"servers":[{}]}}"#, s.join(","))
}

/// `(pages_free, page_size)` of the zone of `name`.
fn pages(m: &Master, name: &str) -> Result<(u64, u64), Failed> {
    let s = m.get_json(&format!("/{name}?slab"))?;
    Ok((
        s["pages_free"].as_u64().ok_or("no pages_free")?,
        s["page_size"].as_u64().ok_or("no page_size")?,
    ))
}

/// The zone bytes a plain server takes in this nginx, measured (pages a `PUT` of 400 servers
/// took), are at most what the 507 estimate counts per server (the per-version table
/// of `docs/live-api.md`).
fn case_plain_servers_take_at_most_the_bytes_the_estimate_counts() -> CaseResult {
    let conf = format!(
        "upstream big {{ zone big 1m; server 127.0.0.1:{{P1}}; }}\n\
         upstream small {{ zone small 32k; server 127.0.0.1:{{P1}}; }}\n{}",
        front("big", "")
    );
    let m = Master::start(&conf)?;
    let r = m.put("small", &plain_body(PLAIN))?;
    check_eq(
        r.status,
        507,
        &format!("PUT of {PLAIN} into 32k ({})", r.text()),
    )?;
    let v = json(&r)?;
    let estimate = v["per_server_bytes"]
        .as_u64()
        .ok_or("no per_server_bytes")?;
    check_eq(
        v["tls_session_bytes"].as_u64(),
        Some(0),
        "TLS session counted",
    )?;
    let (free0, page) = pages(&m, "big")?;
    let r = m.put("big", &plain_body(PLAIN))?;
    check_eq(
        r.status,
        200,
        &format!("PUT of {PLAIN} into 1m ({})", r.text()),
    )?;
    let (free1, _) = pages(&m, "big")?;
    // The configured server retired and freed in the same PUT (no connection): its chunks are
    // back, so the pages taken are the new servers'.
    let measured = free0.saturating_sub(free1) * page / PLAIN as u64;
    eprintln!(
        "{PLAIN} plain servers took {} pages of {page} bytes: {measured} bytes per server measured, {estimate} estimated",
        free0.saturating_sub(free1)
    );
    check(measured > 0 && measured <= estimate, || {
        format!("measured {measured} bytes per server, estimate {estimate}")
    })?;
    m.check_workers_unchanged()
}

pub fn trials() -> Vec<Case> {
    vec![
        Case::test(
            "full_zone_names_the_size_a_tls_set_needs",
            case_full_zone_names_the_size_a_tls_set_needs,
        ),
        Case::test(
            "plain_servers_take_at_most_the_bytes_the_estimate_counts",
            case_plain_servers_take_at_most_the_bytes_the_estimate_counts,
        ),
    ]
}
