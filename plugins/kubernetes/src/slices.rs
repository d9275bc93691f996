//! The EndpointSlice list as the API server answers it, and the targets made of it: the chosen
//! port of the ready endpoints.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;
use tributary_plugin_sdk::{ResolveResult, RpcError};

use crate::query::Query;

#[derive(Debug, Deserialize)]
pub(crate) struct SliceList {
    #[serde(default)]
    pub(crate) metadata: ListMeta,
    #[serde(default)]
    pub(crate) items: Vec<Slice>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListMeta {
    #[serde(default, rename = "continue")]
    pub(crate) cont: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Slice {
    #[serde(default)]
    pub(crate) endpoints: Option<Vec<Endpoint>>,
    #[serde(default)]
    pub(crate) ports: Option<Vec<Port>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Endpoint {
    #[serde(default)]
    pub(crate) addresses: Vec<String>,
    #[serde(default)]
    pub(crate) conditions: Conditions,
    #[serde(default)]
    pub(crate) zone: Option<String>,
    #[serde(default)]
    pub(crate) target_ref: Option<TargetRef>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Conditions {
    #[serde(default)]
    pub(crate) ready: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TargetRef {
    #[serde(default)]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Port {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) port: Option<i64>,
    #[serde(default)]
    pub(crate) protocol: Option<String>,
}

impl Port {
    pub(crate) fn tcp(&self) -> Option<(&str, u16)> {
        if self.protocol.as_deref().unwrap_or("TCP") != "TCP" {
            return None;
        }
        let p = u16::try_from(self.port?).ok().filter(|p| *p > 0)?;
        Some((self.name.as_deref().unwrap_or(""), p))
    }
}

/// Slices → targets: the chosen port, ready endpoints only.
pub(crate) fn to_result(q: &Query, slices: &[Slice]) -> Result<ResolveResult, RpcError> {
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

pub(crate) fn list(names: &BTreeSet<&str>) -> String {
    if names.is_empty() {
        return "none".into();
    }
    names
        .iter()
        .map(|n| if n.is_empty() { "(unnamed)" } else { n })
        .collect::<Vec<_>>()
        .join(", ")
}
