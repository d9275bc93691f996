//! A fake Kubernetes API server for the one call the `kubernetes` plugin makes, written from the
//! public Kubernetes API reference (it is not Kubernetes):
//!
//! `GET /apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices?labelSelector=..&limit=..&continue=..`
//! over HTTPS with a test CA, answering a `discovery.k8s.io/v1` `EndpointSliceList`.
//!
//! - Auth: `Authorization: Bearer <token>`; a missing or unknown token gets `401 Unauthorized`, the
//!   "forbidden" token ([`FakeKube::forbidden_token`]) gets `403 Forbidden` (both as `Status` objects).
//! - Label selectors: comma-separated `k=v`, `k==v`, `k!=v`, `k` (exists), `!k` (set-based
//!   `in`/`notin` are not supported: `400`).
//! - Paging: `limit` (and [`FakeKube::set_page_size`], which caps it) with an opaque `continue` token.
//!
//! Slices are made with [`slice()`] and [`endpoint`]; each slice carries the labels
//! `kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by` plus the service's
//! labels, as the EndpointSlice controller does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::{HttpServer, Req, Resp};
use crate::tls::TestCa;

/// An endpoint of a slice: `addresses`, `ready` (`None` leaves the condition out: "unknown",
/// which the API says to treat as ready), `zone`, pod name.
pub fn endpoint(address: &str, ready: Option<bool>, zone: &str, pod: &str) -> Value {
    let mut conditions = serde_json::Map::new();
    if let Some(r) = ready {
        conditions.insert("ready".into(), json!(r));
        conditions.insert("serving".into(), json!(r));
        conditions.insert("terminating".into(), json!(false));
    }
    json!({
        "addresses": [address],
        "conditions": conditions,
        "nodeName": "node-1",
        "zone": zone,
        "targetRef": {"kind": "Pod", "namespace": "default", "name": pod},
    })
}

/// An EndpointSlice `name` of `service` in `namespace` with the service's extra `labels`, its
/// `ports` (`(name, port)`) and `endpoints`. `address_type`: `IPv4`, `IPv6` or `FQDN`.
pub fn slice(
    namespace: &str,
    service: &str,
    name: &str,
    labels: &[(&str, &str)],
    address_type: &str,
    ports: &[(&str, u16)],
    endpoints: Vec<Value>,
) -> Value {
    let mut l = serde_json::Map::new();
    for (k, v) in labels {
        l.insert(k.to_string(), json!(v));
    }
    l.insert("kubernetes.io/service-name".into(), json!(service));
    l.insert(
        "endpointslice.kubernetes.io/managed-by".into(),
        json!("endpointslice-controller.k8s.io"),
    );
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"}))
        .collect();
    json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "labels": l, "resourceVersion": "1"},
        "addressType": address_type,
        "endpoints": if endpoints.is_empty() { Value::Null } else { Value::Array(endpoints) },
        "ports": ports,
    })
}

/// One request the fake saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub raw_query: String,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    slices: Vec<Value>,
    token: String,
    forbidden_token: String,
    page_size: Option<usize>,
    delay: Option<Duration>,
    version: u64,
    seen: Vec<Seen>,
}

/// The fake API server on `https://127.0.0.1:<port>`.
pub struct FakeKube {
    state: Arc<Mutex<State>>,
    server: HttpServer,
    ca: String,
}

