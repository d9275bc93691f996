//! A small HTTP/1.1 client for the CLI: one request per connection to the daemon's API on a
//! plain `http://host:port` address (loopback by default). The token goes in the
//! `Authorization` header only.

use anyhow::{anyhow, bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::view::{ErrorBody, ErrorDetail};

/// Where the daemon listens and how to authenticate.
#[derive(Clone)]
pub struct Client {
    host: String,
    port: u16,
    token: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// An API error answer: HTTP status plus the `{"error": ...}` body.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiFailure {
    pub status: u16,
    pub message: String,
    pub field: Option<String>,
    /// Every invalid field when the binding was checked (the first is `message`/`field`).
    pub errors: Vec<ErrorDetail>,
}

impl Client {
    /// `api` is `http://HOST:PORT` (a trailing `/` is allowed).
    pub fn new(api: &str, token: String) -> anyhow::Result<Client> {
        let rest = api
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("API address {api:?} must start with http://"))?;
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('@') || rest.contains('?') {
            bail!("API address {api:?} must be http://HOST:PORT with nothing after the port");
        }
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("API address {api:?} needs a port"))?;
        let port: u16 = port
            .parse()
            .with_context(|| format!("API address {api:?}: bad port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            bail!("API address {api:?} needs a host");
        }
        Ok(Client {
            host: host.to_string(),
            port,
            token,
        })
    }

    /// Sends a request; `Ok` on 2xx with the parsed body, `Err` with an [`ApiFailure`] otherwise.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<T> {
        let (status, bytes) = self.raw(method, path, body).await?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .with_context(|| format!("unexpected answer from the daemon for {path}"));
        }
        let failure = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => ApiFailure {
                status: status.as_u16(),
                message: e.error.message,
                field: e.error.field,
                errors: e.errors,
            },
            Err(_) => ApiFailure {
                status: status.as_u16(),
                message: format!("HTTP {status}"),
                field: None,
                errors: Vec::new(),
            },
        };
        Err(failure.into())
    }

    /// Sends a request and returns status and body as they are.
    pub async fn raw<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let addr = (self.host.as_str(), self.port);
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| {
                format!(
                    "cannot reach the daemon at {}:{} (is `tributary serve` running?)",
                    self.host, self.port
                )
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with the daemon")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let payload = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b)?),
            None => Bytes::new(),
        };
        let host_header = if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, host_header)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(payload))
            .context("building the request")?;
        let resp = sender
            .send_request(req)
            .await
            .context("sending the request to the daemon")?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("reading the daemon's answer")?
            .to_bytes();
        Ok((status, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_address_parsing() {
        let c = Client::new("http://127.0.0.1:9180/", "t".into()).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 9180));
        let c = Client::new("http://[::1]:9", "t".into()).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("::1", 9));
        for bad in [
            "https://x:1",
            "127.0.0.1:9180",
            "http://x",
            "http://x:1/a",
            "http://:1",
        ] {
            assert!(Client::new(bad, "t".into()).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_hides_token() {
        let c = Client::new("http://127.0.0.1:1", "supersecrettoken".into()).unwrap();
        assert!(!format!("{c:?}").contains("supersecrettoken"));
    }
}
