//! The shapes of an upstream's live state as the daemon shows it: [`UpstreamState`] and
//! [`ServerState`] (what `binding show`, the binding page, `/metrics` and the API's `live` of
//! `GET /api/v1/bindings/{name}`, [`LiveState`], carry), [`RetiredState`], and the state badges a
//! person reads ([`Badge`]).
//!
//! The module's answer (`GET <loc>/NAME`) is read with the module's own types,
//! `upstrand_core::live::render::UpstreamView` and `ServerView` (statistics: [`ServerStats`];
//! retired servers: [`RetiredState`] is `RetiredView`): the module writes that JSON from the same
//! structs, so the field names and the defaults of absent fields are written once for both
//! sides. [`UpstreamState`] is made from it ([`From`]); its servers keep what the module leaves
//! out as `None` (`id` and `stats` before the module had them, the health fields without a
//! `probe`).

use serde::{Deserialize, Serialize};
use upstrand_core::live::probe::{Health, HealthView};
pub use upstrand_core::live::render::RetiredView as RetiredState;
use upstrand_core::live::render::{ServerView, UpstreamView};
pub use upstrand_core::live::stats::ServerStats;

/// An upstream's servers as nginx runs them now, read from the module's live API
/// (`GET <loc>/NAME`) when asked. `error` says why it could not be read (then `servers` is empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveState {
    /// The API it was read from (`--live-api`).
    pub api: String,
    /// When it was read, ms since the Unix epoch.
    pub read_at_ms: i64,
    /// Why it could not be read (`null` when it was).
    pub error: Option<String>,
    /// The generation of the set read (`null` when not read).
    pub generation: Option<u64>,
    /// Primary servers first, then backup servers, as the module lists them.
    pub servers: Vec<ServerState>,
    /// Servers removed from the set that still have requests in flight, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredState>,
}

impl LiveState {
    /// The state `api` gave at `read_at_ms`.
    pub fn read(api: String, read_at_ms: i64, s: UpstreamState) -> LiveState {
        LiveState {
            api,
            read_at_ms,
            error: None,
            generation: Some(s.generation),
            servers: s.servers,
            retired: s.retired,
        }
    }

    /// A read of `api` at `read_at_ms` that failed, and why.
    pub fn failed(api: String, read_at_ms: i64, error: String) -> LiveState {
        LiveState {
            api,
            read_at_ms,
            error: Some(error),
            generation: None,
            servers: Vec::new(),
            retired: Vec::new(),
        }
    }
}

/// One server's live state for display, made from the module's [`ServerView`]
/// (`docs/live-api.md`). As the daemon's API writes it and the CLI reads it back, only `address`
/// is required: every other field may be absent (`None` or its default), and fields the reader
/// does not know are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerState {
    pub address: String,
    /// The server's id in its upstream (the NGINX Plus-compatible API's peer id: kept while the
    /// server stays in the set, never reused; a reload starts over). Absent: a module without
    /// per-server statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(default)]
    pub weight: u64,
    #[serde(default)]
    pub backup: bool,
    /// `down` as configured (the `PUT`'s or the file's), not why the balancer skips it.
    #[serde(default)]
    pub down: bool,
    /// Connections in use now, over all workers.
    #[serde(default)]
    pub active: u64,
    /// Failures counted in the current `fail_timeout` window (nginx's passive check).
    #[serde(default)]
    pub fails: u64,
    /// Drained: no new requests, the ones in flight finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<bool>,
    /// `healthy`, `unhealthy` or `checking` (only with a `probe` in the upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// Consecutive failed probes now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_fails: Option<u64>,
    /// Consecutive passed probes now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_passes: Option<u64>,
    /// Milliseconds since the last probe (absent before the first one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_ms_ago: Option<u64>,
    /// HTTP status of the last probe's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    /// Why the last probe failed (absent when it passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Time left of the slow start ramp (0: not ramping; only with `slow_start=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start_remaining_ms: Option<u64>,
    /// Requests, responses by class, bytes, failures and response times since the server joined
    /// the set (or since the zone was made: a reload starts them at 0). Absent: a module without
    /// per-server statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ServerStats>,
}

impl ServerState {
    /// The state badges of a server, in the order a person reads them: `down`, `draining`, the
    /// probe's state (`healthy`, `unhealthy`, `checking`, or the module's word for a state this
    /// daemon does not know), `slow start`. Empty for a server that is up, without drain or probe.
    pub fn badges(&self) -> Vec<Badge> {
        let mut out = Vec::new();
        if self.down {
            out.push(Badge::Down);
        }
        if self.drain == Some(true) {
            out.push(Badge::Draining);
        }
        match self.health.as_deref() {
            None => {}
            Some("healthy") => out.push(Badge::Healthy),
            Some("unhealthy") => out.push(Badge::Unhealthy(self.last_error.clone())),
            Some("checking") => out.push(Badge::Checking),
            Some(other) => out.push(Badge::Other(other.to_string())),
        }
        if let Some(ms) = self.slow_start_remaining_ms.filter(|ms| *ms > 0) {
            out.push(Badge::SlowStart(ms));
        }
        out
    }
}

