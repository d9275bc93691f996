//! The CLI's client of the daemon's API on a plain `http://host:port` address (loopback by
//! default): hyper-util's connection-pooling `Client` over HTTP/1.1, no TLS (the same client
//! `reqwest` runs on, already in the tree). The token goes in the `Authorization` header only.

use anyhow::{anyhow, bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::view::{ErrorBody, ErrorDetail};

/// Where the daemon listens and how to authenticate.
#[derive(Clone)]
pub struct Client {
    host: String,
    port: u16,
    token: String,
    http: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
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
            http: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http(),
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

    /// `http://HOST:PORT` (IPv6 hosts in brackets).
    fn base(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}", self.host, self.port)
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }

    /// Sends a request and returns status and body as they are.
    pub async fn raw<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let payload = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b)?),
            None => Bytes::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base()))
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(payload))
            .context("building the request")?;
        let resp = self.http.request(req).await.map_err(|e| {
            if e.is_connect() {
                anyhow!(
                    "cannot reach the daemon at {}:{} (is `tributary serve` running?)",
                    self.host,
                    self.port
                )
            } else {
                anyhow!("sending the request to the daemon: {e}")
            }
        })?;
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

    /// A one-shot HTTP server on 127.0.0.1 that records the request head and answers `answer`.
    async fn one_shot(answer: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "connection closed before the head");
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        (port, task)
    }

    #[tokio::test]
    async fn the_token_goes_only_in_the_authorization_header() {
        let (port, head) = one_shot(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
        )
        .await;
        let c = Client::new(&format!("http://127.0.0.1:{port}"), "tok-s3cr3t".into()).unwrap();
        let v: serde_json::Value = c
            .call::<(), _>(Method::GET, "/api/v1/bindings?x=1", None)
            .await
            .unwrap();
        assert_eq!(v["ok"], true);
        let head = head.await.unwrap();
        let first = head.lines().next().unwrap();
        assert_eq!(first, "GET /api/v1/bindings?x=1 HTTP/1.1");
        assert_eq!(head.matches("tok-s3cr3t").count(), 1, "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("authorization: bearer tok-s3cr3t\r\n"),
            "{head}"
        );
        assert!(head
            .to_ascii_lowercase()
            .contains(&format!("host: 127.0.0.1:{port}\r\n")));
    }

    #[tokio::test]
    async fn api_errors_and_an_absent_daemon_are_clear() {
        let (port, _head) = one_shot(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 118\r\n\r\n\
             {\"error\":{\"message\":\"service is empty\",\"field\":\"service\"},\"errors\":[{\"message\":\"service is empty\",\"field\":\"service\"}]}",
        )
        .await;
        let c = Client::new(&format!("http://127.0.0.1:{port}"), "t".into()).unwrap();
        let e = c
            .call::<(), serde_json::Value>(Method::POST, "/api/v1/bindings", None)
            .await
            .unwrap_err();
        let f = e.downcast_ref::<ApiFailure>().expect("an API failure");
        assert_eq!((f.status, f.field.as_deref()), (400, Some("service")));
        assert_eq!(f.errors.len(), 1);
        // Nobody listens on a port just closed.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let c = Client::new(&format!("http://127.0.0.1:{port}"), "tok-s3cr3t".into()).unwrap();
        let e = c
            .call::<(), serde_json::Value>(Method::GET, "/api/v1/health", None)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot reach the daemon"), "{e}");
        assert!(!e.contains("tok-s3cr3t"), "{e}");
    }

    #[test]
    fn debug_hides_token() {
        let c = Client::new("http://127.0.0.1:1", "supersecrettoken".into()).unwrap();
        assert!(!format!("{c:?}").contains("supersecrettoken"));
    }
}
