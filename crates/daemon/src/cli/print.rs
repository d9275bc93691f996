//! The text form of binding views, their fleet and outcomes (`binding add|show|refresh`).

use tributary_store::{Applied, OutcomeRecord};

use crate::live_state::LiveState;
use crate::live_state::ServerState;
use crate::view::{BindingFleet, BindingView, StoreView};

pub(super) fn outcome_line(o: &OutcomeRecord) -> String {
    let mut s = format!(
        "{} {}{} in {} ms: {} servers",
        format_time(o.at_ms),
        o.status.as_str(),
        o.failure.map(|f| format!(" ({f})")).unwrap_or_default(),
        o.duration_ms,
        o.kept.len()
    );
    if o.changed {
        s.push_str(", file changed");
    }
    match (o.applied, &o.applied_reason) {
        (Some(Applied::Live), Some(why)) => {
            s.push_str(&format!(", applied live (no reload): {why}"))
        }
        (Some(Applied::Live), None) => s.push_str(", applied live (no reload)"),
        (Some(Applied::Reload), Some(why)) => match o.reload_reason {
            Some(r) => s.push_str(&format!(", nginx reloaded (applied by reload, {r}: {why})")),
            None => s.push_str(&format!(", nginx reloaded (applied by reload: {why})")),
        },
        _ if o.reloaded => s.push_str(", nginx reloaded"),
        _ => {}
    }
    if let Some(code) = o.code {
        s.push_str(&format!(", code {code}"));
    }
    if let Some(f) = &o.field {
        s.push_str(&format!(", field {f}"));
    }
    if let Some(w) = &o.why {
        s.push_str(&format!(" — {w}"));
    }
    s
}

/// One sentence for a person when the store is unreachable (`None` while connected).
fn store_note(s: &StoreView) -> Option<String> {
    if s.connected {
        return None;
    }
    let why = s
        .last_error
        .as_deref()
        .map(|e| format!(" ({e})"))
        .unwrap_or_default();
    Some(format!(
        "the {} store is unreachable{why}: this host keeps serving its last applied servers; \
         changes of bindings and new target sets reach it when the store answers again",
        s.kind
    ))
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC) of a time in ms since the Unix epoch.
fn format_time(ms: i64) -> String {
    crate::utc::utc(ms, 'T')
}

pub(super) fn print_view(b: &BindingView) {
    println!("  plugin/provider: {}/{}", b.plugin, b.provider);
    println!("  service: {}", b.service);
    println!("  interval: {} s", b.interval_secs);
    for (k, v) in &b.config {
        println!("  config {k}: {v}");
    }
    for (k, set) in &b.secrets {
        println!(
            "  config {k}: {}",
            if *set {
                "(secret, set)"
            } else {
                "(secret, not set)"
            }
        );
    }
    for d in &b.directives {
        println!("  directive: {d}");
    }
    if let Some(p) = &b.probe {
        println!("  probe: {p}");
    }
    if b.drain_secs > 0 {
        println!("  drain before removal: {} s", b.drain_secs);
    }
    println!("  file: {}", b.file);
    println!("  add at http level: {}", b.include_line);
    match &b.last_outcome {
        Some(o) => {
            println!("  last: {}", outcome_line(o));
            if let Some(e) = &o.nginx_error {
                println!("  nginx: {}", e.trim());
            }
            for d in &o.dropped {
                println!("  dropped: {} ({})", d.target, d.reason);
            }
        }
        None => println!("  last: not resolved yet"),
    }
    if b.servers.is_empty() {
        println!("  servers: none known");
    } else {
        println!("  servers:");
        for s in &b.servers {
            println!("    {s}");
        }
    }
    if let Some(n) = b.next_refresh_ms {
        println!("  next refresh: {}", format_time(n));
    }
}

