//! The `etcd` discovery plugin: provider `etcd` reads a service's servers from etcd through its v3
//! JSON gateway (`POST /v3/kv/range`, base64 keys), with optional user/password authentication
//! (`/v3/auth/authenticate`, token in the `Authorization` header) and HTTPS with a custom CA.
//!
//! Layout: for `prefix` `/services/` and service `api`, the key `/services/api` and every key under
//! `/services/api/` are read in one range request. Each value is one server (`{"address", "port",
//! "weight"?, "tags"?}`, etcd's naming format `{"Addr": "host:port"}`, or text
//! `host:port[:weight]`) or a JSON list of them. No key at all → unknown service.

use std::collections::HashMap;
use std::error::Error as _;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Map, Value};
use tributary_base::lock;
use tributary_plugin_sdk::{
    parse_port, parse_weight, split_target, target, weight_value, ConfigExt, Plugin, ResolveParams,
    ResolveResult, RpcError,
};

/// Per request: connecting, and the whole exchange.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(8);
/// All endpoints together stay under the host's 30 s.
const TOTAL_TIMEOUT: Duration = Duration::from_secs(25);

#[derive(Default)]
struct Etcd {
    /// One HTTP client per CA file (`None`: the built-in web roots).
    clients: Mutex<HashMap<Option<String>, reqwest::Client>>,
    /// Auth tokens per (endpoint, user name, password). Simple tokens live on one member only.
    tokens: Mutex<HashMap<(String, String, String), String>>,
}

impl Plugin for Etcd {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        let cfg = Config::parse(&params)?;
        let client = self.client(cfg.ca_cert.as_deref())?;
        match tokio::time::timeout(TOTAL_TIMEOUT, self.resolve_with(&cfg, &client)).await {
            Ok(r) => r,
            Err(_) => Err(RpcError::provider(format!(
                "no etcd endpoint answered within {} s",
                TOTAL_TIMEOUT.as_secs()
            ))),
        }
        .map_err(|e| cfg.scrub_error(e))
    }
}

struct Config {
    endpoints: Vec<reqwest::Url>,
    /// The raw endpoint texts, for scrubbing messages.
    endpoint_texts: Vec<String>,
    service: String,
    base: String,
    credentials: Option<(String, String)>,
    ca_cert: Option<String>,
}

impl Config {
    fn parse(params: &ResolveParams) -> Result<Config, RpcError> {
        let c = &params.config;
        let list = c.required_str("endpoints")?;
        let mut endpoints = Vec::new();
        let mut endpoint_texts = Vec::new();
        for (i, text) in list
            .split(|ch: char| ch == ',' || ch.is_whitespace())
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            let bad =
                |why: &str| RpcError::config("endpoints", format!("endpoint {}: {why}", i + 1));
            let url = reqwest::Url::parse(text).map_err(|_| {
                bad("is not a URL (expected http://host:port or https://host:port)")
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(bad("must start with http:// or https://"));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(bad("has no host"));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(bad(
                    "must not carry credentials (use the username and password fields)",
                ));
            }
            if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
                return Err(bad("must be scheme://host:port without a path or query"));
            }
            endpoints.push(url);
            endpoint_texts.push(text.to_string());
        }
        if endpoints.is_empty() {
            return Err(RpcError::config("endpoints", "endpoints lists no URL"));
        }
        let mut prefix = c
            .optional_str("prefix")?
            .unwrap_or("/services/")
            .to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let service = params.service.clone();
        if service.is_empty()
            || service.starts_with('/')
            || service.ends_with('/')
            || service.chars().any(char::is_control)
        {
            return Err(RpcError::config(
                "service",
                "service must be a key name under the prefix: not empty, no leading or trailing /, no control characters",
            ));
        }
        let credentials = match (c.optional_str("username")?, c.optional_str("password")?) {
            (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(RpcError::config(
                    "password",
                    "password is required when username is set",
                ))
            }
            (None, Some(_)) => {
                return Err(RpcError::config(
                    "username",
                    "username is required when password is set",
                ))
            }
        };
        Ok(Config {
            base: format!("{prefix}{service}"),
            endpoints,
            endpoint_texts,
            service,
            credentials,
            ca_cert: c.optional_str("ca_cert")?.map(str::to_string),
        })
    }

    /// Replaces endpoint URLs, host:port pairs and host names in `msg` by "endpoint N": every
    /// config value is secret, and library errors may quote a host.
    fn scrub(&self, msg: &str) -> String {
        let mut out = msg.to_string();
        for (i, (url, text)) in self.endpoints.iter().zip(&self.endpoint_texts).enumerate() {
            let name = format!("endpoint {}", i + 1);
            let host = url.host_str().unwrap_or_default().to_string();
            let host_port = match url.port() {
                Some(p) => format!("{host}:{p}"),
                None => host.clone(),
            };
            for needle in [
                text.as_str(),
                url.as_str(),
                host_port.as_str(),
                host.as_str(),
            ] {
                if needle.len() >= 3 {
                    out = out.replace(needle, &name);
                }
            }
        }
        if let Some((user, pass)) = &self.credentials {
            for needle in [pass, user] {
                if !needle.is_empty() {
                    out = out.replace(needle.as_str(), "<redacted>");
                }
            }
        }
        out
    }

    fn scrub_error(&self, mut e: RpcError) -> RpcError {
        e.message = self.scrub(&e.message);
        e
    }
}

