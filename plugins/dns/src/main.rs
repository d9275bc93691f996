//! The `dns` discovery plugin: provider `dns` resolves a DNS name into servers.
//!
//! - `record_type` `SRV` (default): `service` is an SRV name such as `_http._tcp.api.example`. Only
//!   the lowest priority group is used; each SRV target is resolved to its addresses (from the
//!   answer's additional section, else with A and AAAA queries), each address becoming a target with
//!   the SRV port and the SRV weight scaled into 1–1000.
//! - `A`, `AAAA`, `A+AAAA`: the name's addresses, each with the configured `port`.
//!
//! `ttl_seconds` is the smallest TTL among the records used, so the engine refreshes when they
//! expire. The DNS exchange is the plugin's own (`client`: UDP with EDNS(0), TCP when truncated);
//! the message format is `hickory-proto`'s (`wire` reduces it to what the plugin reads).

mod client;
mod wire;

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use serde_json::{json, Value};
use tributary_plugin_sdk::{target, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError};
use wire::{Message, RData, Record, RCODE_NOERROR, RCODE_NXDOMAIN, TYPE_A, TYPE_AAAA, TYPE_SRV};

struct Dns;

impl Plugin for Dns {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        let cfg = Config::from_params(&params).await?;
        match cfg.kind {
            Kind::Srv => resolve_srv(cfg.server, &cfg.name).await,
            Kind::Addr { v4, v6, port } => resolve_addrs(cfg.server, &cfg.name, v4, v6, port).await,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Srv,
    Addr { v4: bool, v6: bool, port: u16 },
}

struct Config {
    server: SocketAddr,
    name: String,
    kind: Kind,
}

impl Config {
    async fn from_params(params: &ResolveParams) -> Result<Config, RpcError> {
        let c = &params.config;
        let record_type = c.optional_str("record_type")?.unwrap_or("SRV");
        let port = || -> Result<u16, RpcError> {
            match c.number("port")? {
                None => Err(RpcError::config(
                    "port",
                    "port is required for A/AAAA records (SRV records carry their own)",
                )),
                Some(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Ok(p as u16),
                Some(_) => Err(RpcError::config(
                    "port",
                    "port must be a whole number from 1 to 65535",
                )),
            }
        };
        let kind = match record_type.to_ascii_uppercase().as_str() {
            "SRV" => Kind::Srv,
            "A" => Kind::Addr {
                v4: true,
                v6: false,
                port: port()?,
            },
            "AAAA" => Kind::Addr {
                v4: false,
                v6: true,
                port: port()?,
            },
            "A+AAAA" | "AAAA+A" => Kind::Addr {
                v4: true,
                v6: true,
                port: port()?,
            },
            _ => {
                return Err(RpcError::config(
                    "record_type",
                    "record_type must be SRV, A, AAAA or A+AAAA",
                ))
            }
        };
        let name = params
            .service
            .trim()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if !wire::valid_name(&name) {
            return Err(RpcError::config(
                "service",
                "service must be a DNS name: labels of letters, digits, '-' or '_' separated by dots",
            ));
        }
        let server = match c.optional_str("nameserver")? {
            Some(ns) => parse_nameserver(ns).await?,
            None => system_nameserver()?,
        };
        Ok(Config { server, name, kind })
    }
}

/// `host[:port]`, `[v6]:port` or a bare IPv6 address; a host name is looked up with the system's
/// resolver. Errors name the field, never the value.
async fn parse_nameserver(text: &str) -> Result<SocketAddr, RpcError> {
    let bad = |why: &str| RpcError::config("nameserver", format!("nameserver {why}"));
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    if let Ok(sa) = text.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(bad("has a bad port (expected host:port, port 1-65535)"));
        }
        return Ok(sa);
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("has a bad port (expected host:port, port 1-65535)"))?,
        ),
        None => (text, 53),
    };
    if host.is_empty() || host.contains(['[', ']', ':', '/', ' ']) || !wire::valid_name(host) {
        return Err(bad("must be host:port, IP:port or [IPv6]:port"));
    }
    let mut addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| bad("host name cannot be resolved"))?;
    addrs.next().ok_or_else(|| bad("host name has no address"))
}

/// The first `nameserver` of /etc/resolv.conf.
fn system_nameserver() -> Result<SocketAddr, RpcError> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
        .ok_or_else(|| {
            RpcError::config(
                "nameserver",
                "no nameserver set and none found in /etc/resolv.conf",
            )
        })
}