/// The live state lines `tributary binding show` prints (indented by two spaces): one line per
/// server as nginx runs it now (address, weight, active connections, fails, then its states:
/// down, draining, healthy / unhealthy with the last error / checking, slow start, and the
/// probe's counts when the module gives them; under it, when the module keeps them, the server's
/// id and statistics: [`stats_line`]), or why it could not be read.
pub(super) fn live_lines(live: &LiveState) -> Vec<String> {
    if let Some(e) = &live.error {
        return vec![format!("  live state unavailable: {}", e.trim())];
    }
    let mut out = vec![format!(
        "  live in nginx ({}, generation {}, read {}):",
        live.api,
        live.generation.unwrap_or(0),
        format_time(live.read_at_ms)
    )];
    if live.servers.is_empty() {
        out.push("    no servers".to_string());
    }
    let width = live
        .servers
        .iter()
        .map(|s| s.address.len())
        .max()
        .unwrap_or(0);
    for s in &live.servers {
        out.push(format!("    {}", server_line(s, width)));
        if let Some(line) = stats_line(s) {
            out.push(format!("      {line}"));
        }
    }
    for r in &live.retired {
        out.push(format!(
            "    removed, requests still in flight: {} ({} active, removed {} s ago)",
            r.address,
            r.active,
            r.age_ms / 1000
        ));
    }
    out
}

/// One server of [`live_lines`], its address padded to `width`.
fn server_line(s: &ServerState, width: usize) -> String {
    let mut line = format!(
        "{:width$}  weight {}  active {}  fails {}",
        s.address, s.weight, s.active, s.fails
    );
    if s.backup {
        line.push_str("  backup");
    }
    let badges: Vec<String> = s.badges().iter().map(|b| b.to_string()).collect();
    if !badges.is_empty() {
        line.push_str(&format!("  [{}]", badges.join("; ")));
    }
    let mut probe = Vec::new();
    if let Some(n) = s.probe_fails {
        probe.push(format!("{n} failed"));
    }
    if let Some(n) = s.probe_passes {
        probe.push(format!("{n} passed"));
    }
    if let Some(ms) = s.last_probe_ms_ago {
        probe.push(format!("last {ms} ms ago"));
    }
    if let Some(st) = s.last_status {
        probe.push(format!("status {st}"));
    }
    if !probe.is_empty() {
        line.push_str(&format!("  probes in a row: {}", probe.join(", ")));
    }
    line
}

/// A server's id and statistics: requests, 5xx responses, failed tries since it joined
/// the set, the average response time and the probe's checks. `None` for a module that does not
/// keep them.
fn stats_line(s: &ServerState) -> Option<String> {
    let st = s.stats.as_ref()?;
    let mut line = String::new();
    if let Some(id) = s.id {
        line.push_str(&format!("id {id}  "));
    }
    line.push_str(&format!(
        "requests {}  5xx {}  failed tries {}  response time {} ms",
        st.requests, st.responses.c5xx, st.fails, st.response_time
    ));
    if let Some(h) = &st.health_checks {
        line.push_str(&format!(
            "  health checks {} ({} failed, unhealthy {} {})",
            h.checks,
            h.fails,
            h.unhealthy,
            if h.unhealthy == 1 { "time" } else { "times" }
        ));
    }
    Some(line)
}

