//! Shared pieces of the pages: a binding's state, outcome summaries and blocks, the targets table
//! and the dropped-targets list.

use maud::{html, Markup};
use serde_json::Value;
use tributary_store::{now_ms, DroppedRecord, HostState, OutcomeRecord, OutcomeStatus};

use super::html::{fmt_time, time_el};
use crate::view::BindingView;

/// The state word and CSS class of a binding: ok, unchanged, failing, stale since ..., pending.
pub fn state_of(b: &BindingView, last_success_ms: Option<i64>) -> (String, &'static str) {
    match &b.last_outcome {
        None => ("pending".into(), "pending"),
        Some(o) => match o.status {
            OutcomeStatus::Ok => ("ok".into(), "ok"),
            OutcomeStatus::Unchanged => ("unchanged".into(), "ok"),
            OutcomeStatus::Failed => match last_success_ms {
                // Failing for longer than two intervals: the servers may be out of date.
                Some(at) if now_ms() - at > 2 * 1000 * b.interval_secs as i64 => {
                    (format!("stale since {}", fmt_time(at)), "failing")
                }
                _ => ("failing".into(), "failing"),
            },
        },
    }
}

pub(super) fn outcome_summary(o: &OutcomeRecord) -> Markup {
    html! {
        span class={"status " (o.status.as_str())} { (o.status.as_str()) }
        @if let Some(kind) = o.failure {
            " " span.failure { (kind.as_str()) }
        }
        @if let Some(w) = &o.why {
            " " span.why { (w) }
        }
    }
}

