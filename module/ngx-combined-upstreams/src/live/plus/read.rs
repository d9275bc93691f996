//! The `GET` answers of the Plus API: versions and endpoint lists, `nginx`, nginx's own
//! connection and request counters, the slabs of the live upstreams' zones, the live upstreams
//! with their servers' statistics, and `{}` for what open-source nginx does not keep
//! (`docs/plus-api.md` says which and why).

use std::collections::BTreeMap;

use upstrand_core::live::render::UpstreamView;
use upstrand_core::live::Listener;
use upstrand_core::plus::route::{http_endpoints, root_endpoints, Resource, Route};
use upstrand_core::plus::time::iso8601_ms;
use upstrand_core::plus::view::{to_json, ConfServer, NginxInfo, SlabZone, UpstreamPlus};
use upstrand_core::plus::{PlusError, VERSIONS};

use super::Answer;
use crate::ffi::request::Req;
use crate::live::handler::{target, target_of, Target};

fn ok(json: String) -> Answer {
    Ok((200, json))
}

/// The answer to `GET` of `rt`.
pub fn answer(r: Req, rt: &Route) -> Answer {
    match &rt.resource {
        Resource::Versions => ok(to_json(&VERSIONS)),
        Resource::Root => ok(to_json(&root_endpoints(rt.version))),
        Resource::Http => ok(to_json(&http_endpoints(rt.version))),
        Resource::Nginx => ok(to_json(&nginx(r))),
        // nginx keeps no count of respawned workers, no SSL handshake counters, no per-zone
        // request counters: Plus's answer when none are configured.
        Resource::Processes | Resource::Ssl | Resource::Empty(_) => Ok((200, "{}".into())),
        Resource::EmptyEntry(kind, name) => Err(PlusError::new(
            404,
            kind.not_found_code(),
            format!("\"{name}\" not found (open-source nginx keeps no such statistics)"),
        )),
        Resource::Connections => match crate::ffi::plus::stub_counters() {
            Some(c) => ok(to_json(&c.connections())),
            None => Ok((200, "{}".into())),
        },
        Resource::HttpRequests => match crate::ffi::plus::stub_counters() {
            Some(c) => ok(to_json(&c.requests())),
            None => Ok((200, "{}".into())),
        },
        Resource::Slabs => ok(to_json(&slabs(r)?)),
        Resource::Slab(zone) => slabs(r)?.remove(zone).map_or_else(
            || {
                Err(PlusError::new(
                    404,
                    "SlabNotFound",
                    format!(
                        "zone \"{zone}\" not found (this API shows the zones of live upstreams)"
                    ),
                ))
            },
            |z| ok(to_json(&z)),
        ),
        Resource::Upstreams => ok(to_json(&upstreams(r)?)),
        Resource::Upstream(name) => {
            let (t, v) = live_view(r, name)?;
            ok(to_json(&UpstreamPlus::of(&v, &t.zone)))
        }
        Resource::Servers(name) => ok(to_json(&ConfServer::all(&live_view(r, name)?.1))),
        Resource::Server(name, id) => {
            let (_, v) = live_view(r, name)?;
            v.servers
                .iter()
                .find(|s| s.id == Some(*id))
                .map(ConfServer::of)
                .map_or_else(
                    || Err(PlusError::server_not_found(*id)),
                    |s| ok(to_json(&s)),
                )
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn nginx(r: Req) -> NginxInfo {
    let address = match r.listener() {
        Listener::Inet(ip) => ip.to_canonical().to_string(),
        Listener::Unix => "unix:".to_string(),
        Listener::Unknown => String::new(),
    };
    let loads = crate::ffi::plus::config_loads();
    NginxInfo {
        version: ngx::ffi::NGINX_VERSION.to_string_lossy().into_owned(),
        build: None,
        address,
        // Reloads: the configurations loaded since the module was, less the first.
        generation: loads.map(|(n, _)| n - 1),
        load_timestamp: loads.map(|(_, ms)| iso8601_ms(ms)),
        timestamp: iso8601_ms(now_ms()),
        pid: u64::from(std::process::id()),
        ppid: u64::from(std::os::unix::process::parent_id()),
    }
}

/// The live upstream `name` and its view (with health when it has a `probe`).
pub fn live_view(r: Req, name: &str) -> Result<(Target, UpstreamView), PlusError> {
    let t = target(r, name).map_err(|e| PlusError::from_live(&e))?;
    view_of(t)
}

/// `t` and its view (with health when it has a `probe`); 503 while a reload replaces it.
fn view_of(t: Target) -> Result<(Target, UpstreamView), PlusError> {
    if t.live.state().superseded() {
        return Err(PlusError::from_live(
            &upstrand_core::live::ApiError::superseded(&t.name),
        ));
    }
    let mut v = t.live.view();
    if let Some(p) = &t.probe {
        crate::live::health::decorate(&mut v, t.live, p);
    }
    Ok((t, v))
}

/// The upstream blocks that change live, by name.
fn live_targets(r: Req) -> Result<Vec<Target>, PlusError> {
    let mut out = Vec::new();
    for u in r.upstreams().into_iter().filter(|u| u.is_block()) {
        let name = String::from_utf8_lossy(u.host()).into_owned();
        let Ok(t) = target_of(u, &name) else { continue };
        if t.live.state().superseded() {
            return Err(PlusError::from_live(
                &upstrand_core::live::ApiError::superseded(&t.name),
            ));
        }
        out.push(t);
    }
    Ok(out)
}

fn upstreams(r: Req) -> Result<BTreeMap<String, UpstreamPlus>, PlusError> {
    let mut out = BTreeMap::new();
    for t in live_targets(r)? {
        let (t, v) = view_of(t)?;
        out.insert(t.name.clone(), UpstreamPlus::of(&v, &t.zone));
    }
    Ok(out)
}

fn slabs(r: Req) -> Result<BTreeMap<String, SlabZone>, PlusError> {
    let mut out = BTreeMap::new();
    for t in live_targets(r)? {
        out.entry(t.zone.clone())
            .or_insert_with(|| SlabZone::of(&t.live.slab.slot_figures()));
    }
    Ok(out)
}
