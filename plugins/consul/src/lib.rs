//! The `consul` discovery plugin: provider `registry` resolves a Consul service into its instances
//! through the agent's health API (`GET /v1/health/service/<name>`).
//!
//! - `service` is a service name, or `tag.name` (only instances carrying `tag`).
//! - `healthy_only` (default true) asks for `?passing` and keeps only instances whose checks all
//!   pass; otherwise every instance is returned.
//! - Weight: `Service.Weights.Passing` for a passing instance, `Weights.Warning` otherwise, kept
//!   within 1–1000.
//! - `token` travels only in the `X-Consul-Token` header.
//! - Errors: rejected token → -32003 `token`; unknown service (not in `/v1/catalog/services`) or
//!   unknown tag → -32003 `service`; unknown datacenter → -32003 `datacenter`; a bad address →
//!   -32003 `address`; registry down, timing out, or answering something unexpected → -32000.
//!   An empty list is returned only when the service exists and has no (healthy) instance now.
#![forbid(unsafe_code)]

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::Value;
use tributary_plugin_sdk::{root_cause, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError};

/// How long one request to the registry may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Environment variable naming a PEM file of extra CA certificates to trust for an `https://`
/// agent (the name Consul's own tools use).
pub const CACERT_ENV: &str = "CONSUL_CACERT";

/// The plugin. One HTTP client (connection pool) for every call.
pub struct Consul {
    /// The client, or why it could not be built (a bad `CONSUL_CACERT`): every call then fails.
    client: Result<reqwest::Client, String>,
    timeout: Duration,
}

impl Consul {
    /// A plugin whose requests give up after `timeout`, trusting the public web roots.
    pub fn new(timeout: Duration) -> Consul {
        Consul::with_ca(timeout, None)
    }

    /// Like [`Consul::new`], also trusting the CA certificates in `ca_pem` (for an agent served
    /// over HTTPS with a private CA).
    pub fn with_ca(timeout: Duration, ca_pem: Option<&str>) -> Consul {
        let mut b = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!(
                "tributary-plugin-consul/",
                env!("CARGO_PKG_VERSION")
            ));
        let mut problem = None;
        if let Some(pem) = ca_pem {
            match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
                Ok(certs) if !certs.is_empty() => {
                    for c in certs {
                        b = b.add_root_certificate(c);
                    }
                }
                _ => problem = Some(format!("{CACERT_ENV} holds no PEM certificate")),
            }
        }
        let client = match problem {
            Some(p) => Err(p),
            None => b
                .build()
                .map_err(|_| "the HTTP client could not be built".to_string()),
        };
        Consul { client, timeout }
    }

    /// The plugin as `main` starts it: [`DEFAULT_TIMEOUT`], and the CA file named by
    /// `$CONSUL_CACERT` when set.
    pub fn from_env() -> Consul {
        match std::env::var_os(CACERT_ENV) {
            None => Consul::new(DEFAULT_TIMEOUT),
            Some(path) => match std::fs::read_to_string(&path) {
                Ok(pem) => Consul::with_ca(DEFAULT_TIMEOUT, Some(&pem)),
                Err(e) => Consul {
                    client: Err(format!("cannot read the file named by {CACERT_ENV}: {e}")),
                    timeout: DEFAULT_TIMEOUT,
                },
            },
        }
    }
}

impl Plugin for Consul {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        let q = Query::from_params(&params)?;
        self.resolve_query(&q).await
    }
}

/// A parsed request: what to ask the registry.
#[derive(Debug)]
struct Query {
    base: Url,
    headers: HeaderMap,
    has_token: bool,
    healthy_only: bool,
    datacenter: Option<String>,
    service: String,
    tag: Option<String>,
}

impl Query {
    fn from_params(params: &ResolveParams) -> Result<Query, RpcError> {
        let c = &params.config;
        let base = parse_address(c.required_str("address")?)?;
        let token = c.optional_str("token")?;
        let healthy_only = c.bool_or("healthy_only", true)?;
        let datacenter = c.optional_str("datacenter")?.map(str::to_string);
        if let Some(dc) = &datacenter {
            if !dc
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'))
            {
                return Err(RpcError::config(
                    "datacenter",
                    "datacenter may hold letters, digits, `-`, `_` and `.` only",
                ));
            }
        }
        let mut headers = HeaderMap::new();
        if let Some(t) = token {
            let mut v = HeaderValue::from_str(t).map_err(|_| {
                RpcError::config(
                    "token",
                    "token holds characters that cannot travel in an HTTP header",
                )
            })?;
            v.set_sensitive(true);
            headers.insert("X-Consul-Token", v);
        }
        let (tag, service) = parse_service(&params.service)?;
        Ok(Query {
            base,
            headers,
            has_token: token.is_some(),
            healthy_only,
            datacenter,
            service,
            tag,
        })
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut u = self.base.clone();
        if let Ok(mut p) = u.path_segments_mut() {
            p.pop_if_empty().extend(segments);
        }
        u
    }
}

