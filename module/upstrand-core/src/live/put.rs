//! The body of `PUT <loc>/NAME` as JSON ([`PutBody`], one [`ServerSpec`] per server), written
//! once for both sides: the daemon serializes it, the module's [`parse_put`] reads and checks it.
//! Absent fields take nginx's defaults for a `server` line (weight 1, `max_fails=1`,
//! `fail_timeout=10s`, no `max_conns`, not backup, not down, not drained); the daemon leaves out
//! `max_conns` and `drain` when they are the default, so a module that predates them takes the
//! body. A `GET` answer may be sent back as it is: its read-only figures are accepted and ignored.

use std::collections::HashSet;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};

use super::{Addr, ApiError, PutRequest, Server, MAX_BODY, MAX_SERVERS, MAX_WEIGHT};

/// A field of a `GET` answer a `PUT` may carry back: accepted, ignored, never written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Echo;

impl<'de> Deserialize<'de> for Echo {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Echo, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Echo)
    }
}

/// The body of a `PUT`: the wanted set and the compare-and-set guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutBody {
    /// The wanted set, in order (primary and backup servers mixed as given).
    pub servers: Vec<ServerSpec>,
    /// Apply only when the current generation equals this (absent: unconditionally).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    // Figures of a `GET` answer: accepted so that answer can be sent back unchanged; ignored.
    #[serde(default, rename = "retiring", skip_serializing)]
    _retiring: Echo,
    #[serde(default, rename = "retired", skip_serializing)]
    _retired: Echo,
    #[serde(default, rename = "rebalanced", skip_serializing)]
    _rebalanced: Echo,
    /// The upstream's `probe` settings of a `GET` answer.
    #[serde(default, rename = "probe", skip_serializing)]
    _probe: Echo,
}

impl PutBody {
    /// The set `servers`, applied only at `generation` when given.
    pub fn new(servers: Vec<ServerSpec>, generation: Option<u64>) -> PutBody {
        PutBody {
            servers,
            generation,
            _retiring: Echo,
            _retired: Echo,
            _rebalanced: Echo,
            _probe: Echo,
        }
    }
}

/// One server of a `PUT` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// `IP:PORT`, `[IPv6]:PORT` or `unix:/path` (no host names).
    pub address: String,
    /// `weight=` (default 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// `max_fails=` (default 1; 0 disables failure accounting).
    #[serde(default = "one")]
    pub max_fails: u32,
    /// `fail_timeout=` in milliseconds, whole seconds only (default 10000).
    #[serde(default = "ten_seconds")]
    pub fail_timeout_ms: u64,
    /// `max_conns=` (default 0: no limit); left out when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_conns: u32,
    /// `backup`
    #[serde(default)]
    pub backup: bool,
    /// `down`
    #[serde(default)]
    pub down: bool,
    /// Drained: no new requests, the ones in flight finish; left out when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drain: bool,
    // Run-time figures, health fields, id and statistics of a `GET` answer: accepted back,
    // ignored (the module gives ids; a server's figures are its own).
    #[serde(default, rename = "active", skip_serializing)]
    _active: Echo,
    #[serde(default, rename = "fails", skip_serializing)]
    _fails: Echo,
    #[serde(default, rename = "health", skip_serializing)]
    _health: Echo,
    #[serde(default, rename = "probe_fails", skip_serializing)]
    _probe_fails: Echo,
    #[serde(default, rename = "probe_passes", skip_serializing)]
    _probe_passes: Echo,
    #[serde(default, rename = "last_probe_ms_ago", skip_serializing)]
    _last_probe_ms_ago: Echo,
    #[serde(default, rename = "last_status", skip_serializing)]
    _last_status: Echo,
    #[serde(default, rename = "last_error", skip_serializing)]
    _last_error: Echo,
    #[serde(default, rename = "slow_start_remaining_ms", skip_serializing)]
    _slow_start_remaining_ms: Echo,
    #[serde(default, rename = "id", skip_serializing)]
    _id: Echo,
    #[serde(default, rename = "stats", skip_serializing)]
    _stats: Echo,
}

impl ServerSpec {
    /// A server with nginx's defaults for everything but its address and weight (what a
    /// `server ADDR weight=W;` line means).
    pub fn new(address: String, weight: u32) -> ServerSpec {
        ServerSpec {
            address,
            weight,
            max_fails: 1,
            fail_timeout_ms: 10_000,
            max_conns: 0,
            backup: false,
            down: false,
            drain: false,
            _active: Echo,
            _fails: Echo,
            _health: Echo,
            _probe_fails: Echo,
            _probe_passes: Echo,
            _last_probe_ms_ago: Echo,
            _last_status: Echo,
            _last_error: Echo,
            _slow_start_remaining_ms: Echo,
            _id: Echo,
            _stats: Echo,
        }
    }
}

pub(crate) fn one() -> u32 {
    1
}

pub(crate) fn ten_seconds() -> u64 {
    10_000
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Parses and validates a `PUT` body. Errors: 400 (bad JSON, bad field, host name, duplicate
/// address, no primary server, more than [`MAX_SERVERS`]), 413 (body over [`MAX_BODY`]).
pub fn parse_put(body: &[u8]) -> Result<PutRequest, ApiError> {
    if body.len() > MAX_BODY {
        return Err(ApiError::body_too_large());
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(
            400,
            "empty body: send {\"servers\":[...]} as JSON",
        ));
    }
    let raw: PutBody =
        serde_json::from_slice(body).map_err(|e| ApiError::new(400, format!("bad JSON: {e}")))?;
    if raw.servers.len() > MAX_SERVERS {
        return Err(ApiError::new(
            400,
            format!(
                "{} servers: at most {MAX_SERVERS} per upstream can be set live",
                raw.servers.len()
            ),
        ));
    }
    let mut servers = Vec::with_capacity(raw.servers.len());
    let mut seen: HashSet<Addr> = HashSet::with_capacity(raw.servers.len());
    for (i, s) in raw.servers.into_iter().enumerate() {
        let addr = Addr::parse(&s.address)?;
        if s.weight == 0 || s.weight > MAX_WEIGHT {
            return Err(ApiError::new(
                400,
                format!(
                    "servers[{i}] ({}): weight must be 1..{MAX_WEIGHT}, got {}",
                    s.address, s.weight
                ),
            ));
        }
        if s.fail_timeout_ms % 1000 != 0 || s.fail_timeout_ms > u64::from(u32::MAX) * 1000 {
            return Err(ApiError::new(
                400,
                format!(
                    "servers[{i}] ({}): fail_timeout_ms must be whole seconds (a multiple of 1000), got {}",
                    s.address, s.fail_timeout_ms
                ),
            ));
        }
        if !seen.insert(addr.clone()) {
            return Err(ApiError::new(
                400,
                format!("servers[{i}]: address {} is listed twice", addr.name()),
            ));
        }
        servers.push(Server {
            addr,
            weight: s.weight,
            max_fails: s.max_fails,
            fail_timeout_s: (s.fail_timeout_ms / 1000) as u32,
            max_conns: s.max_conns,
            backup: s.backup,
            down: s.down,
            drain: s.drain,
        });
    }
    if !servers.iter().any(|s| !s.backup) {
        return Err(ApiError::new(
            400,
            "the set needs at least one server that is not backup",
        ));
    }
    Ok(PutRequest {
        servers,
        generation: raw.generation,
    })
}