/// Asks and checks the response code: NXDOMAIN is -32003 `service` for the service's own name,
/// other failures are -32000.
async fn ask(server: SocketAddr, name: &str, qtype: u16, own: bool) -> Result<Message, RpcError> {
    let m = client::query(server, name, qtype)
        .await
        .map_err(|e| RpcError::provider(e.to_string()))?;
    match m.rcode {
        RCODE_NOERROR => Ok(m),
        RCODE_NXDOMAIN if own => Err(RpcError::config(
            "service",
            format!("the DNS name {name:?} does not exist (NXDOMAIN)"),
        )),
        RCODE_NXDOMAIN => Err(RpcError::provider(format!(
            "the DNS name {name:?} does not exist (NXDOMAIN)"
        ))),
        code => Err(RpcError::provider(format!(
            "the nameserver answered {} for {name:?}",
            rcode_name(code)
        ))),
    }
}

fn rcode_name(code: u8) -> String {
    match code {
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        c => format!("rcode {c}"),
    }
}

/// The records of `section` answering `name` (following CNAMEs within the section), and the
/// smallest TTL of the records used (CNAMEs included).
fn follow<'m>(section: &'m [Record], name: &str) -> (Vec<&'m Record>, Option<u32>) {
    let mut names: HashSet<&str> = HashSet::from([name]);
    let mut ttl: Option<u32> = None;
    // CNAME chains are short; a few passes settle any order of records.
    for _ in 0..8 {
        let mut grew = false;
        for r in section {
            if let RData::Cname(to) = &r.data {
                if names.contains(r.name.as_str()) && names.insert(to.as_str()) {
                    ttl = Some(ttl.map_or(r.ttl, |t| t.min(r.ttl)));
                    grew = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    let found = section
        .iter()
        .filter(|r| names.contains(r.name.as_str()) && !matches!(r.data, RData::Cname(_)))
        .collect();
    (found, ttl)
}

fn min_ttl(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Addresses of `name` in `section` (A and/or AAAA), with the smallest TTL used.
fn addresses_in(section: &[Record], name: &str, v4: bool, v6: bool) -> Addrs {
    let (records, mut ttl) = follow(section, name);
    let mut out = Vec::new();
    for r in records {
        let ip = match r.data {
            RData::A(a) if v4 => IpAddr::V4(a),
            RData::Aaaa(a) if v6 => IpAddr::V6(a),
            _ => continue,
        };
        ttl = min_ttl(ttl, Some(r.ttl));
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    (out, ttl)
}

/// Addresses and the smallest TTL of the records that gave them.
type Addrs = (Vec<IpAddr>, Option<u32>);

/// Queries A and/or AAAA for `name` (concurrently).
async fn lookup_addrs(
    server: SocketAddr,
    name: &str,
    v4: bool,
    v6: bool,
    own: bool,
) -> Result<Addrs, RpcError> {
    let a = async {
        if v4 {
            ask(server, name, TYPE_A, own).await.map(Some)
        } else {
            Ok(None)
        }
    };
    let aaaa = async {
        if v6 {
            ask(server, name, TYPE_AAAA, own).await.map(Some)
        } else {
            Ok(None)
        }
    };
    let (a, aaaa) = tokio::join!(a, aaaa);
    let mut ips = Vec::new();
    let mut ttl = None;
    for m in [a?, aaaa?].into_iter().flatten() {
        let (found, t) = addresses_in(&m.answers, name, v4, v6);
        ttl = min_ttl(ttl, t);
        for ip in found {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
    }
    Ok((ips, ttl))
}

async fn resolve_addrs(
    server: SocketAddr,
    name: &str,
    v4: bool,
    v6: bool,
    port: u16,
) -> Result<ResolveResult, RpcError> {
    let (ips, ttl) = lookup_addrs(server, name, v4, v6, true).await?;
    Ok(ResolveResult {
        targets: ips
            .into_iter()
            .map(|ip| target(ip.to_string(), port, None))
            .collect(),
        ttl_seconds: ttl.unwrap_or(0) as u64,
    })
}

/// SRV weights (0–65535) into target weights (1–1000): kept as they are when the largest is at
/// most 1000 (0 becomes 1), else scaled so the largest is 1000, keeping their ratios (rounded,
/// at least 1).
fn scale_weights(weights: &[u16]) -> Vec<u16> {
    let max = weights.iter().copied().max().unwrap_or(0);
    weights
        .iter()
        .map(|&w| {
            if max <= 1000 {
                w.max(1)
            } else {
                ((w as u64 * 1000 + max as u64 / 2) / max as u64).max(1) as u16
            }
        })
        .collect()
}

struct Srv<'m> {
    weight: u16,
    port: u16,
    target: &'m str,
}

async fn resolve_srv(server: SocketAddr, name: &str) -> Result<ResolveResult, RpcError> {
    let m = ask(server, name, TYPE_SRV, true).await?;
    let (records, mut ttl) = follow(&m.answers, name);
    let mut srvs = Vec::new();
    for r in &records {
        if let RData::Srv {
            priority,
            weight,
            port,
            target,
        } = &r.data
        {
            ttl = min_ttl(ttl, Some(r.ttl));
            srvs.push((
                *priority,
                Srv {
                    weight: *weight,
                    port: *port,
                    target: target.as_str(),
                },
            ));
        }
    }
    // A target of "." says the service is decidedly not available here (RFC 2782).
    srvs.retain(|(_, s)| !s.target.is_empty() && s.port != 0);
    let Some(lowest) = srvs.iter().map(|(p, _)| *p).min() else {
        return Ok(ResolveResult {
            targets: Vec::new(),
            ttl_seconds: ttl.unwrap_or(0) as u64,
        });
    };
    let group: Vec<Srv> = srvs
        .into_iter()
        .filter(|(p, _)| *p == lowest)
        .map(|(_, s)| s)
        .collect();
    let weights = scale_weights(&group.iter().map(|s| s.weight).collect::<Vec<_>>());

    // Addresses of each distinct target: from the additional section, else asked for.
    let mut addrs: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    let mut missing = Vec::new();
    for s in &group {
        if addrs.contains_key(s.target) || missing.contains(&s.target) {
            continue;
        }
        let (ips, t) = addresses_in(&m.additionals, s.target, true, true);
        if ips.is_empty() {
            missing.push(s.target);
        } else {
            ttl = min_ttl(ttl, t);
            addrs.insert(s.target, ips);
        }
    }
    // Look the rest up concurrently (A and AAAA each).
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in missing.iter().enumerate() {
        let t = t.to_string();
        set.spawn(async move { (i, lookup_addrs(server, &t, true, true, false).await) });
    }
    let mut looked_up: Vec<Option<Result<Addrs, RpcError>>> =
        (0..missing.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, res)) = joined {
            looked_up[i] = Some(res);
        }
    }
    let mut unresolved = 0usize;
    for (t, res) in missing.iter().zip(looked_up) {
        match res.unwrap_or_else(|| Err(RpcError::provider("the lookup task failed"))) {
            Ok((ips, tt)) if !ips.is_empty() => {
                ttl = min_ttl(ttl, tt);
                addrs.insert(t, ips);
            }
            Ok(_) => unresolved += 1,
            Err(e) => {
                eprintln!("SRV target {t:?} skipped: {}", e.message);
                unresolved += 1;
            }
        }
    }
    let mut targets: Vec<Value> = Vec::new();
    for (s, w) in group.iter().zip(weights) {
        for ip in addrs.get(s.target).into_iter().flatten() {
            let mut t = target(ip.to_string(), s.port, Some(w));
            t["tags"] = json!([s.target]);
            targets.push(t);
        }
    }
    if targets.is_empty() {
        return Err(RpcError::provider(format!(
            "none of the {} SRV targets of the lowest priority group resolved to an address",
            unresolved
        )));
    }
    if unresolved > 0 {
        eprintln!("{unresolved} SRV target(s) without an address were left out");
    }
    Ok(ResolveResult {
        targets,
        ttl_seconds: ttl.unwrap_or(0) as u64,
    })
}

fn main() -> ExitCode {
    tributary_plugin_sdk::run(Dns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_scale_into_range() {
        assert_eq!(scale_weights(&[0, 1, 2, 1000]), vec![1, 1, 2, 1000]);
        assert_eq!(scale_weights(&[0, 0]), vec![1, 1]);
        assert_eq!(scale_weights(&[65535, 32768, 1, 0]), vec![1000, 500, 1, 1]);
        assert_eq!(scale_weights(&[3000, 1000, 1500]), vec![1000, 333, 500]);
    }

    fn rec(name: &str, ttl: u32, data: RData) -> Record {
        Record {
            name: name.into(),
            ttl,
            data,
        }
    }

    #[test]
    fn follows_cnames_and_takes_the_smallest_ttl() {
        let section = vec![
            rec("b.x", 30, RData::A("10.0.0.2".parse().unwrap())),
            rec("a.x", 50, RData::Cname("b.x".into())),
            rec("b.x", 40, RData::Aaaa("::2".parse().unwrap())),
            rec("c.x", 1, RData::A("10.0.0.3".parse().unwrap())),
            rec("b.x", 20, RData::A("10.0.0.2".parse().unwrap())),
        ];
        let (ips, ttl) = addresses_in(&section, "a.x", true, true);
        assert_eq!(
            ips,
            vec![
                "10.0.0.2".parse::<IpAddr>().unwrap(),
                "::2".parse().unwrap()
            ]
        );
        assert_eq!(ttl, Some(20));
        let (ips, ttl) = addresses_in(&section, "a.x", false, true);
        assert_eq!(ips, vec!["::2".parse::<IpAddr>().unwrap()]);
        assert_eq!(ttl, Some(40));
        assert_eq!(addresses_in(&section, "z.x", true, true), (vec![], None));
    }

    #[tokio::test]
    async fn nameserver_forms() {
        for (text, want) in [
            ("127.0.0.1", "127.0.0.1:53"),
            ("127.0.0.1:5353", "127.0.0.1:5353"),
            ("::1", "[::1]:53"),
            ("[::1]:5353", "[::1]:5353"),
            ("localhost:5300", "127.0.0.1:5300"),
        ] {
            let got = parse_nameserver(text).await.unwrap();
            if text.starts_with("localhost") {
                assert_eq!(got.port(), 5300);
                assert!(got.ip().is_loopback());
            } else {
                assert_eq!(got.to_string(), want, "{text}");
            }
        }
        for bad in [
            "127.0.0.1:0",
            "127.0.0.1:x",
            "a b:53",
            "http://x:53",
            "[::1:53",
            "",
        ] {
            let e = parse_nameserver(bad).await.unwrap_err();
            assert_eq!(e.field(), Some("nameserver"), "{bad}");
            if bad.len() >= 3 {
                assert!(!e.message.contains(bad), "{bad} quoted: {}", e.message);
            }
        }
    }

    #[tokio::test]
    async fn config_errors_name_their_field() {
        use tributary_plugin_sdk::ConfigMap;
        let p = |config: Value, service: &str| ResolveParams {
            provider: "dns".into(),
            config: serde_json::from_value::<ConfigMap>(config).unwrap(),
            service: service.into(),
        };
        for (config, service, field) in [
            (
                json!({"record_type":"MX","nameserver":"127.0.0.1"}),
                "a.x",
                "record_type",
            ),
            (
                json!({"record_type":"A","nameserver":"127.0.0.1"}),
                "a.x",
                "port",
            ),
            (
                json!({"record_type":"AAAA","port":0,"nameserver":"127.0.0.1"}),
                "a.x",
                "port",
            ),
            (
                json!({"record_type":"A","port":80.5,"nameserver":"127.0.0.1"}),
                "a.x",
                "port",
            ),
            (json!({"nameserver":"127.0.0.1"}), "not a name", "service"),
            (json!({"nameserver":"127.0.0.1"}), "", "service"),
            (json!({"nameserver":"127.0.0.1:99999"}), "a.x", "nameserver"),
        ] {
            let e = Config::from_params(&p(config.clone(), service))
                .await
                .err()
                .unwrap();
            assert_eq!(e.field(), Some(field), "{config} {service}: {}", e.message);
        }
        let c = Config::from_params(&p(
            json!({"record_type":"a+aaaa","port":8080,"nameserver":"127.0.0.1:53"}),
            "API.Example.",
        ))
        .await
        .unwrap();
        assert_eq!(c.name, "api.example");
        assert_eq!(
            c.kind,
            Kind::Addr {
                v4: true,
                v6: true,
                port: 8080
            }
        );
    }

    #[test]
    fn own_manifest_is_valid() {
        let m = tributary_plugin_sdk::Manifest::parse(include_str!("../plugin.json")).unwrap();
        assert_eq!(m.name, "dns");
        assert!(m.provider("dns").is_some());
    }
}
