//! The web side of `tributary serve` over real HTTP, one theme a file: the OpenAPI document
//! against the routers and a bounded schemathesis run (`openapi`), access control (health open,
//! bearer API, session UI, CSRF: `access`), bad input through the API and the form and the
//! plugin's tags (`bindings`), write-only secrets and `/metrics` (`secrets_metrics`). Real
//! daemon, real `static` plugin, real nginx. The request helpers they share are here.

mod access;
mod bindings;
mod openapi;
mod secrets_metrics;

use std::time::Duration;

use crate::common::Daemon;
use serde_json::Value;
use tributary_testkit::{client, Nginx, Response};

/// One request to the daemon with `tributary_testkit`'s client: `Host: 127.0.0.1:PORT` (the
/// daemon's host check), a `Content-Length` on every request, answers awaited up to 120 s.
fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let host = format!("127.0.0.1:{port}");
    let length = body.len().to_string();
    let mut all = vec![("Host", host.as_str()), ("Content-Length", length.as_str())];
    all.extend_from_slice(headers);
    let timeout = Duration::from_secs(120);
    client::http_request_within(port, method, path, &all, body.as_bytes(), timeout)
        .unwrap_or_else(|e| panic!("{method} {path}: {e:?}"))
}

/// The answer's body as JSON (`Null` when it is not JSON).
fn json(a: &Response) -> Value {
    serde_json::from_slice(&a.body).unwrap_or(Value::Null)
}

fn bearer(d: &Daemon) -> String {
    format!("Bearer {}", d.token())
}

fn nginx_with_backend() -> Nginx {
    Nginx::builder().backend("alpha").start()
}