pub(super) fn targets_table(servers: &[Value]) -> Markup {
    if servers.is_empty() {
        return html! { p { "No servers known." } };
    }
    let txt = |t: &Value, k: &str| match &t[k] {
        Value::String(v) => v.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    };
    html! {
        table.servers {
            thead { tr { th { "Address" } th.num { "Port" } th.num { "Weight" } th { "Tags" } } }
            tbody {
                @for t in servers {
                    @let tags = t["tags"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "))
                        .unwrap_or_default();
                    tr {
                        td { (txt(t, "address")) }
                        td.num { (txt(t, "port")) }
                        td.num { (txt(t, "weight")) }
                        td { (tags) }
                    }
                }
            }
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

pub(super) fn outcome_block(o: &OutcomeRecord, now: i64) -> Markup {
    html! {
        dl.outcome {
            dt { "When" } dd { (time_el(o.at_ms, now)) }
            dt { "Outcome" } dd { (outcome_summary(o)) }
            dt { "Took" } dd { (o.duration_ms) " ms" }
            dt { "Valid targets" } dd { (o.kept.len()) }
            @if let Some(c) = o.code {
                dt { "Plugin error code" } dd.code { (c) }
            }
            @if let Some(f) = &o.field {
                dt { "Field at fault" } dd.field { (f) }
            }
            @if let Some(t) = o.ttl_seconds {
                dt { "TTL" } dd { (t) " s" }
            }
            dt { "File changed" } dd { (yes_no(o.changed)) }
            dt { "nginx reloaded" } dd { (yes_no(o.reloaded)) }
            @if let Some(a) = o.applied {
                dt { "Applied" } dd.applied { (a.as_str()) @if let Some(r) = o.reload_reason { " (" (r.as_str()) ")" } @if let Some(w) = &o.applied_reason { " — " (w) } }
            }
        }
        @if !o.dropped.is_empty() {
            h3 { "Dropped targets" }
            (dropped_list(&o.dropped))
        }
        @if let Some(e) = &o.nginx_error {
            h3 { "nginx said" }
            pre.nginx-error { (e.trim()) }
        }
    }
}

/// The dropped targets of an answer, each with its reason.
pub(super) fn dropped_list(dropped: &[DroppedRecord]) -> Markup {
    html! {
        ul.dropped {
            @for d in dropped {
                li { code { (d.target.to_string()) } ": " (d.reason) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn view(last: Option<OutcomeStatus>) -> BindingView {
        BindingView {
            name: "api".into(),
            plugin: "static".into(),
            provider: "static".into(),
            service: "demo".into(),
            interval_secs: 60,
            directives: vec![],
            config: BTreeMap::new(),
            secrets: BTreeMap::new(),
            include_line: "include upstreams/api.conf;".into(),
            file: "/x/upstreams/api.conf".into(),
            last_outcome: last.map(|status| OutcomeRecord {
                duration_ms: 1,
                ..OutcomeRecord::new(now_ms(), status)
            }),
            servers: vec![],
            next_refresh_ms: None,
            consecutive_failures: 0,
            fleet: Default::default(),
            drain_secs: 0,
            probe: None,
        }
    }

    #[test]
    fn binding_states() {
        assert_eq!(state_of(&view(None), None).0, "pending");
        assert_eq!(state_of(&view(Some(OutcomeStatus::Ok)), None).0, "ok");
        assert_eq!(
            state_of(&view(Some(OutcomeStatus::Unchanged)), None).0,
            "unchanged"
        );
        let failed = view(Some(OutcomeStatus::Failed));
        assert_eq!(state_of(&failed, None), ("failing".into(), "failing"));
        // A success within two intervals: failing; older: stale since that success.
        assert_eq!(state_of(&failed, Some(now_ms() - 60_000)).0, "failing");
        let old = 1_700_000_000_000;
        assert_eq!(
            state_of(&failed, Some(old)),
            ("stale since 2023-11-14 22:13:20Z".into(), "failing")
        );
    }

    #[test]
    fn outcome_summary_shows_the_failure_kind() {
        let mut v = view(Some(OutcomeStatus::Failed));
        let o = v.last_outcome.as_mut().unwrap();
        o.failure = Some(tributary_store::Failure::ReloadFailed);
        o.why = Some("nginx <rejected>".into());
        let html = outcome_summary(o).into_string();
        assert!(
            html.contains(r#"<span class="failure">reload_failed</span>"#),
            "{html}"
        );
        assert!(html.contains("nginx &lt;rejected&gt;"), "{html}");
        let ok = view(Some(OutcomeStatus::Ok));
        let html = outcome_summary(ok.last_outcome.as_ref().unwrap()).into_string();
        assert!(!html.contains("failure"), "{html}");
    }
}

/// The banner every binding page shows while the store is unreachable (empty while connected).
pub(super) fn store_banner(store: &crate::view::StoreView) -> Markup {
    html! {
        @if !store.connected {
            p.error.store-down role="alert" {
                "Store unreachable"
                @if let Some(since) = store.unreachable_since_ms {
                    " since " (time_el(since, now_ms()))
                }
                ": the " (store.kind) " store is unreachable"
                @if let Some(e) = &store.last_error {
                    " (" (e) ")"
                }
                ": this host keeps serving its last applied servers; changes of bindings and new \
                 target sets reach it when the store answers again."
            }
        }
    }
}

/// The fleet card of a binding page: who resolves it, how old its newest target set is, each
/// host's state and, with `summary` (the whole fleet's numbers), how many bindings each host is
/// behind. With one host and the SQLite store there is no fleet to show: nothing.
pub(super) fn fleet_card(
    fleet: &crate::view::BindingFleet,
    store: &crate::view::StoreView,
    summary: Option<&crate::view::FleetHosts>,
    interval_secs: u64,
    now: i64,
) -> Markup {
    let single = store.kind == "sqlite" && fleet.hosts.len() <= 1;
    let old = fleet
        .set_age_ms(now)
        .is_some_and(|age| age > 3 * 1000 * interval_secs as i64);
    let behind_of = |host: &str| {
        summary
            .and_then(|s| s.hosts.iter().find(|h| h.host == host))
            .map(|h| h.behind_bindings)
    };
    html! {
        @if !single {
            section.card.fleet {
                h2 { "Fleet" }
                p {
                    "Resolved by "
                    @match &fleet.resolver {
                        Some(h) => code { (h) },
                        None => "no host right now (being taken over)",
                    }
                    @if fleet.generation > 0 {
                        ", target set generation " (fleet.generation)
                    }
                    ". This host: " code { (store.host_id) } "."
                }
                p.set-age {
                    @match fleet.set_at_ms {
                        Some(at) => {
                            "Newest target set resolved "
                            @if let Some(by) = &fleet.set_resolved_by { "by " code { (by) } " " }
                            (time_el(at, now)) "."
                        }
                        None => "No target set published yet.",
                    }
                    @if let Some(here) = fleet.resolved_here_ms {
                        " This host last resolved it " (time_el(here, now)) "."
                    }
                    @if old {
                        " " span.status.failed {
                            "not resolved for over 3 intervals as far as this host knows"
                        }
                    }
                }
                @if fleet.hosts.is_empty() {
                    p { "No host has applied this binding yet." }
                } @else {
                    table.fleet-hosts {
                        thead {
                            tr {
                                th { "Host" } th { "State" } th { "Servers" }
                                th { "Generation" } th { "Since" }
                                @if summary.is_some() { th { "Behind on" } }
                                th { "Message" }
                            }
                        }
                        tbody {
                            @for h in &fleet.hosts {
                                tr data-host=(h.host) {
                                    td {
                                        code { (h.host) }
                                        @if !h.alive { " " span.why { "(not live)" } }
                                    }
                                    td {
                                        span class={"status " (match h.state {
                                            HostState::Applied => "ok",
                                            HostState::Failed => "failed",
                                            HostState::Stale => "stale",
                                        })} { (h.state.as_str()) }
                                        @if fleet.is_behind(&h.host) {
                                            " " span.why { "(behind)" }
                                        }
                                    }
                                    td { (h.servers) }
                                    td { (h.generation) }
                                    td { (time_el(h.at_ms, now)) }
                                    @if summary.is_some() {
                                        td.behind {
                                            @match behind_of(&h.host) {
                                                Some(1) => "1 binding",
                                                Some(n) => { (n) " bindings" }
                                                None => "",
                                            }
                                        }
                                    }
                                    td {
                                        @if let Some(m) = &h.message { pre.failure { (m) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod fleet_tests {
    use super::*;
    use crate::view::{BindingFleet, FleetHostView, StoreView};

    fn store(kind: &str, connected: bool) -> StoreView {
        StoreView {
            kind: kind.into(),
            host_id: "h1".into(),
            connected,
            unreachable_since_ms: (!connected).then_some(1_000),
            last_error: (!connected).then(|| "connection refused".into()),
            location: "x".into(),
        }
    }

    fn host(id: &str, state: HostState, message: Option<&str>) -> FleetHostView {
        FleetHostView {
            host: id.into(),
            state,
            alive: id != "h3",
            at_ms: 1_000,
            generation: 2,
            servers: 1,
            message: message.map(str::to_string),
        }
    }

    #[test]
    fn a_single_sqlite_host_shows_no_fleet_and_no_banner() {
        let fleet = BindingFleet {
            resolver: Some("h1".into()),
            generation: 1,
            hosts: vec![host("h1", HostState::Applied, None)],
            ..BindingFleet::default()
        };
        let s = store("sqlite", true);
        assert_eq!(fleet_card(&fleet, &s, None, 10, 2_000).into_string(), "");
        assert_eq!(store_banner(&s).into_string(), "");
    }

    #[test]
    fn a_fleet_shows_every_host_and_an_unreachable_store_a_banner() {
        let fleet = BindingFleet {
            resolver: Some("h2".into()),
            generation: 2,
            hosts: vec![
                host("h1", HostState::Applied, None),
                host("h2", HostState::Failed, Some("[emerg] <bad>")),
                host("h3", HostState::Stale, Some("store unreachable")),
            ],
            ..BindingFleet::default()
        };
        let html = fleet_card(&fleet, &store("etcd", true), None, 10, 2_000).into_string();
        assert!(html.contains("Resolved by <code>h2</code>"), "{html}");
        assert_eq!(html.matches("<tr data-host=").count(), 3, "{html}");
        assert!(html.contains("[emerg] &lt;bad&gt;"), "escaped: {html}");
        assert!(html.contains("(not live)"), "{html}");
        let banner = store_banner(&store("etcd", false)).into_string();
        assert!(
            banner.contains("Store unreachable") && banner.contains("connection refused"),
            "{banner}"
        );
        assert!(
            banner.contains("keeps serving its last applied servers"),
            "{banner}"
        );
    }

    #[test]
    fn the_fleet_card_shows_the_set_age_and_how_many_bindings_each_host_is_behind() {
        use crate::view::{FleetHostSummary, FleetHosts};
        let mut fleet = BindingFleet {
            resolver: Some("h1".into()),
            generation: 3,
            hosts: vec![
                host("h1", HostState::Applied, None),
                host("h2", HostState::Failed, Some("refused")),
            ],
            set_at_ms: Some(1_000),
            set_resolved_by: Some("h1".into()),
            resolved_here_ms: None,
        };
        fleet.hosts[0].generation = 3;
        fleet.hosts[1].generation = 3;
        let summary = FleetHosts {
            host_id: "h1".into(),
            store: "etcd".into(),
            hosts: ["h1", "h2"]
                .iter()
                .zip([0, 7])
                .map(|(h, n)| FleetHostSummary {
                    host: h.to_string(),
                    alive: true,
                    behind_bindings: n,
                    behind: vec![],
                    resolves: 0,
                })
                .collect(),
            bindings: vec![],
        };
        let s = store("etcd", true);
        // 20 s after the set, interval 10 s: fine.
        let html = fleet_card(&fleet, &s, Some(&summary), 10, 21_000).into_string();
        assert!(
            html.contains("Newest target set resolved by <code>h1</code>"),
            "{html}"
        );
        assert!(
            html.contains("7 bindings") && html.contains("0 bindings"),
            "{html}"
        );
        // The failed host is behind though it attempted the newest generation.
        assert_eq!(html.matches("(behind)").count(), 1, "{html}");
        assert!(!html.contains("over 3 intervals"), "{html}");
        // 40 s after it: past 3 intervals.
        let html = fleet_card(&fleet, &s, Some(&summary), 10, 41_000).into_string();
        assert!(html.contains("not resolved for over 3 intervals"), "{html}");
        // This host resolved it since: not old.
        fleet.resolved_here_ms = Some(40_000);
        let html = fleet_card(&fleet, &s, Some(&summary), 10, 41_000).into_string();
        assert!(
            !html.contains("over 3 intervals") && html.contains("This host last resolved it"),
            "{html}"
        );
    }
}
