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

mod query;
mod slices;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde_json::Value;
use tributary_plugin_sdk::{root_cause, Plugin, ResolveParams, ResolveResult, RpcError};

use query::{Query, Selection};
use slices::{to_result, Slice, SliceList};

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