/// `http://host:port`, `https://...`, or `host:port` (plain HTTP).
fn parse_address(address: &str) -> Result<Url, RpcError> {
    let bad = || {
        RpcError::config(
            "address",
            "address must be the agent's HTTP API, such as http://127.0.0.1:8500 or host:port",
        )
    };
    let text = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let url = Url::parse(&text).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(RpcError::config(
            "address",
            "address must use http:// or https://",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) || url.query().is_some() || url.fragment().is_some()
    {
        return Err(bad());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(RpcError::config(
            "address",
            "address must not carry credentials: put the ACL token in `token`",
        ));
    }
    Ok(url)
}

/// `name` or `tag.name` → (tag, name).
fn parse_service(service: &str) -> Result<(Option<String>, String), RpcError> {
    let (tag, name) = match service.split_once('.') {
        Some((t, n)) => (Some(t), n),
        None => (None, service),
    };
    let ok = |s: &str| !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c == '/');
    if !ok(name) || tag.is_some_and(|t| !ok(t)) {
        return Err(RpcError::config(
            "service",
            "service must be a Consul service name, or tag.name (no spaces or `/`)",
        ));
    }
    Ok((tag.map(str::to_string), name.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    #[serde(default)]
    node: Node,
    service: Service,
    #[serde(default)]
    checks: Vec<Check>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Node {
    #[serde(default)]
    address: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Service {
    #[serde(default)]
    address: String,
    port: u16,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(default)]
    weights: Option<Weights>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Weights {
    #[serde(default = "one")]
    passing: i64,
    #[serde(default = "one")]
    warning: i64,
}

fn one() -> i64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Check {
    #[serde(default)]
    status: String,
}

impl Entry {
    fn passing(&self) -> bool {
        self.checks.iter().all(|c| c.status == "passing")
    }

    fn target(&self) -> Value {
        let address = if self.service.address.is_empty() {
            &self.node.address
        } else {
            &self.service.address
        };
        let weight = match &self.service.weights {
            None => 1,
            Some(w) if self.passing() => w.passing,
            Some(w) => w.warning,
        }
        .clamp(1, 1000);
        let mut t = tributary_plugin_sdk::target(address.as_str(), self.service.port, None);
        t["weight"] = Value::from(weight);
        if let Some(tags) = &self.service.tags {
            t["tags"] = Value::from(tags.clone());
        }
        t
    }
}

impl Consul {
    async fn resolve_query(&self, q: &Query) -> Result<ResolveResult, RpcError> {
        let mut url = q.url(&["v1", "health", "service", &q.service]);
        {
            let mut pairs = url.query_pairs_mut();
            if q.healthy_only {
                pairs.append_key_only("passing");
            }
            if let Some(t) = &q.tag {
                pairs.append_pair("tag", t);
            }
            if let Some(dc) = &q.datacenter {
                pairs.append_pair("dc", dc);
            }
        }
        let (headers, body) = self.get(q, url).await?;
        let entries: Vec<Entry> = serde_json::from_slice(&body).map_err(|_| {
            RpcError::provider("unexpected answer from the registry: not a list of health entries")
        })?;
        let targets: Vec<Value> = entries
            .iter()
            .filter(|e| !q.healthy_only || e.passing())
            .filter(|e| e.service.port != 0)
            .map(Entry::target)
            .collect();
        if targets.is_empty() {
            self.explain_empty(q, &headers).await?;
        }
        Ok(ResolveResult {
            targets,
            ttl_seconds: 0,
        })
    }

    /// An empty health answer: an error when the service is hidden or unknown, `Ok` when it exists
    /// and has no (healthy) instance right now.
    async fn explain_empty(&self, q: &Query, headers: &HeaderMap) -> Result<(), RpcError> {
        if filtered_by_acls(headers) {
            return Err(acl_hidden(q.has_token));
        }
        let mut url = q.url(&["v1", "catalog", "services"]);
        if let Some(dc) = &q.datacenter {
            url.query_pairs_mut().append_pair("dc", dc);
        }
        let (headers, body) = self.get(q, url).await?;
        let services: serde_json::Map<String, Value> = serde_json::from_slice(&body)
            .map_err(|_| RpcError::provider("unexpected answer from the registry's catalog"))?;
        let Some(tags) = services.get(&q.service) else {
            if filtered_by_acls(&headers) {
                return Err(acl_hidden(q.has_token));
            }
            return Err(RpcError::config(
                "service",
                format!(
                    "unknown service {:?}: the registry has no such service",
                    q.service
                ),
            ));
        };
        if let Some(tag) = &q.tag {
            let has = tags
                .as_array()
                .is_some_and(|a| a.iter().any(|t| t.as_str() == Some(tag)));
            if !has {
                return Err(RpcError::config(
                    "service",
                    format!("service {:?} has no instance tagged {tag:?}", q.service),
                ));
            }
        }
        Ok(())
    }

    /// GET with the token header; maps statuses to protocol errors.
    async fn get(&self, q: &Query, url: Url) -> Result<(HeaderMap, Vec<u8>), RpcError> {
        let client = self
            .client
            .as_ref()
            .map_err(|why| RpcError::provider(format!("the plugin cannot make requests: {why}")))?;
        let resp = client
            .get(url)
            .headers(q.headers.clone())
            .send()
            .await
            .map_err(|e| transport_error(&e, self.timeout))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .bytes()
            .await
            .map_err(|e| transport_error(&e, self.timeout))?;
        if status.is_success() {
            return Ok((headers, body.to_vec()));
        }
        let text = String::from_utf8_lossy(&body);
        if status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED {
            return Err(if q.has_token {
                RpcError::config(
                    "token",
                    format!(
                        "the registry rejected the ACL token (HTTP {})",
                        status.as_u16()
                    ),
                )
            } else {
                RpcError::config(
                    "token",
                    format!(
                        "the registry requires an ACL token (HTTP {}): set `token`",
                        status.as_u16()
                    ),
                )
            });
        }
        if q.datacenter.is_some() && text.contains("No path to datacenter") {
            return Err(RpcError::config(
                "datacenter",
                "unknown datacenter: the registry has no path to it",
            ));
        }
        Err(RpcError::provider(format!(
            "the registry answered HTTP {}{}",
            status.as_u16(),
            excerpt(&text)
        )))
    }
}

fn filtered_by_acls(headers: &HeaderMap) -> bool {
    headers
        .get("x-consul-results-filtered-by-acls")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

fn acl_hidden(has_token: bool) -> RpcError {
    RpcError::config(
        "token",
        if has_token {
            "the ACL token may not read this service (the registry filtered it out)"
        } else {
            "the registry hides this service from anonymous requests: set `token`"
        },
    )
}

/// ": <first line of the body>", short; empty for an empty body.
fn excerpt(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    if line.is_empty() {
        return String::new();
    }
    let cut: String = line.chars().take(120).collect();
    format!(": {cut}")
}

/// A failed request as -32000, worded without the URL.
fn transport_error(e: &reqwest::Error, timeout: Duration) -> RpcError {
    if e.is_timeout() {
        return RpcError::provider(format!(
            "the registry did not answer within {} s",
            timeout.as_secs_f64()
        ));
    }
    // reqwest's own text carries the URL: name the innermost cause instead.
    let cause = root_cause(e);
    if cause.contains("certificate") || cause.contains("UnknownIssuer") {
        return RpcError::config(
            "address",
            format!(
                "the registry's certificate is not trusted ({CACERT_ENV} names extra CAs): {cause}"
            ),
        );
    }
    if e.is_connect() {
        return RpcError::provider(format!("cannot connect to the registry: {cause}"));
    }
    RpcError::provider(format!("request to the registry failed: {cause}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        for ok in [
            "http://127.0.0.1:8500",
            "127.0.0.1:8500",
            "https://consul.example:8501/",
            "consul.local",
        ] {
            assert!(parse_address(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ftp://x",
            "http://",
            "http://u:p@host:8500",
            "http://h:8500/?x=1",
            "http://h:99999",
        ] {
            let e = parse_address(bad).unwrap_err();
            assert_eq!(e.field(), Some("address"), "{bad}");
            assert!(
                bad.len() < 8 || !e.message.contains(bad),
                "{bad}: {}",
                e.message
            );
        }
        assert_eq!(
            parse_address("127.0.0.1:8500").unwrap().as_str(),
            "http://127.0.0.1:8500/"
        );
    }

    #[test]
    fn services() {
        assert_eq!(parse_service("web").unwrap(), (None, "web".into()));
        assert_eq!(
            parse_service("v2.web").unwrap(),
            (Some("v2".into()), "web".into())
        );
        for bad in ["", ".web", "v2.", "a b", "a/b"] {
            assert_eq!(
                parse_service(bad).unwrap_err().field(),
                Some("service"),
                "{bad}"
            );
        }
    }

    #[test]
    fn entry_to_target_uses_weights_and_falls_back_to_the_node_address() {
        let e: Entry = serde_json::from_value(serde_json::json!({
            "Node": {"Address": "10.0.0.9"},
            "Service": {"Address": "", "Port": 80, "Tags": ["a"],
                        "Weights": {"Passing": 5000, "Warning": 0}},
            "Checks": [{"Status": "passing"}]
        }))
        .unwrap();
        assert_eq!(
            e.target(),
            serde_json::json!({"address":"10.0.0.9","port":80,"weight":1000,"tags":["a"]})
        );
        let e: Entry = serde_json::from_value(serde_json::json!({
            "Node": {"Address": "10.0.0.9"},
            "Service": {"Address": "10.1.1.1", "Port": 81, "Weights": {"Passing": 5, "Warning": 0}},
            "Checks": [{"Status": "passing"}, {"Status": "warning"}]
        }))
        .unwrap();
        assert_eq!(
            e.target(),
            serde_json::json!({"address":"10.1.1.1","port":81,"weight":1})
        );
    }
}