/// How one endpoint failed.
enum Fail {
    /// A cause in the configuration: stop, do not try the next endpoint.
    Config(RpcError),
    /// This endpoint is down or answered garbage: try the next.
    Down(String),
}

/// An etcd gateway error body: `{"error", "message", "code"}` (gRPC codes).
fn etcd_error(body: &Value) -> Option<(i64, String)> {
    let code = body.get("code")?.as_i64()?;
    let msg = body
        .get("message")
        .or_else(|| body.get("error"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Some((code, msg))
}

fn describe(e: &reqwest::Error) -> String {
    let mut msg = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

impl Etcd {
    fn client(&self, ca_cert: Option<&str>) -> Result<reqwest::Client, RpcError> {
        let key = ca_cert.map(str::to_string);
        let mut clients = lock(&self.clients);
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let mut b = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .no_proxy();
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path).map_err(|e| {
                RpcError::config(
                    "ca_cert",
                    format!("the CA certificate file cannot be read: {e}"),
                )
            })?;
            let not_pem = || {
                RpcError::config(
                    "ca_cert",
                    "the CA certificate file holds no PEM certificate",
                )
            };
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|_| not_pem())?;
            if certs.is_empty() {
                return Err(not_pem());
            }
            for cert in certs {
                b = b.add_root_certificate(cert);
            }
        }
        let c = b
            .build()
            .map_err(|e| RpcError::provider(format!("cannot set up HTTP: {}", describe(&e))))?;
        clients.insert(key, c.clone());
        Ok(c)
    }

    async fn resolve_with(
        &self,
        cfg: &Config,
        client: &reqwest::Client,
    ) -> Result<ResolveResult, RpcError> {
        let mut failures = Vec::new();
        for (i, ep) in cfg.endpoints.iter().enumerate() {
            match self.range(cfg, client, ep).await {
                Ok(kvs) => return build(cfg, kvs),
                Err(Fail::Config(e)) => return Err(e),
                Err(Fail::Down(why)) => failures.push(format!("endpoint {}: {why}", i + 1)),
            }
        }
        Err(RpcError::provider(format!(
            "no etcd endpoint answered ({})",
            failures.join("; ")
        )))
    }

    async fn post(
        client: &reqwest::Client,
        ep: &reqwest::Url,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> Result<(u16, Value), Fail> {
        let url = ep.join(path).map_err(|_| Fail::Down("bad URL".into()))?;
        let mut req = client.post(url).json(body);
        if let Some(t) = token {
            req = req.header("Authorization", t);
        }
        let resp = req.send().await.map_err(|e| Fail::Down(describe(&e)))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| Fail::Down(describe(&e)))?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|_| {
            Fail::Down(format!("HTTP {status} with a body that is not etcd's JSON"))
        })?;
        Ok((status, v))
    }

    /// A token for `ep`, from the cache or `/v3/auth/authenticate`. `None` when no credentials are
    /// configured or etcd's authentication is off.
    async fn token(
        &self,
        cfg: &Config,
        client: &reqwest::Client,
        ep: &reqwest::Url,
        fresh: bool,
    ) -> Result<Option<String>, Fail> {
        let Some((user, pass)) = &cfg.credentials else {
            return Ok(None);
        };
        let key = (ep.to_string(), user.clone(), pass.clone());
        if !fresh {
            if let Some(t) = lock(&self.tokens).get(&key) {
                return Ok(Some(t.clone()));
            }
        }
        let (status, v) = Self::post(
            client,
            ep,
            "v3/auth/authenticate",
            None,
            &json!({"name": user, "password": pass}),
        )
        .await?;
        if let Some(t) = v.get("token").and_then(Value::as_str) {
            let t = t.to_string();
            lock(&self.tokens).insert(key, t.clone());
            return Ok(Some(t));
        }
        match etcd_error(&v) {
            Some((_, m)) if m.contains("authentication is not enabled") => Ok(None),
            Some((_, m)) if m.contains("authentication failed") => Err(Fail::Config(
                RpcError::config("password", "etcd rejected the user name or password"),
            )),
            Some((code, m)) => Err(Fail::Down(format!(
                "authentication failed with HTTP {status}, code {code}: {m}"
            ))),
            None => Err(Fail::Down(format!(
                "authentication answered HTTP {status} without a token"
            ))),
        }
    }

    /// The key-values of `cfg.base` and below, from one endpoint.
    async fn range(
        &self,
        cfg: &Config,
        client: &reqwest::Client,
        ep: &reqwest::Url,
    ) -> Result<Vec<(String, Vec<u8>)>, Fail> {
        // [base, base + "0"): base itself and every key starting with base + "/" ('0' follows
        // '/'), plus siblings such as "base-x" that are filtered out below.
        let body = json!({
            "key": B64.encode(cfg.base.as_bytes()),
            "range_end": B64.encode(format!("{}0", cfg.base).as_bytes()),
        });
        let mut fresh = false;
        loop {
            let token = self.token(cfg, client, ep, fresh).await?;
            let (status, v) =
                Self::post(client, ep, "v3/kv/range", token.as_deref(), &body).await?;
            if let Some((code, m)) = etcd_error(&v) {
                return match code {
                    // invalid auth token (expired, or issued by another member): once more.
                    16 if token.is_some() && !fresh => {
                        fresh = true;
                        continue;
                    }
                    _ if m.contains("user name is empty") => Err(Fail::Config(RpcError::config(
                        "username",
                        "etcd requires authentication: set username and password",
                    ))),
                    7 => Err(Fail::Config(RpcError::config(
                        "username",
                        "the etcd user may not read this service's keys (permission denied)",
                    ))),
                    _ => Err(Fail::Down(format!("HTTP {status}, etcd code {code}: {m}"))),
                };
            }
            if status != 200 {
                return Err(Fail::Down(format!("HTTP {status}")));
            }
            return parse_range(&v).map_err(Fail::Down);
        }
    }
}

