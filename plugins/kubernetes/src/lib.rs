//! The `kubernetes` discovery plugin: provider `kubernetes` resolves a Service into its ready
//! endpoints by listing its EndpointSlices (`discovery.k8s.io/v1`) from the API server over HTTPS.
//!
//! - `service`: `name` (in the config's `namespace`, default `default`), `namespace/name`, or a
//!   label selector (`app=web,tier!=cache`, in the config's `namespace`) matching the Services'
//!   labels, which the EndpointSlice controller copies onto their slices.
//! - Only endpoints whose `conditions.ready` is not `false` become targets (the API says an absent
//!   condition means ready). Each address of an endpoint is a target with the chosen port.
//! - Port: the TCP port named `port_name`, or the only port when the service has one.
//! - `token` travels only in the `Authorization: Bearer` header; `ca_cert` is the PEM text of the CA
//!   that signed the API server's certificate.
//! - Errors: token rejected (401) or not allowed (403) → -32003 `token`; untrusted certificate or
//!   bad PEM → -32003 `ca_cert`; no EndpointSlice for the service → -32003 `service`; port not found
//!   or ambiguous → -32003 `port_name`; API server down, timing out or answering something
//!   unexpected → -32000. An empty list only when the service exists and has no ready endpoint.
#![forbid(unsafe_code)]

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::Value;
use tributary_plugin_sdk::{root_cause, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError};

/// How long one request to the API server may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Page size asked of the API server (`limit`); `continue` fetches the rest.
const PAGE: usize = 500;

/// The plugin. HTTP clients are kept per CA certificate (connection pools survive between calls).
pub struct Kubernetes {
    timeout: Duration,
    clients: Mutex<HashMap<u64, reqwest::Client>>,
}

impl Kubernetes {
    /// A plugin whose requests give up after `timeout`.
    pub fn new(timeout: Duration) -> Kubernetes {
        Kubernetes {
            timeout,
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn client(&self, ca_cert: Option<&str>) -> Result<reqwest::Client, RpcError> {
        let mut h = DefaultHasher::new();
        ca_cert.hash(&mut h);
        let key = h.finish();
        if let Some(c) = self.clients.lock().unwrap().get(&key) {
            return Ok(c.clone());
        }
        let mut b = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.timeout)
            .https_only(true)
            .user_agent(concat!(
                "tributary-plugin-kubernetes/",
                env!("CARGO_PKG_VERSION")
            ));
        if let Some(pem) = ca_cert {
            let bad = || {
                RpcError::config(
                    "ca_cert",
                    "ca_cert must be the PEM text of a CA certificate (-----BEGIN CERTIFICATE-----...)",
                )
            };
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(bad());
            }
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|_| bad())?;
            if certs.is_empty() {
                return Err(bad());
            }
            b = b.tls_built_in_root_certs(false);
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let client = b.build().map_err(|_| {
            RpcError::config("ca_cert", "ca_cert could not be used as a trust anchor")
        })?;
        self.clients.lock().unwrap().insert(key, client.clone());
        Ok(client)
    }
}

impl Plugin for Kubernetes {
    fn manifest(&self) -> Option<&str> {
        Some(include_str!("../plugin.json"))
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        let q = Query::from_params(&params)?;
        let client = self.client(q.ca_cert.as_deref())?;
        let slices = self.list(&client, &q).await?;
        to_result(&q, &slices)
    }
}

/// What the service names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selection {
    /// A Service by name.
    Name(String),
    /// Services matching a label selector.
    Selector(String),
}

#[derive(Debug)]
struct Query {
    base: Url,
    headers: HeaderMap,
    has_token: bool,
    ca_cert: Option<String>,
    namespace: String,
    selection: Selection,
    port_name: Option<String>,
}

impl Query {
    fn from_params(params: &ResolveParams) -> Result<Query, RpcError> {
        let c = &params.config;
        let base = parse_api_server(c.required_str("api_server")?)?;
        let token = c.optional_str("token")?;
        let ca_cert = c.optional_str("ca_cert")?.map(str::to_string);
        let default_ns = c.optional_str("namespace")?.unwrap_or("default");
        if !is_dns_label(default_ns) {
            return Err(RpcError::config(
                "namespace",
                "namespace must be a DNS label (lower-case letters, digits and `-`, at most 63)",
            ));
        }
        let port_name = c.optional_str("port_name")?.map(str::to_string);
        let mut headers = HeaderMap::new();
        if let Some(t) = token {
            let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                RpcError::config(
                    "token",
                    "token holds characters that cannot travel in an HTTP header",
                )
            })?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let (namespace, selection) = parse_service(&params.service, default_ns)?;
        Ok(Query {
            base,
            headers,
            has_token: token.is_some(),
            ca_cert,
            namespace,
            selection,
            port_name,
        })
    }

    fn label_selector(&self) -> String {
        match &self.selection {
            Selection::Name(n) => format!("kubernetes.io/service-name={n}"),
            Selection::Selector(s) => s.clone(),
        }
    }

    fn describe(&self) -> String {
        match &self.selection {
            Selection::Name(n) => format!("service {n:?} in namespace {:?}", self.namespace),
            Selection::Selector(s) => {
                format!("selector {s:?} in namespace {:?}", self.namespace)
            }
        }
    }
}