/// One state of a server as a person sees it ([`ServerState::badges`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Badge {
    Down,
    Draining,
    Healthy,
    /// With the last probe's error, when the module gave one.
    Unhealthy(Option<String>),
    Checking,
    /// Slow start, with the milliseconds left.
    SlowStart(u64),
    /// A health state this daemon does not know (a newer module).
    Other(String),
}

impl Badge {
    /// A short word for CSS classes and metrics: `down`, `draining`, `healthy`, `unhealthy`,
    /// `checking`, `slow-start`, `other`.
    pub fn class(&self) -> &'static str {
        match self {
            Badge::Down => "down",
            Badge::Draining => "draining",
            Badge::Healthy => "healthy",
            Badge::Unhealthy(_) => "unhealthy",
            Badge::Checking => "checking",
            Badge::SlowStart(_) => "slow-start",
            Badge::Other(_) => "other",
        }
    }
}

impl std::fmt::Display for Badge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Badge::Down => f.write_str("down"),
            Badge::Draining => f.write_str("draining"),
            Badge::Healthy => f.write_str("healthy"),
            Badge::Unhealthy(None) => f.write_str("unhealthy"),
            Badge::Unhealthy(Some(e)) => write!(f, "unhealthy: {e}"),
            Badge::Checking => f.write_str("checking"),
            Badge::SlowStart(ms) => write!(f, "slow start, {} s left", ms.div_ceil(1000)),
            Badge::Other(s) => f.write_str(s),
        }
    }
}

/// What `GET <loc>/NAME` says, for display: read as the module's [`UpstreamView`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "UpstreamView")]
pub struct UpstreamState {
    pub generation: u64,
    pub servers: Vec<ServerState>,
    /// Servers removed from the set that still have requests in flight (absent: none).
    pub retired: Vec<RetiredState>,
}

impl From<UpstreamView> for UpstreamState {
    fn from(v: UpstreamView) -> UpstreamState {
        UpstreamState {
            generation: v.generation,
            servers: v.servers.into_iter().map(ServerState::from).collect(),
            retired: v.retired,
        }
    }
}

impl From<ServerView> for ServerState {
    fn from(v: ServerView) -> ServerState {
        let h: Option<HealthView> = v.health;
        ServerState {
            address: v.address,
            id: v.id,
            weight: v.weight,
            backup: v.backup,
            down: v.down,
            active: v.active,
            fails: v.fails,
            drain: Some(v.drain),
            health: h.as_ref().map(|h| health_word(h.health).to_string()),
            probe_fails: h.as_ref().map(|h| h.probe_fails),
            probe_passes: h.as_ref().map(|h| h.probe_passes),
            last_probe_ms_ago: h.as_ref().and_then(|h| h.last_probe_ms_ago),
            last_status: h.as_ref().and_then(|h| h.last_status),
            last_error: h.as_ref().and_then(|h| h.last_error.clone()),
            slow_start_remaining_ms: h.as_ref().and_then(|h| h.slow_start_remaining_ms),
            stats: v.stats,
        }
    }
}

