//! A fake of the two Consul HTTP endpoints the `consul` plugin uses, written from Consul's public
//! API documentation (it is not Consul):
//!
//! - `GET /v1/health/service/<name>` with `?passing`, `?tag=` (repeatable, all must match), `?dc=`:
//!   an array of `{Node, Service, Checks}` entries, `X-Consul-Index` header.
//! - `GET /v1/catalog/services` with `?dc=`: `{"<name>": [tags...]}`.
//!
//! ACLs: with [`FakeConsul::require_token`] set, a request without `X-Consul-Token` sees results
//! filtered away (empty answers, header `X-Consul-Results-Filtered-By-ACLs: true`) and a request
//! with any other token gets `403 ACL not found`. An unknown `dc` gets `500 No path to datacenter`.
//! Every request is recorded (method, path, raw query, header names and the token header's value) so
//! tests can check where a token travelled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::{HttpServer, Req, Resp};

/// Health of an instance (its one check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Passing,
    Warning,
    Critical,
}

impl Health {
    fn as_str(self) -> &'static str {
        match self {
            Health::Passing => "passing",
            Health::Warning => "warning",
            Health::Critical => "critical",
        }
    }
}

/// One registered service instance.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: String,
    pub service: String,
    pub node: String,
    pub node_address: String,
    /// Service address; empty means "use the node's address" (as in Consul).
    pub address: String,
    pub port: u16,
    pub tags: Vec<String>,
    pub weight_passing: u32,
    pub weight_warning: u32,
    pub health: Health,
    pub datacenter: String,
}

impl Instance {
    /// A passing instance `id` of `service` at `address:port`, weights 1/1, datacenter `dc1`.
    pub fn new(id: &str, service: &str, address: &str, port: u16) -> Instance {
        Instance {
            id: id.into(),
            service: service.into(),
            node: format!("node-{id}"),
            node_address: "127.0.0.1".into(),
            address: address.into(),
            port,
            tags: Vec::new(),
            weight_passing: 1,
            weight_warning: 1,
            health: Health::Passing,
            datacenter: "dc1".into(),
        }
    }

    pub fn tags(mut self, tags: &[&str]) -> Instance {
        self.tags = tags.iter().map(|t| t.to_string()).collect();
        self
    }

    pub fn weights(mut self, passing: u32, warning: u32) -> Instance {
        self.weight_passing = passing;
        self.weight_warning = warning;
        self
    }

    pub fn health(mut self, h: Health) -> Instance {
        self.health = h;
        self
    }

    pub fn datacenter(mut self, dc: &str) -> Instance {
        self.datacenter = dc.into();
        self
    }

    fn entry(&self) -> Value {
        json!({
            "Node": {
                "ID": format!("id-{}", self.node),
                "Node": self.node,
                "Address": self.node_address,
                "Datacenter": self.datacenter,
                "TaggedAddresses": {"lan": self.node_address, "wan": self.node_address},
                "Meta": {},
            },
            "Service": {
                "ID": self.id,
                "Service": self.service,
                "Tags": self.tags,
                "Address": self.address,
                "Meta": {},
                "Port": self.port,
                "Weights": {"Passing": self.weight_passing, "Warning": self.weight_warning},
                "EnableTagOverride": false,
                "Namespace": "default",
            },
            "Checks": [
                {
                    "Node": self.node,
                    "CheckID": "serfHealth",
                    "Name": "Serf Health Status",
                    "Status": "passing",
                    "ServiceID": "",
                    "ServiceName": "",
                },
                {
                    "Node": self.node,
                    "CheckID": format!("service:{}", self.id),
                    "Name": format!("Service '{}' check", self.service),
                    "Status": self.health.as_str(),
                    "ServiceID": self.id,
                    "ServiceName": self.service,
                    "ServiceTags": self.tags,
                }
            ]
        })
    }
}

/// One request the fake saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub raw_query: String,
    pub header_names: Vec<String>,
    pub token: Option<String>,
}

#[derive(Default)]
struct State {
    instances: Vec<Instance>,
    token: Option<String>,
    datacenters: Vec<String>,
    delay: Option<Duration>,
    index: u64,
    seen: Vec<Seen>,
}

/// The fake Consul agent on `127.0.0.1:<port>`.
pub struct FakeConsul {
    state: Arc<Mutex<State>>,
    server: HttpServer,
    ca_pem: Option<String>,
}

impl Default for FakeConsul {
    fn default() -> Self {
        Self::start()
    }
}

impl FakeConsul {
    /// Starts an empty agent (datacenters `dc1` and `dc2`, no ACLs).
    pub fn start() -> FakeConsul {
        Self::start_with(None)
    }

    /// Like [`FakeConsul::start`], served over HTTPS with a certificate from a fresh test CA
    /// ([`FakeConsul::ca_pem`]).
    pub fn start_tls() -> FakeConsul {
        Self::start_with(Some(crate::tls::TestCa::generate(
            "tributary fake consul CA",
        )))
    }