fn parse_api_server(text: &str) -> Result<Url, RpcError> {
    let url = Url::parse(text).map_err(|_| {
        RpcError::config(
            "api_server",
            "api_server must be the API server's URL, such as https://10.0.0.1:6443",
        )
    })?;
    if url.scheme() != "https" {
        return Err(RpcError::config(
            "api_server",
            "api_server must be an https:// URL (the token is never sent in clear text)",
        ));
    }
    if url.host_str().is_none_or(str::is_empty)
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(RpcError::config(
            "api_server",
            "api_server must be a plain https://host[:port][/path] URL without credentials or query",
        ));
    }
    Ok(url)
}

/// RFC 1123 label: what namespaces and Service names are.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `name`, `namespace/name`, or a label selector (anything with `=` or `!`, or a bare key test).
fn parse_service(service: &str, default_ns: &str) -> Result<(String, Selection), RpcError> {
    let s = service.trim();
    if s.contains('=') || s.contains('!') || s.contains(',') {
        if s.contains(char::is_control) {
            return Err(RpcError::config(
                "service",
                "the label selector holds control characters",
            ));
        }
        return Ok((default_ns.to_string(), Selection::Selector(s.to_string())));
    }
    let (ns, name) = match s.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (default_ns, s),
    };
    if !is_dns_label(ns) || !is_dns_label(name) {
        return Err(RpcError::config(
            "service",
            "service must be a Service name, namespace/name, or a label selector such as app=web",
        ));
    }
    Ok((ns.to_string(), Selection::Name(name.to_string())))
}

#[derive(Debug, Deserialize)]
struct SliceList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<Slice>,
}

#[derive(Debug, Default, Deserialize)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    cont: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    #[serde(default)]
    endpoints: Option<Vec<Endpoint>>,
    #[serde(default)]
    ports: Option<Vec<Port>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Conditions,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    target_ref: Option<TargetRef>,
}

#[derive(Debug, Default, Deserialize)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct TargetRef {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Port {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<i64>,
    #[serde(default)]
    protocol: Option<String>,
}

impl Port {
    fn tcp(&self) -> Option<(&str, u16)> {
        if self.protocol.as_deref().unwrap_or("TCP") != "TCP" {
            return None;
        }
        let p = u16::try_from(self.port?).ok().filter(|p| *p > 0)?;
        Some((self.name.as_deref().unwrap_or(""), p))
    }
}

impl Kubernetes {
    /// Every EndpointSlice of the query, following `continue`.
    async fn list(&self, client: &reqwest::Client, q: &Query) -> Result<Vec<Slice>, RpcError> {
        let mut url = q.base.clone();
        if let Ok(mut p) = url.path_segments_mut() {
            p.pop_if_empty().extend([
                "apis",
                "discovery.k8s.io",
                "v1",
                "namespaces",
                &q.namespace,
                "endpointslices",
            ]);
        }
        let selector = q.label_selector();
        let mut slices = Vec::new();
        let mut cont: Option<String> = None;
        for _page in 0..10_000 {
            let mut u = url.clone();
            {
                let mut pairs = u.query_pairs_mut();
                pairs.append_pair("labelSelector", &selector);
                pairs.append_pair("limit", &PAGE.to_string());
                if let Some(c) = &cont {
                    pairs.append_pair("continue", c);
                }
            }
            let list = self.get(client, q, u).await?;
            slices.extend(list.items);
            match list.metadata.cont.filter(|c| !c.is_empty()) {
                Some(c) => cont = Some(c),
                None => return Ok(slices),
            }
        }
        Err(RpcError::provider(
            "the API server kept answering `continue` (over 10000 pages)",
        ))
    }