/// The module's word for a health state (as its JSON writes it).
fn health_word(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Unhealthy => "unhealthy",
        Health::Checking => "checking",
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{
        OLD_JSON, PROBED_JSON, RECORDED_JSON, RECORDED_PROBED_JSON, STATS_JSON,
    };
    use super::*;

    /// A module with ids and statistics: each server's `id` and `stats` read into the
    /// module's own type, a field this daemon does not know inside `stats` ignored, and both
    /// written back out (the API's `live`) with the module's field names.
    #[test]
    fn a_modules_ids_and_statistics_read_with_the_modules_own_type() {
        let s: UpstreamState = serde_json::from_str(STATS_JSON).unwrap();
        let ids: Vec<Option<u64>> = s.servers.iter().map(|x| x.id).collect();
        assert_eq!(ids, [Some(0), Some(3), Some(4)]);
        let one = s.servers[0].stats.unwrap();
        assert_eq!(one.requests, 12);
        assert_eq!(
            (one.responses.c2xx, one.responses.c3xx, one.responses.c5xx),
            (10, 1, 1)
        );
        assert_eq!(one.responses.total, 12);
        assert_eq!((one.sent, one.received), (1800, 5400));
        assert_eq!((one.header_time, one.response_time), (3, 25));
        assert_eq!(one.selected_ms, 1_764_435_540_000);
        let hc = one.health_checks.unwrap();
        assert_eq!((hc.checks, hc.fails, hc.last_passed), (5, 0, Some(true)));
        let two = s.servers[1].stats.unwrap();
        assert_eq!((two.requests, two.fails, two.unavail), (4, 4, 2));
        assert_eq!(
            (two.downtime, two.downstart_ms),
            (20_000, 1_764_435_530_000)
        );
        assert_eq!(two.health_checks.unwrap().unhealthy, 1);
        // Window fails (nginx's `fails`) and fails since joining (`stats.fails`) stay apart.
        assert_eq!(s.servers[1].fails, 1);
        let three = s.servers[2].stats.unwrap();
        assert_eq!(three.requests, 0);
        assert_eq!(three.health_checks.unwrap().last_passed, None);

        let out = serde_json::to_value(&s.servers[0]).unwrap();
        assert_eq!(out["id"], 0, "{out}");
        assert_eq!(out["stats"]["responses"]["5xx"], 1, "{out}");
        assert_eq!(out["stats"]["response_time"], 25, "{out}");
        assert_eq!(out["stats"]["health_checks"]["checks"], 5, "{out}");
        let unknown = serde_json::to_value(&s.servers[1]).unwrap();
        assert!(unknown["stats"].get("new_counter").is_none(), "{unknown}");
    }

    /// Answers recorded from the real module read, every server with its id and statistics as
    /// the module wrote them (written back out, `stats` is the module's JSON exactly).
    #[test]
    fn answers_recorded_from_the_module_read_with_ids_and_statistics() {
        let s: UpstreamState = serde_json::from_str(RECORDED_JSON).unwrap();
        let raw: serde_json::Value = serde_json::from_str(RECORDED_JSON).unwrap();
        let by = |a: &str| s.servers.iter().find(|x| x.address == a).unwrap();
        let closed = by("127.0.0.1:33969").stats.unwrap();
        assert_eq!((closed.requests, closed.fails, closed.unavail), (1, 1, 1));
        assert_eq!(closed.responses.total, 0);
        let ok = by("127.0.0.1:39549").stats.unwrap();
        assert_eq!(
            (ok.requests, ok.responses.c2xx, ok.responses.total),
            (30, 30, 30)
        );
        let broken = by("127.0.0.1:41159").stats.unwrap();
        assert_eq!((broken.responses.c5xx, broken.response_time), (30, 26));
        for (mine, theirs) in s.servers.iter().zip(raw["servers"].as_array().unwrap()) {
            let out = serde_json::to_value(mine).unwrap();
            assert_eq!(out["stats"], theirs["stats"], "{}", mine.address);
            assert_eq!(out["id"], theirs["id"], "{}", mine.address);
        }
        let p: UpstreamState = serde_json::from_str(RECORDED_PROBED_JSON).unwrap();
        let refused = p.servers[1].stats.unwrap().health_checks.unwrap();
        assert_eq!(
            (refused.checks, refused.fails, refused.unhealthy),
            (1, 1, 1)
        );
        assert_eq!(refused.last_passed, Some(false));
        assert_eq!(
            p.servers[1].badges(),
            vec![Badge::Unhealthy(Some("connect: connection refused".into()))]
        );
    }

    /// A module without per-server statistics (no `id`, no `stats`) still reads, and the API's `live` makes
    /// neither up.
    #[test]
    fn a_module_without_ids_or_statistics_still_reads() {
        for json in [OLD_JSON, PROBED_JSON] {
            let s: UpstreamState = serde_json::from_str(json).unwrap();
            for x in &s.servers {
                assert_eq!((x.id, x.stats), (None, None), "{}", x.address);
                let out = serde_json::to_value(x).unwrap();
                assert!(
                    out.get("id").is_none() && out.get("stats").is_none(),
                    "{out}"
                );
            }
        }
    }

    /// `stats` that is not the module's shape is an error that says which field, not zeros.
    #[test]
    fn malformed_statistics_are_an_error_naming_the_field() {
        let bad = STATS_JSON.replacen(r#""requests": 12"#, r#""requests": "twelve""#, 1);
        let e = serde_json::from_str::<UpstreamState>(&bad).unwrap_err();
        assert!(
            e.to_string().contains("invalid type: string \"twelve\""),
            "{e}"
        );
    }

    #[test]
    fn a_probing_modules_state_reads_with_every_contract_field() {
        let s: UpstreamState = serde_json::from_str(PROBED_JSON).unwrap();
        assert_eq!(s.generation, 12);
        assert!(s.retired.is_empty());
        let by = |a: &str| s.servers.iter().find(|x| x.address == a).unwrap();
        let one = by("10.0.0.1:80");
        assert_eq!((one.weight, one.active, one.fails), (2, 3, 0));
        assert_eq!(one.drain, Some(false));
        assert_eq!(one.health.as_deref(), Some("healthy"));
        assert_eq!((one.probe_fails, one.probe_passes), (Some(0), Some(4)));
        assert_eq!(
            (one.last_probe_ms_ago, one.last_status),
            (Some(250), Some(200))
        );
        assert_eq!(one.last_error, None);
        assert_eq!(one.badges(), vec![Badge::Healthy]);
        assert_eq!(
            by("10.0.0.2:80").badges(),
            vec![Badge::Unhealthy(Some("connect: connection refused".into()))]
        );
        let checking = by("10.0.0.3:80");
        assert_eq!(checking.badges(), vec![Badge::Checking]);
        assert_eq!(checking.last_probe_ms_ago, None);
        assert_eq!(
            by("10.0.0.4:80").badges(),
            vec![Badge::Draining, Badge::Healthy]
        );
        let slow = by("10.0.0.5:80");
        assert!(slow.backup);
        assert_eq!(
            slow.badges(),
            vec![Badge::Healthy, Badge::SlowStart(12_500)]
        );
        assert_eq!(
            Badge::SlowStart(12_500).to_string(),
            "slow start, 13 s left"
        );
    }

    /// A setting the module leaves out reads as a `PUT` without it sets it (the module's own
    /// defaults, `upstrand_core::live`): weight 1, not drained.
    #[test]
    fn absent_settings_read_with_the_defaults_of_a_put() {
        let s: UpstreamState = serde_json::from_str(
            r#"{"generation": 1, "servers": [{"address": "10.0.0.1:80", "active": 1}]}"#,
        )
        .unwrap();
        let put = upstrand_core::live::parse_put(br#"{"servers": [{"address": "10.0.0.1:80"}]}"#)
            .unwrap();
        let (shown, set) = (&s.servers[0], &put.servers[0]);
        assert_eq!(shown.weight, u64::from(set.weight));
        assert_eq!(
            (shown.weight, shown.drain, shown.backup, shown.down),
            (1, Some(false), false, false)
        );
    }

    /// A newer module's health word this daemon does not know: the server reads without health
    /// (never an error of the whole answer); the word a module writes for each state this daemon
    /// knows is the one it shows.
    #[test]
    fn a_newer_modules_health_word_reads_as_no_health() {
        let newer = PROBED_JSON.replacen(r#""health": "healthy""#, r#""health": "warming""#, 1);
        let s: UpstreamState = serde_json::from_str(&newer).unwrap();
        let one = s
            .servers
            .iter()
            .find(|x| x.address == "10.0.0.1:80")
            .unwrap();
        assert_eq!((one.health.as_deref(), one.probe_passes), (None, None));
        for h in [Health::Healthy, Health::Unhealthy, Health::Checking] {
            assert_eq!(serde_json::to_value(h).unwrap(), health_word(h));
        }
    }

    #[test]
    fn an_old_modules_state_reads_without_the_new_fields() {
        let s: UpstreamState = serde_json::from_str(OLD_JSON).unwrap();
        assert_eq!(s.servers.len(), 2);
        assert_eq!(
            s.retired,
            vec![RetiredState {
                address: "10.0.0.9:80".into(),
                active: 2,
                age_ms: 61_000
            }]
        );
        let a = &s.servers[0];
        assert_eq!((a.active, a.fails, a.down), (3, 2, false));
        // A module before `drain` drains nothing: an absent `drain` is false, as in a `PUT`.
        assert_eq!((a.drain, a.health.clone()), (Some(false), None));
        assert!(a.badges().is_empty());
        assert_eq!(s.servers[1].badges(), vec![Badge::Down]);
        // Written back out (the API's `live`), absent fields stay absent.
        let out = serde_json::to_value(a).unwrap();
        assert_eq!(out["drain"], false, "{out}");
        for absent in [
            "health",
            "probe_fails",
            "last_error",
            "slow_start_remaining_ms",
        ] {
            assert!(out.get(absent).is_none(), "{absent}: {out}");
        }
        // A health word this side does not know, in the daemon's own API (a CLI reading a newer
        // daemon), is shown as it is written.
        let mut new = a.clone();
        new.health = Some("warming".into());
        assert_eq!(new.badges(), vec![Badge::Other("warming".into())]);
    }
}
