//! The JSON of every answer of the live API (see `docs/live-api.md`), written once for both
//! sides: the module serializes these types, the daemon deserializes them. Reading is tolerant,
//! so a daemon reads a module older or newer than itself: a field this side does not know is
//! ignored, and an absent field takes the default a `PUT` gives it (`put.rs`: weight 1,
//! `max_fails` 1, `fail_timeout_ms` 10000, the rest 0 or false) or, where its absence means
//! something (a module before ids and statistics, an upstream without `probe`), is `None`.

use serde::{Deserialize, Deserializer, Serialize};

use super::put::{one, ten_seconds};

fn one_u64() -> u64 {
    u64::from(one())
}

fn yes() -> bool {
    true
}

/// `Some` when the value reads as a `T`, else `None` (a newer module's shape of a part this side
/// only shows): never an error of the whole answer.
fn lenient<'de, D: Deserializer<'de>, T: serde::de::DeserializeOwned>(
    d: D,
) -> Result<Option<T>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// One server in `GET <loc>/NAME`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServerView {
    /// The server's id in its upstream: given when it entered the set (configuration, `PUT`),
    /// kept while it stays, never given to another server of the upstream (a reload makes a new
    /// zone, whose ids start again at 0). The NGINX Plus API's per-peer `id`. Always written by
    /// this module; `None`: a module before ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Peer name (`10.0.0.1:8080`, `[::1]:80`, `unix:/path`).
    pub address: String,
    /// `weight`
    #[serde(default = "one_u64")]
    pub weight: u64,
    /// `max_fails`
    #[serde(default = "one_u64")]
    pub max_fails: u64,
    /// `fail_timeout` in milliseconds (nginx keeps whole seconds).
    #[serde(default = "ten_seconds")]
    pub fail_timeout_ms: u64,
    /// `max_conns` (0: no limit).
    #[serde(default)]
    pub max_conns: u64,
    /// In the backup list.
    #[serde(default)]
    pub backup: bool,
    /// `down` as configured (the `PUT`'s or the file's), not why the balancer skips it.
    #[serde(default)]
    pub down: bool,
    /// Drained (`"drain": true`): no new requests; `active` tells how many are still in flight.
    #[serde(default)]
    pub drain: bool,
    /// Connections in use now, over all workers (`conns`).
    #[serde(default)]
    pub active: u64,
    /// Failures counted in the current `fail_timeout` window (`fails`).
    #[serde(default)]
    pub fails: u64,
    /// Health fields (`health`, `probe_fails`, ...), only when the upstream has a `probe`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::probe::HealthView>,
    /// The server's statistics since it entered the set (`docs/live-api.md`). Always written
    /// by this module; `None`: a module before statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<super::stats::ServerStats>,
}

/// `GET <loc>/NAME`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UpstreamView {
    /// Changes with every applied change (opaque; compare for equality only).
    pub generation: u64,
    /// The set, primary servers first, then backup servers.
    pub servers: Vec<ServerView>,
    /// Removed servers that still have requests in flight.
    #[serde(default)]
    pub retiring: u64,
    /// Those servers, oldest first (left out of the JSON when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredView>,
    /// Requests (since the zone was made) that were between two tries when the set changed and
    /// continued in the new set (their balancer state was made again).
    #[serde(default)]
    pub rebalanced: u64,
    /// The upstream's `probe` settings (left out without one; read as `None` when it is not
    /// the shape this side knows).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub probe: Option<super::probe::ProbeView>,
}

/// One removed server that still has requests in flight, in `GET <loc>/NAME`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RetiredView {
    /// Peer name.
    pub address: String,
    /// Connections still in use, over all workers (`conns`).
    #[serde(default)]
    pub active: u64,
    /// Milliseconds since it was removed from the set.
    #[serde(default)]
    pub age_ms: u64,
}

/// The `warn` line for removed servers of upstream `name` that still had connections
/// `retired_warn` (`warn_ms`) after their removal: at most 16 named, then `and N more`.
pub fn overdue_retired_line(name: &str, servers: &[RetiredView], warn_ms: u64) -> String {
    let mut named: Vec<String> = servers
        .iter()
        .take(16)
        .map(|s| {
            format!(
                "{} ({} active, removed {} s ago)",
                s.address,
                s.active,
                s.age_ms / 1000
            )
        })
        .collect();
    if servers.len() > 16 {
        named.push(format!("and {} more", servers.len() - 16));
    }
    let warn = if warn_ms % 1000 == 0 {
        format!("{}s", warn_ms / 1000)
    } else {
        format!("{warn_ms}ms")
    };
    format!(
        "upstreams_api: upstream \"{name}\": removed server{} {} still counted connections longer than retired_warn={warn} after removal: if no request to {} can last that long, a worker died holding them (nginx never gives back a dead worker's counts), and {} its zone memory until a reload frees it",
        if servers.len() == 1 { "" } else { "s" },
        named.join(", "),
        if servers.len() == 1 { "it" } else { "them" },
        if servers.len() == 1 { "it keeps" } else { "each keeps" },
    )
}

/// One entry of `GET <loc>/`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListEntry {
    /// Upstream name.
    pub name: String,
    /// `round_robin` or `least_conn` (with `+keepalive` when keepalive wraps it).
    #[serde(default)]
    pub balancer: String,
    /// Its zone.
    #[serde(default)]
    pub zone: String,
    /// Current generation.
    pub generation: u64,
}