impl FakeKube {
    /// Starts with a fresh test CA; `token` is the only accepted bearer token.
    pub fn start(token: &str) -> FakeKube {
        let ca = TestCa::generate("tributary fake kube CA");
        let state = Arc::new(Mutex::new(State {
            token: token.into(),
            forbidden_token: "forbidden-token-0123456789".into(),
            version: 1,
            ..State::default()
        }));
        let s = state.clone();
        let server = HttpServer::start(
            Arc::new(move |req| handle(&s, req)),
            Some(ca.server_config.clone()),
        );
        FakeKube {
            state,
            server,
            ca: ca.ca_pem,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn api_server(&self) -> String {
        format!("https://127.0.0.1:{}", self.server.port())
    }

    /// The CA certificate (PEM) that signed the server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// A token that authenticates but may not list EndpointSlices (403).
    pub fn forbidden_token(&self) -> String {
        self.state.lock().unwrap().forbidden_token.clone()
    }

    /// Replaces every slice.
    pub fn set_slices(&self, slices: Vec<Value>) {
        let mut s = self.state.lock().unwrap();
        s.slices = slices;
        s.version += 1;
    }

    /// Caps the page size (to exercise `continue`).
    pub fn set_page_size(&self, n: Option<usize>) {
        self.state.lock().unwrap().page_size = n;
    }

    /// Delays every answer.
    pub fn set_delay(&self, d: Option<Duration>) {
        self.state.lock().unwrap().delay = d;
    }

    /// Stops listening (connection refused) until [`FakeKube::resume`].
    pub fn stop(&self) {
        self.server.stop();
    }

    pub fn resume(&self) {
        self.server.resume();
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

fn status(code: u16, reason: &str, message: &str) -> Resp {
    Resp::json(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

fn handle(state: &Mutex<State>, req: Req) -> Resp {
    let mut s = state.lock().unwrap();
    s.seen.push(Seen {
        path: req.path.clone(),
        raw_query: req.raw_query.clone(),
        authorization: req.header("authorization").map(str::to_string),
    });
    let mut r = route(&s, &req);
    r.delay = s.delay;
    r
}

fn route(s: &State, req: &Req) -> Resp {
    let bearer = req
        .header("authorization")
        .and_then(|h| h.strip_prefix("Bearer "));
    let Some(ns) = req
        .path
        .strip_prefix("/apis/discovery.k8s.io/v1/namespaces/")
        .and_then(|rest| rest.strip_suffix("/endpointslices"))
    else {
        if bearer != Some(&s.token) {
            return status(401, "Unauthorized", "Unauthorized");
        }
        return status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    if bearer == Some(&s.forbidden_token) {
        return status(
            403,
            "Forbidden",
            &format!(
                "endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:default:limited\" cannot list resource \"endpointslices\" in API group \"discovery.k8s.io\" in the namespace \"{ns}\""
            ),
        );
    }
    if bearer != Some(&s.token) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    if req.method != "GET" {
        return status(405, "MethodNotAllowed", "method not allowed");
    }
    let selector = match parse_selector(req.param("labelSelector").unwrap_or("")) {
        Ok(sel) => sel,
        Err(e) => {
            return status(
                400,
                "BadRequest",
                &format!("unable to parse requirement: {e}"),
            )
        }
    };
    let matching: Vec<&Value> = s
        .slices
        .iter()
        .filter(|v| v["metadata"]["namespace"] == ns)
        .filter(|v| selector.iter().all(|r| r.matches(&v["metadata"]["labels"])))
        .collect();
    let start: usize = match req.param("continue") {
        None | Some("") => 0,
        Some(c) => match c.strip_prefix("offset-").and_then(|n| n.parse().ok()) {
            Some(n) => n,
            None => return status(400, "BadRequest", "invalid continue token"),
        },
    };
    let mut limit = req
        .param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    if let Some(p) = s.page_size {
        limit = limit.min(p);
    }
    let end = start.saturating_add(limit).min(matching.len());
    let items: Vec<Value> = matching
        .get(start..end)
        .unwrap_or(&[])
        .iter()
        .map(|v| (*v).clone())
        .collect();
    let mut metadata = json!({"resourceVersion": s.version.to_string()});
    if end < matching.len() {
        metadata["continue"] = json!(format!("offset-{end}"));
        metadata["remainingItemCount"] = json!(matching.len() - end);
    }
    Resp::json(
        200,
        &json!({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                "metadata": metadata, "items": items}),
    )
}

enum Requirement {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

impl Requirement {
    fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        match self {
            Requirement::Eq(k, v) => get(k) == Some(v),
            Requirement::Ne(k, v) => get(k) != Some(v),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::Absent(k) => get(k).is_none(),
        }
    }
}

fn parse_selector(text: &str) -> Result<Vec<Requirement>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.contains(" in ") || part.contains(" notin ") || part.contains('(') {
            return Err(format!(
                "set-based requirement {part:?} is not supported by the fake"
            ));
        }
        let r = if let Some((k, v)) = part.split_once("!=") {
            Requirement::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==") {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once('=') {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some(k) = part.strip_prefix('!') {
            Requirement::Absent(k.trim().into())
        } else {
            Requirement::Exists(part.into())
        };
        out.push(r);
    }
    Ok(out)
}
