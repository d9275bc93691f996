//! Pure logic of the live upstream API (`upstreams_api;`): the JSON a `PUT` carries,
//! its validation, the plan that turns the current server set into the new one, the answers'
//! JSON and every error text with its HTTP status. Nothing here touches nginx; the module reads
//! the zone's peers into [`Current`] values, asks [`plan()`] what to do and applies the result.
//!
//! - [`parse_put`]: body of `PUT <loc>/NAME` ([`PutBody`], one [`ServerSpec`] per server: the
//!   JSON the daemon writes) → [`PutRequest`] or an [`ApiError`] (400/413).
//! - [`plan()`]: current set + wanted set → [`Plan`] (which peers stay, which are new, which go).
//! - [`render`]: the JSON of every answer.
//! - [`route`]: which resource a request path names.
//! - [`access`]: the location's parameters (`write=`, `host=`) and the `Host` check of a `PUT`.
//! - [`down`]: the reasons a peer is skipped, as bits of nginx's `peer->down`.
//! - [`probe`]: the `probe` directive (active health checks) and the per-server health state.
//! - [`stats`]: per-server statistics (requests, responses, bytes, times) as the API shows them.

pub mod access;
pub mod down;
pub mod plan;
pub mod probe;
mod put;
pub mod render;
pub mod sizing;
pub mod stats;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

pub use access::{Access, Listener};
pub use plan::{plan, Current, Plan};
pub use put::{parse_put, PutBody, ServerSpec};

/// Most servers (primary and backup together) one `PUT` may set: the 10,000-server sets of the
/// scale benchmark with room to spare. Documented in `docs/live-api.md`.
pub const MAX_SERVERS: usize = 16_384;
/// Largest `PUT` body the API reads (bytes); a larger one is refused with 413. [`MAX_SERVERS`]
/// servers with every field written out (about 110 bytes each for IPv4, 180 at most for IPv6)
/// fit in it.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// Largest `weight` nginx's `server weight=` accepts sensibly; the API allows the same range.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// Longest `unix:` path (sun_path holds 108 bytes with the terminating zero).
pub const MAX_UNIX_PATH: usize = 107;

/// An error answer: HTTP status and a message for `{"error": MESSAGE}`. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// Human-readable text naming the problem.
    pub message: String,
    /// For a 507: how big the zone needs to be (its figures go into the answer too).
    pub zone_need: Option<render::ZoneNeed>,
}