/// `GET <loc>/`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListView {
    /// Whether this location takes `PUT`s (`upstreams_api write=on;`); a module that does not
    /// say took them always.
    #[serde(default = "yes")]
    pub write: bool,
    /// Upstreams with a zone whose balancer takes live changes.
    pub upstreams: Vec<ListEntry>,
}

/// `GET <loc>/NAME?slab`: the zone's slab allocator figures (`ngx_slab_pool_t`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SlabView {
    /// Zone name.
    pub zone: String,
    /// The zone's size in bytes (`zone NAME SIZE`).
    pub zone_bytes: u64,
    /// Page size of the slab allocator.
    pub page_size: u64,
    /// Pages the allocator manages.
    pub pages_total: u64,
    /// Pages not handed out (`pfree`).
    pub pages_free: u64,
    /// Small allocations in use, summed over the size classes (`stats[i].used`).
    pub chunks_used: u64,
    /// Failed allocations so far, summed over the size classes (`stats[i].fails`).
    pub alloc_failures: u64,
}

/// The figures of a `PUT` refused with 507 because the zone has no room: how big the zone needs
/// to be (an estimate, see `sizing.rs`), all in bytes. In the error answer next to `error`
/// ([`ErrorView`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ZoneNeed {
    /// The zone's size now.
    pub zone_bytes: u64,
    /// About the size the zone needs for this change (rounded up to KiB; always more than
    /// `zone_bytes`).
    pub needed_bytes: u64,
    /// Bytes of the zone's pages in use before the change.
    #[serde(default)]
    pub in_use_bytes: u64,
    /// Bytes the refused change needed: `servers_added` × `per_server_bytes`.
    #[serde(default)]
    pub change_bytes: u64,
    /// New servers of the change.
    #[serde(default)]
    pub servers_added: u64,
    /// Zone bytes counted per new server.
    #[serde(default)]
    pub per_server_bytes: u64,
    /// Of those, the TLS session counted per server (0: no peer of the upstream has one stored).
    #[serde(default)]
    pub tls_session_bytes: u64,
}

/// Answer of a `PUT`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PutView {
    /// The generation after the change (unchanged for an identical set).
    pub generation: u64,
    /// Whether anything changed.
    #[serde(default)]
    pub changed: bool,
    /// New peers.
    #[serde(default)]
    pub added: u64,
    /// Peers that left the set (idle ones freed, busy ones retired).
    #[serde(default)]
    pub removed: u64,
    /// Removed peers kept until their last request ends.
    #[serde(default)]
    pub retiring: u64,
    /// The addresses added and removed (for the error log's line; not in the answer).
    #[serde(skip)]
    pub names: ChangedNames,
}

/// The addresses a `PUT` added and removed, as nginx names them (a server that moved between the
/// primary and the backup list is in both).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangedNames {
    /// Addresses of the new peers.
    pub added: Vec<String>,
    /// Addresses of the peers that left the set.
    pub removed: Vec<String>,
}

fn to_json<T: Serialize>(v: &T) -> String {
    // Serializing these plain structs cannot fail (no maps with non-string keys, no I/O).
    serde_json::to_string(v).unwrap_or_else(|_| "{}".to_string())
}

/// An error answer: `{"error": MESSAGE}`, with a 507 also the zone's figures
/// (`"zone_bytes": ..., "needed_bytes": ..., ...`). Read leniently: figures that are absent or
/// not the shape this side knows are `None`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorView {
    /// What went wrong; nothing was changed.
    pub error: String,
    /// With a 507: how big the zone needs to be.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub need: Option<ZoneNeed>,
}

/// `{"error": MESSAGE}`.
pub fn error(message: &str) -> String {
    to_json(&ErrorView {
        error: message.to_string(),
        need: None,
    })
}

/// `{"error": MESSAGE, "zone_bytes": ..., "needed_bytes": ..., ...}` (507).
pub fn error_with_need(message: &str, need: &ZoneNeed) -> String {
    to_json(&ErrorView {
        error: message.to_string(),
        need: Some(need.clone()),
    })
}

impl UpstreamView {
    /// As JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl ListView {
    /// As JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl SlabView {
    /// As JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

impl PutView {
    /// As JSON.
    pub fn to_json(&self) -> String {
        to_json(self)
    }

    /// The error log's line for an applied change: who (`client`, nginx's text of the client
    /// address), which upstream, the addresses added and removed (at most [`LOG_NAMES`] of each,
    /// then how many more) and the new generation.
    pub fn log_line(&self, client: &str, upstream: &str) -> String {
        let list = |v: &[String]| {
            let mut s = v
                .iter()
                .take(LOG_NAMES)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" ");
            if v.len() > LOG_NAMES {
                s.push_str(&format!(" and {} more", v.len() - LOG_NAMES));
            }
            if s.is_empty() {
                s.push('-');
            }
            s
        };
        format!(
            "upstreams_api: client {client} changed upstream \"{upstream}\": added {} ({}), removed {} ({}), generation {}",
            self.added,
            list(&self.names.added),
            self.removed,
            list(&self.names.removed),
            self.generation
        )
    }
}

/// Most addresses of each kind (added, removed) [`PutView::log_line`] names; nginx cuts an error
/// log line at 2 KiB.
pub const LOG_NAMES: usize = 16;