fn parse_range(v: &Value) -> Result<Vec<(String, Vec<u8>)>, String> {
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

fn build(cfg: &Config, kvs: Vec<(String, Vec<u8>)>) -> Result<ResolveResult, RpcError> {
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
fn parse_value(raw: &[u8]) -> Result<Vec<Value>, String> {
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

fn parse_item(item: &Value) -> Result<Value, String> {
    match item {
        Value::String(s) => parse_host_port(s.trim()),
        Value::Object(o) => parse_object(o),
        _ => Err("expected an object or \"host:port\"".into()),
    }
}

fn parse_object(o: &Map<String, Value>) -> Result<Value, String> {
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
fn parse_host_port(s: &str) -> Result<Value, String> {
    let t = split_target(s)?;
    if t.address.is_empty() || t.address.contains(char::is_whitespace) {
        return Err("empty host or host with spaces".into());
    }
    let port = parse_port(t.port)?;
    let weight = t.weight.map(parse_weight).transpose()?.flatten();
    Ok(target(t.address, port, weight))
}

fn main() -> ExitCode {
    tributary_plugin_sdk::run(Etcd::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_plugin_sdk::{ConfigMap, ERR_CONFIG};

    fn params(config: Value, service: &str) -> ResolveParams {
        ResolveParams {
            provider: "etcd".into(),
            config: serde_json::from_value::<ConfigMap>(config).unwrap(),
            service: service.into(),
        }
    }

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

    #[test]
    fn config_errors_name_their_field_and_not_the_value() {
        for (config, service, field) in [
            (json!({}), "api", "endpoints"),
            (json!({"endpoints": " , "}), "api", "endpoints"),
            (json!({"endpoints": "127.0.0.1:2379"}), "api", "endpoints"),
            (
                json!({"endpoints": "ftp://127.0.0.1:2379"}),
                "api",
                "endpoints",
            ),
            (
                json!({"endpoints": "http://u:pw@127.0.0.1:2379"}),
                "api",
                "endpoints",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379/v3"}),
                "api",
                "endpoints",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379", "username": "u"}),
                "api",
                "password",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379", "password": "p4ss"}),
                "api",
                "username",
            ),
            (json!({"endpoints": "http://127.0.0.1:2379"}), "", "service"),
            (
                json!({"endpoints": "http://127.0.0.1:2379"}),
                "/api",
                "service",
            ),
            (
                json!({"endpoints": "http://127.0.0.1:2379"}),
                "a\nb",
                "service",
            ),
        ] {
            let e = Config::parse(&params(config.clone(), service))
                .err()
                .unwrap();
            assert_eq!(
                (e.code, e.field()),
                (ERR_CONFIG, Some(field)),
                "{config}: {}",
                e.message
            );
            assert!(!e.message.contains("127.0.0.1"), "{}", e.message);
            assert!(!e.message.contains("p4ss"), "{}", e.message);
        }
        let c = Config::parse(&params(
            json!({"endpoints": "http://127.0.0.1:2379, https://etcd.example:2379/", "prefix": "/reg"}),
            "api/v1",
        ))
        .unwrap();
        assert_eq!(c.base, "/reg/api/v1");
        assert_eq!(c.endpoints.len(), 2);
    }

    #[test]
    fn scrub_removes_hosts_and_credentials() {
        let c = Config::parse(&params(
            json!({"endpoints": "https://etcd-1.example:2379 http://10.1.2.3:2379", "username": "svc-user", "password": "hunter22"}),
            "api",
        ))
        .unwrap();
        let s = c.scrub(
            "cert not valid for \"etcd-1.example\"; 10.1.2.3:2379 refused; svc-user/hunter22",
        );
        assert_eq!(
            s,
            "cert not valid for \"endpoint 1\"; endpoint 2 refused; <redacted>/<redacted>"
        );
    }

    #[test]
    fn own_manifest_is_valid() {
        let m = tributary_plugin_sdk::Manifest::parse(include_str!("../plugin.json")).unwrap();
        assert_eq!(m.name, "etcd");
        assert!(
            m.provider("etcd")
                .unwrap()
                .field("password")
                .unwrap()
                .secret
        );
    }
}