impl ApiError {
    /// An error with this status and text.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            zone_need: None,
        }
    }

    /// 404 for a name that is no `upstream {}` block of the running configuration.
    pub fn unknown_upstream(name: &str) -> Self {
        Self::new(
            404,
            format!("no upstream \"{name}\" in the running configuration"),
        )
    }

    /// 409: the upstream has no `zone`, so its servers live in each worker's memory.
    pub fn no_zone(name: &str) -> Self {
        Self::new(
            409,
            format!(
                "upstream \"{name}\" has no zone: live changes need a shared-memory \"zone NAME SIZE;\" in the upstream block"
            ),
        )
    }

    /// 409: the upstream's balancer cannot take live changes.
    pub fn balancer_refused(name: &str, balancer: &str) -> Self {
        Self::new(
            409,
            format!(
                "upstream \"{name}\" uses the {balancer} balancer, which cannot take live changes (round_robin and least_conn can)"
            ),
        )
    }

    /// 409: the upstream has `server ... resolve` servers (nginx 1.27.3+): nginx's upstream zone
    /// module resolves their names at run time and rewrites the server set itself.
    pub fn resolves_names(name: &str) -> Self {
        Self::new(
            409,
            format!(
                "upstream \"{name}\" has servers with the \"resolve\" parameter: nginx re-resolves their names at run time and rewrites the set itself, so it cannot take live changes (change it by a reload)"
            ),
        )
    }

    /// 409: the compare-and-set guard did not match.
    pub fn generation_conflict(wanted: u64, current: u64) -> Self {
        Self::new(
            409,
            format!(
                "generation is {current}, not {wanted}: the server set changed since it was read"
            ),
        )
    }

    /// 507: the zone has no room for the new peers; `need`: the estimate of the size it needs
    /// ([`sizing::zone_need`]).
    pub fn zone_full(name: &str, zone: &str, need: render::ZoneNeed) -> Self {
        let tls = if need.tls_session_bytes > 0 {
            format!(
                " with {} for the TLS session nginx keeps per server",
                need.tls_session_bytes
            )
        } else {
            String::new()
        };
        ApiError {
            status: 507,
            message: format!(
                "zone \"{zone}\" too small: about {} bytes needed for this set (zone is {}); upstream \"{name}\" has no room for its {} new servers of about {} bytes each{tls} beside the {} bytes in use; nothing changed (make the zone larger)",
                need.needed_bytes,
                need.zone_bytes,
                need.servers_added,
                need.per_server_bytes,
                need.in_use_bytes
            ),
            zone_need: Some(need),
        }
    }

    /// 503: a lock of the upstream's zone stayed taken for `secs` seconds (another change, or a
    /// worker that died holding it); nothing changed.
    pub fn busy(name: &str, secs: u64) -> Self {
        Self::new(
            503,
            format!(
                "busy, retry: a lock of the zone of upstream \"{name}\" stayed taken for {secs} s; nothing changed (when this persists a worker died holding it: a reload makes the zone anew)"
            ),
        )
    }

    /// 503: nginx is loading a new configuration (a reload) and this worker belongs to the one
    /// it replaces, whose zone the new configuration does not use; nothing changed.
    pub fn superseded(name: &str) -> Self {
        Self::new(
            503,
            format!(
                "reloading, retry: nginx is loading a new configuration and this worker serves the one it replaces, whose zone of upstream \"{name}\" is no longer used; nothing changed (a new connection reaches a worker of the new configuration)"
            ),
        )
    }

    /// 405 with the methods the resource allows.
    pub fn method(allowed: &str) -> Self {
        Self::new(405, format!("method not allowed here; use {allowed}"))
    }

    /// 405 for a `PUT` to a location without `write=on`.
    pub fn read_only() -> Self {
        Self::new(
            405,
            "this upstreams_api location is read-only: enable changes with \"upstreams_api write=on;\" in its location",
        )
    }

    /// 413 for a body larger than [`MAX_BODY`].
    pub fn body_too_large() -> Self {
        Self::new(413, format!("request body larger than {MAX_BODY} bytes"))
    }

    /// The answer body.
    pub fn to_json(&self) -> String {
        match &self.zone_need {
            Some(need) => render::error_with_need(&self.message, need),
            None => render::error(&self.message),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

/// A server address the API accepts: an IP address with a port, or a `unix:` socket path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    /// `10.0.0.1:8080`, `[::1]:8080`
    Inet(SocketAddr),
    /// `unix:/run/app.sock` (the path, without `unix:`)
    Unix(String),
}

impl Addr {
    /// Parses an address as written in the API; host names are refused (400).
    pub fn parse(text: &str) -> Result<Addr, ApiError> {
        if let Some(path) = text.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(ApiError::new(
                    400,
                    format!("address \"{text}\": a unix: path must be absolute"),
                ));
            }
            if path.len() > MAX_UNIX_PATH || path.contains('\0') {
                return Err(ApiError::new(
                    400,
                    format!("address \"{text}\": unix: path longer than {MAX_UNIX_PATH} bytes"),
                ));
            }
            return Ok(Addr::Unix(path.to_string()));
        }
        if let Ok(sa) = text.parse::<SocketAddr>() {
            if sa.port() == 0 {
                return Err(ApiError::new(400, format!("address \"{text}\": port 0")));
            }
            let ip = sa.ip().to_canonical();
            let unusable = if ip.is_unspecified() {
                Some("an unspecified address (0.0.0.0, ::) names no server")
            } else if ip.is_multicast() {
                Some("a multicast address names no single server")
            } else if ip == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
                Some("the broadcast address names no single server")
            } else {
                None
            };
            if let Some(why) = unusable {
                return Err(ApiError::new(400, format!("address \"{text}\": {why}")));
            }
            if let SocketAddr::V6(v6) = sa {
                if v6.scope_id() != 0 || v6.flowinfo() != 0 {
                    return Err(ApiError::new(
                        400,
                        format!("address \"{text}\": IPv6 scope ids are not supported"),
                    ));
                }
            }
            return Ok(Addr::Inet(sa));
        }
        if text.parse::<IpAddr>().is_ok() || text.trim_start_matches('[').parse::<IpAddr>().is_ok()
        {
            return Err(ApiError::new(
                400,
                format!("address \"{text}\" has no port: write IP:PORT ([IPv6]:PORT)"),
            ));
        }
        Err(ApiError::new(
            400,
            format!(
                "address \"{text}\" is not an IP address with a port or a unix: path: live changes take addresses only (host names need a reload)"
            ),
        ))
    }

    /// The name nginx gives such a peer (`ngx_sock_ntop` with port): `10.0.0.1:8080`,
    /// `[::1]:8080`, `unix:/path`.
    pub fn name(&self) -> String {
        match self {
            Addr::Inet(sa) => sa.to_string(),
            Addr::Unix(p) => format!("unix:{p}"),
        }
    }
}

/// One server as the API describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Where it listens.
    pub addr: Addr,
    /// `weight=` (1 ..= [`MAX_WEIGHT`]).
    pub weight: u32,
    /// `max_fails=` (0 disables failure accounting).
    pub max_fails: u32,
    /// `fail_timeout=` in whole seconds (the API speaks milliseconds; nginx keeps seconds).
    pub fail_timeout_s: u32,
    /// `max_conns=` (0: no limit).
    pub max_conns: u32,
    /// `backup`
    pub backup: bool,
    /// `down`
    pub down: bool,
    /// `drain`: no new requests, the ones in flight finish (independent of `down`).
    pub drain: bool,
}

/// A parsed `PUT` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRequest {
    /// The wanted set, in order (primary and backup servers mixed as given).
    pub servers: Vec<Server>,
    /// Compare-and-set guard: apply only when the current generation equals this.
    pub generation: Option<u64>,
}

/// What a request path below the API location names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `<loc>/`: the list of upstreams.
    List,
    /// `<loc>/NAME`: one upstream.
    Upstream(String),
}

/// Maps the part of the URI after the location prefix to a resource; `None`: no such resource
/// (404). The rest is empty or starts with `/`: with `location /api` the URI `/apiapp` leaves
/// `app`, which names nothing.
pub fn route(rest: &[u8]) -> Option<Route> {
    let rest = std::str::from_utf8(rest).ok()?;
    let rest = match rest.strip_prefix('/') {
        Some(r) => r,
        None if rest.is_empty() => rest,
        None => return None,
    };
    if rest.is_empty() {
        return Some(Route::List);
    }
    if rest.contains('/') || rest.contains('%') {
        return None;
    }
    Some(Route::Upstream(rest.to_string()))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wire_tests;
