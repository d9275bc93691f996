//! The `static` discovery plugin: provider `static` answers the servers written in its config.
//!
//! Config: `targets` (required): `address:port[:weight]` entries separated by commas or spaces,
//! IPv6 in brackets (`[2001:db8::1]:443:5`); `services` (optional): the services this list answers,
//! any service when empty; `ttl_seconds` (optional number, default 0).
//! Addresses are passed on as written: validating them is the daemon's job.

use std::process::ExitCode;

use serde_json::Value;
use tributary_plugin_sdk::{
    parse_port, split_target, target, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError,
};

struct Static;

impl Plugin for Static {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        resolve(&params)
    }
}

fn resolve(params: &ResolveParams) -> Result<ResolveResult, RpcError> {
    let c = &params.config;
    let targets = parse_targets(c.required_str("targets")?)?;
    if let Some(services) = c.optional_str("services")? {
        if !split(services).any(|s| s == params.service) {
            return Err(RpcError::config(
                "service",
                format!("unknown service {:?}: not in `services`", params.service),
            ));
        }
    }
    let ttl = match c.number("ttl_seconds")? {
        None => 0,
        Some(t) if t >= 0.0 && t.fract() == 0.0 && t <= u32::MAX as f64 => t as u64,
        Some(_) => {
            return Err(RpcError::config(
                "ttl_seconds",
                "ttl_seconds must be a whole number of seconds, 0 or more",
            ))
        }
    };
    Ok(ResolveResult {
        targets,
        ttl_seconds: ttl,
    })
}

fn split(list: &str) -> impl Iterator<Item = &str> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
}

/// Parses the `targets` field. Errors name the entry by position, never by its text (every config
/// value is secret).
fn parse_targets(list: &str) -> Result<Vec<Value>, RpcError> {
    split(list)
        .enumerate()
        .map(|(i, entry)| {
            parse_entry(entry).map_err(|why| {
                RpcError::config("targets", format!("targets entry {}: {why}", i + 1))
            })
        })
        .collect()
}

fn parse_entry(entry: &str) -> Result<Value, &'static str> {
    let t = split_target(entry)?;
    if t.address.is_empty() {
        return Err("empty address");
    }
    let port = parse_port(t.port)?;
    let weight = match t.weight {
        None => None,
        Some(w) => Some(
            w.parse::<u16>()
                .ok()
                .filter(|w| (1..=1000).contains(w))
                .ok_or("weight must be a number from 1 to 1000")?,
        ),
    };
    Ok(target(t.address, port, weight))
}

fn main() -> ExitCode {
    tributary_plugin_sdk::run(Static)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tributary_plugin_sdk::ConfigMap;

    #[test]
    fn parses_entries() {
        let t =
            parse_targets("10.0.0.1:80, 10.0.0.2:8080:5 [2001:db8::1]:443:7,,[::1]:1 web.local:81")
                .unwrap();
        assert_eq!(
            t,
            vec![
                json!({"address":"10.0.0.1","port":80}),
                json!({"address":"10.0.0.2","port":8080,"weight":5}),
                json!({"address":"2001:db8::1","port":443,"weight":7}),
                json!({"address":"::1","port":1}),
                json!({"address":"web.local","port":81}),
            ]
        );
        assert_eq!(parse_targets(" , ").unwrap(), Vec::<Value>::new());
    }

    #[test]
    fn bad_entries_are_config_errors_naming_the_position_not_the_text() {
        for (list, why) in [
            ("10.0.0.1", "expected address:port"),
            ("10.0.0.1:0", "port must be"),
            ("10.0.0.1:65536", "port must be"),
            ("10.0.0.1:http", "port must be"),
            ("10.0.0.1:80:0", "weight must be"),
            ("10.0.0.1:80:1001", "weight must be"),
            ("2001:db8::1:80", "too many `:`"),
            ("[2001:db8::1:80", "without `]`"),
            ("[2001:db8::1]80", "must follow"),
            (":80", "empty address"),
        ] {
            let e = parse_targets(&format!("10.9.9.9:1 {list}")).unwrap_err();
            assert_eq!(e.code, tributary_plugin_sdk::ERR_CONFIG);
            assert_eq!(e.field(), Some("targets"));
            assert!(
                e.message.starts_with("targets entry 2: "),
                "{list}: {}",
                e.message
            );
            assert!(e.message.contains(why), "{list}: {}", e.message);
            assert!(!e.message.contains(list), "{list} quoted in {}", e.message);
        }
    }

    fn params(config: Value, service: &str) -> ResolveParams {
        ResolveParams {
            provider: "static".into(),
            config: serde_json::from_value::<ConfigMap>(config).unwrap(),
            service: service.into(),
        }
    }

    #[test]
    fn services_and_ttl() {
        let r = resolve(&params(
            json!({"targets":"1.2.3.4:80","ttl_seconds":15}),
            "any",
        ))
        .unwrap();
        assert_eq!(r.ttl_seconds, 15);
        let p = params(json!({"targets":"1.2.3.4:80","services":"api, web"}), "web");
        assert!(resolve(&p).is_ok());
        let e = resolve(&params(
            json!({"targets":"1.2.3.4:80","services":"api"}),
            "db",
        ))
        .unwrap_err();
        assert_eq!(e.field(), Some("service"));
        let e = resolve(&params(
            json!({"targets":"1.2.3.4:80","ttl_seconds":-1}),
            "x",
        ))
        .unwrap_err();
        assert_eq!(e.field(), Some("ttl_seconds"));
        let e = resolve(&params(json!({}), "x")).unwrap_err();
        assert_eq!(e.field(), Some("targets"));
    }

    #[test]
    fn own_manifest_is_valid() {
        let m = tributary_plugin_sdk::Manifest::parse(include_str!("../plugin.json")).unwrap();
        assert_eq!(m.name, "static");
        assert!(
            m.provider("static")
                .unwrap()
                .field("targets")
                .unwrap()
                .required
        );
    }
}
