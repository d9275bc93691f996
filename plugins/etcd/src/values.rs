//! What the keys hold: the gateway's range answer, each value read as one server or a list of
//! them, and the targets built from them.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{Map, Value};
use tributary_plugin_sdk::{
    parse_port, parse_weight, split_target, target, weight_value, ResolveResult, RpcError,
};

use crate::config::Config;

pub(crate) fn parse_range(v: &Value) -> Result<Vec<(String, Vec<u8>)>, String> {
    let Some(kvs) = v.get("kvs") else {
        return Ok(Vec::new());
    };
    let kvs = kvs.as_array().ok_or("etcd's kvs is not a list")?;
    kvs.iter()
        .map(|kv| {
            let key = kv
                .get("key")
                .and_then(Value::as_str)
                .and_then(|k| B64.decode(k).ok())
                .and_then(|k| String::from_utf8(k).ok())
                .ok_or("etcd answered a key that is not base64 UTF-8")?;
            let value = match kv.get("value").and_then(Value::as_str) {
                Some(v) => B64
                    .decode(v)
                    .map_err(|_| "etcd answered a value that is not base64")?,
                None => Vec::new(),
            };
            Ok((key, value))
        })
        .collect()
}

pub(crate) fn build(cfg: &Config, kvs: Vec<(String, Vec<u8>)>) -> Result<ResolveResult, RpcError> {
    let child_prefix = format!("{}/", cfg.base);
    let mine: Vec<(String, Vec<u8>)> = kvs
        .into_iter()
        .filter(|(k, _)| *k == cfg.base || k.starts_with(&child_prefix))
        .collect();
    if mine.is_empty() {
        return Err(RpcError::config(
            "service",
            format!(
                "unknown service {:?}: no key for it under the prefix",
                cfg.service
            ),
        ));
    }
    let mut targets = Vec::new();
    let mut bad = 0usize;
    for (key, value) in &mine {
        let instance = key.strip_prefix(&child_prefix).unwrap_or("");
        match parse_value(value) {
            Ok(mut ts) => targets.append(&mut ts),
            Err(why) => {
                bad += 1;
                let which = if instance.is_empty() {
                    "the service key".to_string()
                } else {
                    format!("instance {instance:?}")
                };
                eprintln!("skipped {which}: {why}");
            }
        }
    }
    if targets.is_empty() && bad > 0 {
        return Err(RpcError::provider(format!(
            "all {bad} values of the service are malformed (see the plugin log)"
        )));
    }
    Ok(ResolveResult {
        targets,
        ttl_seconds: 0,
    })
}

/// A value: one server (object or `host:port[:weight]` text), a JSON list of them, or empty.
pub(crate) fn parse_value(raw: &[u8]) -> Result<Vec<Value>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "not UTF-8".to_string())?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    // `[` opens a JSON list or a bracketed IPv6 address (`[2001:db8::1]:443`).
    let json_list = text.starts_with('[') && serde_json::from_str::<Value>(text).is_ok();
    if text.starts_with('{') || json_list {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("bad JSON: {e}"))?;
        return match v {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| parse_item(item).map_err(|why| format!("entry {}: {why}", i + 1)))
                .collect(),
            other => parse_item(&other).map(|t| vec![t]),
        };
    }
    parse_host_port(text).map(|t| vec![t])
}

pub(crate) fn parse_item(item: &Value) -> Result<Value, String> {
    match item {
        Value::String(s) => parse_host_port(s.trim()),
        Value::Object(o) => parse_object(o),
        _ => Err("expected an object or \"host:port\"".into()),
    }
}

pub(crate) fn parse_object(o: &Map<String, Value>) -> Result<Value, String> {
    // etcd's naming format: {"Addr": "host:port", "Metadata": ...}
    if let Some(addr) = o.get("Addr").or_else(|| o.get("addr")) {
        let addr = addr.as_str().ok_or("Addr must be a string")?;
        return parse_host_port(addr);
    }
    let address = o
        .get("address")
        .or_else(|| o.get("host"))
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .ok_or("address (a string) is missing")?;
    let port = o
        .get("port")
        .and_then(Value::as_u64)
        .filter(|p| (1..=65535).contains(p))
        .ok_or("port must be a whole number from 1 to 65535")? as u16;
    let mut t = target(address, port, weight_value(o.get("weight"))?);
    if let Some(Value::Array(tags)) = o.get("tags") {
        let tags: Vec<Value> = tags.iter().filter(|t| t.is_string()).cloned().collect();
        t["tags"] = Value::Array(tags);
    }
    Ok(t)
}

/// `host:port[:weight]`, IPv6 as `[addr]:port[:weight]`.
pub(crate) fn parse_host_port(s: &str) -> Result<Value, String> {
    let t = split_target(s)?;
    if t.address.is_empty() || t.address.contains(char::is_whitespace) {
        return Err("empty host or host with spaces".into());
    }
    let port = parse_port(t.port)?;
    let weight = t.weight.map(parse_weight).transpose()?.flatten();
    Ok(target(t.address, port, weight))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values() {
        assert_eq!(
            parse_value(br#"{"address":"10.0.0.1","port":80,"weight":3,"tags":["a",1]}"#).unwrap(),
            vec![json!({"address":"10.0.0.1","port":80,"weight":3,"tags":["a"]})]
        );
        assert_eq!(
            parse_value(br#"{"Op":0,"Addr":"10.0.0.2:8080","Metadata":null}"#).unwrap(),
            vec![json!({"address":"10.0.0.2","port":8080})]
        );
        assert_eq!(
            parse_value(b" [2001:db8::1]:443:5 ").unwrap(),
            vec![json!({"address":"2001:db8::1","port":443,"weight":5})]
        );
        assert_eq!(
            parse_value(br#"["a.example:1", {"host":"b.example","port":2,"weight":0}]"#).unwrap(),
            vec![
                json!({"address":"a.example","port":1}),
                json!({"address":"b.example","port":2})
            ]
        );
        assert_eq!(parse_value(b"").unwrap(), Vec::<Value>::new());
        for bad in [
            &b"10.0.0.1"[..],
            b"10.0.0.1:0",
            b"10.0.0.1:80:1001",
            b"{\"address\":\"x\"}",
            b"{\"port\":80}",
            b"{bad json",
            b"[1]",
            b"\xff\xfe",
            b"2001:db8::1:80",
        ] {
            assert!(
                parse_value(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