    async fn get(
        &self,
        client: &reqwest::Client,
        q: &Query,
        url: Url,
    ) -> Result<SliceList, RpcError> {
        let resp = client
            .get(url)
            .headers(q.headers.clone())
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| self.transport_error(&e))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|_| {
                RpcError::provider(
                    "unexpected answer from the API server: not an EndpointSliceList",
                )
            });
        }
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_default();
        let short: String = message.chars().take(200).collect();
        match status {
            StatusCode::UNAUTHORIZED if q.has_token => Err(RpcError::config(
                "token",
                "the API server rejected the token (401 Unauthorized)",
            )),
            StatusCode::UNAUTHORIZED => Err(RpcError::config(
                "token",
                "the API server requires a token (401 Unauthorized): set `token`",
            )),
            StatusCode::FORBIDDEN => Err(RpcError::config(
                "token",
                format!(
                    "the token may not list EndpointSlices in namespace {:?} (403 Forbidden)",
                    q.namespace
                ),
            )),
            StatusCode::BAD_REQUEST if matches!(q.selection, Selection::Selector(_)) => {
                Err(RpcError::config(
                    "service",
                    format!("the API server refused the label selector: {short}"),
                ))
            }
            _ => Err(RpcError::provider(format!(
                "the API server answered HTTP {}{}",
                status.as_u16(),
                if short.is_empty() {
                    String::new()
                } else {
                    format!(": {short}")
                }
            ))),
        }
    }

    fn transport_error(&self, e: &reqwest::Error) -> RpcError {
        if e.is_timeout() {
            return RpcError::provider(format!(
                "the API server did not answer within {} s",
                self.timeout.as_secs_f64()
            ));
        }
        // reqwest's own text carries the URL: name the innermost cause instead.
        let cause = root_cause(e);
        if cause.contains("certificate") || cause.contains("UnknownIssuer") {
            return RpcError::config(
                "ca_cert",
                format!("the API server's certificate is not trusted: {cause}"),
            );
        }
        if e.is_connect() {
            return RpcError::provider(format!("cannot connect to the API server: {cause}"));
        }
        RpcError::provider(format!("request to the API server failed: {cause}"))
    }
}

/// Slices → targets: the chosen port, ready endpoints only.
fn to_result(q: &Query, slices: &[Slice]) -> Result<ResolveResult, RpcError> {
    if slices.is_empty() {
        return Err(RpcError::config(
            "service",
            format!("unknown service: no EndpointSlice for {}", q.describe()),
        ));
    }
    let names: BTreeSet<&str> = slices
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(Port::tcp)
        .map(|(n, _)| n)
        .collect();
    let wanted: &str = match &q.port_name {
        Some(p) => {
            if !names.contains(p.as_str()) {
                return Err(RpcError::config(
                    "port_name",
                    format!(
                        "the service has no TCP port of that name (its ports: {})",
                        list(&names)
                    ),
                ));
            }
            p
        }
        None => match names.len() {
            1 => names.iter().next().copied().unwrap_or(""),
            0 => {
                // A service without ports yet (or only UDP): nothing to send traffic to.
                if slices
                    .iter()
                    .all(|s| s.endpoints.as_ref().is_none_or(Vec::is_empty))
                {
                    return Ok(ResolveResult {
                        targets: Vec::new(),
                        ttl_seconds: 0,
                    });
                }
                return Err(RpcError::config("port_name", "the service has no TCP port"));
            }
            _ => {
                return Err(RpcError::config(
                    "port_name",
                    format!(
                        "the service has several ports ({}): set port_name",
                        list(&names)
                    ),
                ))
            }
        },
    };
    let mut targets = Vec::new();
    for s in slices {
        let Some(port) = s
            .ports
            .iter()
            .flatten()
            .filter_map(Port::tcp)
            .find(|(n, _)| *n == wanted)
            .map(|(_, p)| p)
        else {
            continue;
        };
        for ep in s.endpoints.iter().flatten() {
            if ep.conditions.ready == Some(false) {
                continue;
            }
            let mut tags: Vec<String> = Vec::new();
            if let Some(z) = &ep.zone {
                tags.push(z.clone());
            }
            if let Some(n) = ep.target_ref.as_ref().and_then(|t| t.name.clone()) {
                tags.push(n);
            }
            for a in &ep.addresses {
                let mut t = tributary_plugin_sdk::target(a.as_str(), port, None);
                if !tags.is_empty() {
                    t["tags"] = Value::from(tags.clone());
                }
                targets.push(t);
            }
        }
    }
    Ok(ResolveResult {
        targets,
        ttl_seconds: 0,
    })
}

fn list(names: &BTreeSet<&str>) -> String {
    if names.is_empty() {
        return "none".into();
    }
    names
        .iter()
        .map(|n| if n.is_empty() { "(unnamed)" } else { n })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services() {
        assert_eq!(
            parse_service("web", "prod").unwrap(),
            ("prod".into(), Selection::Name("web".into()))
        );
        assert_eq!(
            parse_service("shop/web", "prod").unwrap(),
            ("shop".into(), Selection::Name("web".into()))
        );
        assert_eq!(
            parse_service("app=web,tier!=db", "prod").unwrap(),
            (
                "prod".into(),
                Selection::Selector("app=web,tier!=db".into())
            )
        );
        for bad in ["", "Web", "a/b/c", "/web", "shop/", "we b", "-x"] {
            assert_eq!(
                parse_service(bad, "default").unwrap_err().field(),
                Some("service"),
                "{bad}"
            );
        }
    }

    #[test]
    fn api_server_must_be_https() {
        assert!(parse_api_server("https://127.0.0.1:6443").is_ok());
        assert!(parse_api_server("https://k8s.example/proxy/c1").is_ok());
        for bad in [
            "http://127.0.0.1:6443",
            "127.0.0.1:6443",
            "https://u:p@h",
            "https://h/?a=1",
        ] {
            assert_eq!(
                parse_api_server(bad).unwrap_err().field(),
                Some("api_server"),
                "{bad}"
            );
        }
    }
}