/// The fleet lines `tributary binding show` prints (indented by two spaces): nothing for one host
/// on the SQLite store (no fleet); else who resolves and one line per host. `store` (when
/// known) adds a line while it is unreachable.
pub(super) fn fleet_lines(fleet: &BindingFleet, store: Option<&StoreView>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(note) = store.and_then(store_note) {
        out.push(format!("  store: {note}"));
    }
    let single = store.is_none_or(|s| s.kind == "sqlite") && fleet.hosts.len() <= 1;
    if single {
        return out;
    }
    let by = fleet.resolver.as_deref().unwrap_or("no host right now");
    out.push(format!(
        "  fleet: resolved by {by}, target set generation {}",
        fleet.generation
    ));
    let width = fleet.hosts.iter().map(|h| h.host.len()).max().unwrap_or(4);
    for h in &fleet.hosts {
        let mut line = format!(
            "    {:width$}  {:7}  {} servers  generation {}  since {}",
            h.host,
            h.state.as_str(),
            h.servers,
            h.generation,
            format_time(h.at_ms),
        );
        if !h.alive {
            line.push_str("  (not live)");
        }
        if let Some(m) = &h.message {
            line.push_str(&format!(": {}", m.trim().replace('\n', " / ")));
        }
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::FleetHostView;
    use tributary_store::HostState;

    #[test]
    fn time_formatting() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(1_700_000_000_000), "2023-11-14T22:13:20Z");
    }

    fn host(id: &str, state: HostState, alive: bool, message: Option<&str>) -> FleetHostView {
        FleetHostView {
            host: id.into(),
            state,
            alive,
            at_ms: 0,
            generation: 4,
            servers: 2,
            message: message.map(str::to_string),
        }
    }

    fn store(kind: &str, connected: bool) -> StoreView {
        StoreView {
            kind: kind.into(),
            host_id: "a".into(),
            connected,
            unreachable_since_ms: None,
            last_error: None,
            location: String::new(),
        }
    }

    #[test]
    fn binding_show_prints_no_fleet_for_one_sqlite_host() {
        let f = BindingFleet {
            resolver: Some("a".into()),
            generation: 1,
            hosts: vec![host("a", HostState::Applied, true, None)],
            ..BindingFleet::default()
        };
        assert!(fleet_lines(&f, Some(&store("sqlite", true))).is_empty());
        assert!(fleet_lines(&f, None).is_empty());
    }

    #[test]
    fn binding_show_prints_every_host_of_a_fleet_and_an_unreachable_store() {
        let f = BindingFleet {
            resolver: Some("b".into()),
            generation: 4,
            hosts: vec![
                host("a", HostState::Applied, true, None),
                host(
                    "bb",
                    HostState::Failed,
                    true,
                    Some("[emerg] no\nsecond line"),
                ),
                host("c", HostState::Stale, false, Some("store unreachable")),
            ],
            ..BindingFleet::default()
        };
        let lines = fleet_lines(&f, Some(&store("etcd", false)));
        assert!(
            lines[0].starts_with("  store: the etcd store is unreachable"),
            "{lines:?}"
        );
        assert_eq!(lines[1], "  fleet: resolved by b, target set generation 4");
        assert!(
            lines[2].starts_with("    a   applied  2 servers  generation 4  since "),
            "{lines:?}"
        );
        assert!(
            lines[3].contains("bb  failed ") && lines[3].ends_with(": [emerg] no / second line"),
            "{lines:?}"
        );
        assert!(
            lines[4].contains("(not live): store unreachable"),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 5);
    }

    fn live(json: &str) -> LiveState {
        let s: crate::live_state::UpstreamState = serde_json::from_str(json).unwrap();
        LiveState::read("unix:/x.sock:/api/".into(), 0, s)
    }

    /// A probing module (CONTRACT.md §2): each server's counts, its states and its probes.
    #[test]
    fn binding_show_prints_each_servers_health_drain_and_slow_start() {
        let lines = live_lines(&live(crate::live_state::fixtures::PROBED_JSON));
        assert_eq!(
            lines[0],
            "  live in nginx (unix:/x.sock:/api/, generation 12, read 1970-01-01T00:00:00Z):"
        );
        assert_eq!(
            lines[1],
            "    10.0.0.1:80  weight 2  active 3  fails 0  [healthy]  \
             probes in a row: 0 failed, 4 passed, last 250 ms ago, status 200"
        );
        assert_eq!(
            lines[2],
            "    10.0.0.2:80  weight 1  active 0  fails 1  \
             [unhealthy: connect: connection refused]  probes in a row: 3 failed, 0 passed, \
             last 900 ms ago"
        );
        assert_eq!(
            lines[3],
            "    10.0.0.3:80  weight 1  active 0  fails 0  [checking]  \
             probes in a row: 0 failed, 0 passed"
        );
        assert!(
            lines[4]
                .starts_with("    10.0.0.4:80  weight 1  active 7  fails 0  [draining; healthy]"),
            "{lines:?}"
        );
        assert!(
            lines[5].starts_with(
                "    10.0.0.5:80  weight 1  active 0  fails 0  backup  \
                 [healthy; slow start, 13 s left]"
            ),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 6);
    }

    /// An older module's answer (no drain, no probe) still prints, and `down` shows.
    #[test]
    fn binding_show_prints_an_old_modules_state_and_an_unreachable_one() {
        let lines = live_lines(&live(crate::live_state::fixtures::OLD_JSON));
        assert_eq!(
            lines[1..],
            [
                "    10.0.0.1:80  weight 1  active 3  fails 2".to_string(),
                "    10.0.0.2:80  weight 5  active 0  fails 0  [down]".to_string(),
                "    removed, requests still in flight: 10.0.0.9:80 (2 active, removed 61 s ago)"
                    .to_string(),
            ]
        );
        let mut gone = live(crate::live_state::fixtures::OLD_JSON);
        gone.error = Some("cannot reach the live API at unix:/x.sock:/api/: refused".into());
        assert_eq!(
            live_lines(&gone),
            ["  live state unavailable: cannot reach the live API at unix:/x.sock:/api/: refused"]
        );
    }

    /// A module with statistics: under each server, its id, requests, 5xx, failed
    /// tries, response time and the probe's checks.
    #[test]
    fn binding_show_prints_each_servers_statistics_under_it() {
        let lines = live_lines(&live(crate::live_state::fixtures::STATS_JSON));
        assert_eq!(
            lines[1..],
            [
                "    10.0.0.1:80  weight 1  active 1  fails 0  [healthy]  \
                 probes in a row: 0 failed, 5 passed, last 300 ms ago, status 200",
                "      id 0  requests 12  5xx 1  failed tries 0  response time 25 ms  \
                 health checks 5 (0 failed, unhealthy 0 times)",
                "    10.0.0.2:80  weight 1  active 0  fails 1  \
                 [unhealthy: connect: connection refused]  \
                 probes in a row: 2 failed, 0 passed, last 700 ms ago",
                "      id 3  requests 4  5xx 0  failed tries 4  response time 0 ms  \
                 health checks 6 (6 failed, unhealthy 1 time)",
                "    10.0.0.3:80  weight 1  active 0  fails 0  backup  [checking]  \
                 probes in a row: 0 failed, 0 passed",
                "      id 4  requests 0  5xx 0  failed tries 0  response time 0 ms  \
                 health checks 0 (0 failed, unhealthy 0 times)",
            ]
        );
    }

    #[test]
    fn an_outcome_says_it_went_live_and_why() {
        let mut o = OutcomeRecord::new(0, tributary_store::OutcomeStatus::Ok);
        o.applied = Some(Applied::Live);
        o.applied_reason = Some("server set changed: PUT through the live API".into());
        assert!(
            outcome_line(&o).ends_with(
                ", applied live (no reload): server set changed: PUT through the live API"
            ),
            "{}",
            outcome_line(&o)
        );
        o.applied = Some(Applied::Reload);
        o.applied_reason = Some("the zone line changes (9 servers): needs a reload".into());
        o.reload_reason = Some(tributary_store::ReloadReason::ZoneResized);
        assert!(
            outcome_line(&o).ends_with(
                ", nginx reloaded (applied by reload, zone_resized: the zone line changes (9 \
                 servers): needs a reload)"
            ),
            "{}",
            outcome_line(&o)
        );
    }
}
