//! The `etcd` discovery plugin: provider `etcd` reads a service's servers from etcd through its v3
//! JSON gateway (`POST /v3/kv/range`, base64 keys), with optional user/password authentication
//! (`/v3/auth/authenticate`, token in the `Authorization` header) and HTTPS with a custom CA.
//!
//! Layout: for `prefix` `/services/` and service `api`, the key `/services/api` and every key under
//! `/services/api/` are read in one range request. Each value is one server (`{"address", "port",
//! "weight"?, "tags"?}`, etcd's naming format `{"Addr": "host:port"}`, or text
//! `host:port[:weight]`) or a JSON list of them. No key at all → unknown service.
//!
//! `config` reads a request's configuration, `values` what the keys hold; this file is the plugin
//! and its calls to the gateway (authentication, range, failover over the endpoints).

mod config;
mod values;

use std::collections::HashMap;
use std::error::Error as _;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use tributary_base::lock;
use tributary_plugin_sdk::{Plugin, ResolveParams, ResolveResult, RpcError};

use config::Config;
use values::{build, parse_range};

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

fn main() -> ExitCode {
    tributary_plugin_sdk::run(Etcd::default())
}

#[cfg(test)]
mod tests {
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