    fn start_with(ca: Option<crate::tls::TestCa>) -> FakeConsul {
        let state = Arc::new(Mutex::new(State {
            datacenters: vec!["dc1".into(), "dc2".into()],
            index: 1,
            ..State::default()
        }));
        let s = state.clone();
        let server = HttpServer::start(
            Arc::new(move |req| handle(&s, req)),
            ca.as_ref().map(|c| c.server_config.clone()),
        );
        FakeConsul {
            state,
            server,
            ca_pem: ca.map(|c| c.ca_pem),
        }
    }

    /// `http://127.0.0.1:<port>` (`https://` when started with [`FakeConsul::start_tls`]).
    pub fn address(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.server.port())
    }

    /// The CA certificate (PEM) of an HTTPS fake.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Registers (or replaces, by id) an instance.
    pub fn register(&self, inst: Instance) {
        let mut s = self.state.lock().unwrap();
        s.instances.retain(|i| i.id != inst.id);
        s.instances.push(inst);
        s.index += 1;
    }

    /// Deregisters the instance `id`.
    pub fn deregister(&self, id: &str) {
        let mut s = self.state.lock().unwrap();
        s.instances.retain(|i| i.id != id);
        s.index += 1;
    }

    /// Sets the health of instance `id`.
    pub fn set_health(&self, id: &str, h: Health) {
        let mut s = self.state.lock().unwrap();
        for i in s.instances.iter_mut().filter(|i| i.id == id) {
            i.health = h;
        }
        s.index += 1;
    }

    /// Turns ACLs on: only `token` sees anything.
    pub fn require_token(&self, token: &str) {
        self.state.lock().unwrap().token = Some(token.into());
    }

    /// Delays every answer (a registry that times out).
    pub fn set_delay(&self, d: Option<Duration>) {
        self.state.lock().unwrap().delay = d;
    }

    /// Stops listening (connection refused) until [`FakeConsul::resume`].
    pub fn stop(&self) {
        self.server.stop();
    }

    /// Listens again on the same port.
    pub fn resume(&self) {
        self.server.resume();
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

enum Acl {
    Full,
    Anonymous,
}

fn handle(state: &Mutex<State>, req: Req) -> Resp {
    let mut s = state.lock().unwrap();
    let token = req.header("x-consul-token").map(str::to_string);
    s.seen.push(Seen {
        method: req.method.clone(),
        path: req.path.clone(),
        raw_query: req.raw_query.clone(),
        header_names: req.headers.iter().map(|(k, _)| k.clone()).collect(),
        token: token.clone(),
    });
    let delay = s.delay;
    let mut resp = route(&s, &req, token.as_deref());
    resp.delay = delay;
    resp
}

fn route(s: &State, req: &Req, token: Option<&str>) -> Resp {
    if req.method != "GET" {
        return Resp::text(405, "method not allowed");
    }
    let acl = match (&s.token, token) {
        (None, _) => Acl::Full,
        (Some(_), None) => Acl::Anonymous,
        (Some(want), Some(got)) if want == got => Acl::Full,
        (Some(_), Some(_)) => return Resp::text(403, "ACL not found"),
    };
    let dc = req.param("dc").unwrap_or("dc1").to_string();
    if !s.datacenters.contains(&dc) {
        return Resp::text(500, "No path to datacenter");
    }
    let index = s.index.to_string();
    let filtered = matches!(acl, Acl::Anonymous);
    if let Some(name) = req.path.strip_prefix("/v1/health/service/") {
        let name = percent_decode(name);
        let passing_only = req
            .query
            .iter()
            .any(|(k, v)| k == "passing" && v != "false" && v != "0");
        let tags = req.params("tag");
        let entries: Vec<Value> = if filtered {
            Vec::new()
        } else {
            s.instances
                .iter()
                .filter(|i| i.service == name && i.datacenter == dc)
                .filter(|i| !passing_only || i.health == Health::Passing)
                .filter(|i| tags.iter().all(|t| i.tags.iter().any(|it| it == t)))
                .map(Instance::entry)
                .collect()
        };
        let mut r = Resp::json(200, &Value::Array(entries)).with_header("X-Consul-Index", &index);
        if filtered {
            r = r.with_header("X-Consul-Results-Filtered-By-ACLs", "true");
        }
        return r;
    }
    if req.path == "/v1/catalog/services" {
        let mut services: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if !filtered {
            for i in s.instances.iter().filter(|i| i.datacenter == dc) {
                let tags = services.entry(i.service.clone()).or_default();
                for t in &i.tags {
                    if !tags.contains(t) {
                        tags.push(t.clone());
                    }
                }
            }
        }
        let mut r = Resp::json(200, &json!(services)).with_header("X-Consul-Index", &index);
        if filtered {
            r = r.with_header("X-Consul-Results-Filtered-By-ACLs", "true");
        }
        return r;
    }
    Resp::text(404, "Not Found")
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}
