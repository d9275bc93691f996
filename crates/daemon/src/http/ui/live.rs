//! The binding page's "Live in nginx" card: each server as nginx runs it now (read from the
//! module's live API when the page is rendered), with a state badge per server and, when the
//! module keeps them, its statistics: requests, 5xx responses, failed tries, average
//! response time, and the probe's checks.

use maud::{html, Markup};

use crate::live_state::LiveState;
use crate::live_state::{Badge, ServerState};

use super::html::time_el;

/// The card, or why the live state could not be read.
pub(super) fn live_card(live: &LiveState, now: i64) -> Markup {
    html! {
        section.card #live {
            h2 { "Live in nginx" }
            @match &live.error {
                Some(e) => p.error.live-unavailable role="status" { "Live state unavailable: " (e.trim()) },
                None => {
                    p.why {
                        "Read " (time_el(live.read_at_ms, now)) " from " code { (live.api) }
                        ", generation " (live.generation.unwrap_or(0)) "."
                    }
                    @if live.servers.is_empty() {
                        p { "No servers." }
                    } @else {
                        (servers_table(&live.servers))
                    }
                    @if !live.retired.is_empty() {
                        h3 { "Removed, requests still in flight" }
                        ul.retired {
                            @for r in &live.retired {
                                li {
                                    code { (r.address) } ": " (r.active) " active, removed "
                                    (r.age_ms / 1000) " s ago"
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn servers_table(servers: &[ServerState]) -> Markup {
    let probed = servers.iter().any(|s| {
        s.probe_fails.is_some() || s.probe_passes.is_some() || s.last_probe_ms_ago.is_some()
    });
    let counted = servers.iter().any(|s| s.stats.is_some());
    let checked = servers
        .iter()
        .any(|s| s.stats.is_some_and(|st| st.health_checks.is_some()));
    html! {
        table.live-servers {
            thead {
                tr {
                    th { "Address" } th { "Weight" } th { "Active" }
                    th title="failures in the current fail_timeout window" { "Fails" }
                    @if counted {
                        th title="requests sent to the server since it joined the set (or since nginx reloaded), each try counted" { "Requests" }
                        th title="5xx responses received from the server" { "5xx" }
                        th title="unsuccessful tries since it joined the set (what nginx counts toward max_fails)" { "Failed tries" }
                        th title="mean time to the end of the response over every response since the server joined the set" { "Response time" }
                    }
                    th { "State" }
                    @if probed { th { "Probes in a row" } th { "Last probe" } }
                    @if checked { th title="probes made since it joined the set" { "Health checks" } }
                }
            }
            tbody {
                @for s in servers {
                    tr data-address=(s.address) {
                        td { code { (s.address) } @if s.backup { " (backup)" } }
                        td.num.weight { (s.weight) }
                        td.num.active { (s.active) }
                        td.num.fails { (s.fails) }
                        @if counted {
                            @match &s.stats {
                                Some(st) => {
                                    td.num.requests { (st.requests) }
                                    td.num.r5xx { (st.responses.c5xx) }
                                    td.num.failed-tries { (st.fails) }
                                    td.num.response-time { (st.response_time) " ms" }
                                },
                                None => { td {} td {} td {} td {} },
                            }
                        }
                        td.badges {
                            @let badges = s.badges();
                            @if badges.is_empty() {
                                span.badge.up { "up" }
                            }
                            @for b in &badges {
                                (badge(b)) " "
                            }
                        }
                        @if probed {
                            td {
                                @if let Some(n) = s.probe_passes { (n) " passed" }
                                @if s.probe_passes.is_some() && s.probe_fails.is_some() { ", " }
                                @if let Some(n) = s.probe_fails { (n) " failed" }
                            }
                            td {
                                @if let Some(ms) = s.last_probe_ms_ago { (ms) " ms ago" }
                                @if let Some(st) = s.last_status { " (status " (st) ")" }
                            }
                        }
                        @if checked {
                            td.health-checks {
                                @if let Some(h) = s.stats.and_then(|st| st.health_checks) {
                                    (h.checks) " made, " (h.fails) " failed, unhealthy "
                                    (h.unhealthy) (if h.unhealthy == 1 { " time" } else { " times" })
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn badge(b: &Badge) -> Markup {
    html! {
        @match b {
            Badge::Unhealthy(Some(e)) => span class={"badge " (b.class())} title=(e) {
                "unhealthy: " (e)
            },
            _ => span class={"badge " (b.class())} { (b.to_string()) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(json: &str) -> LiveState {
        let s: crate::live_state::UpstreamState = serde_json::from_str(json).unwrap();
        LiveState::read("unix:/x.sock:/api/".into(), 0, s)
    }

    /// A module with probes, drain and slow start (CONTRACT.md §2): a badge per state, the last
    /// error with the unhealthy one, and the probe columns.
    #[test]
    fn the_card_shows_a_badge_per_state_from_a_probing_module() {
        let page = live_card(&state(crate::live_state::fixtures::PROBED_JSON), 1_000).into_string();
        for want in [
            r#"<span class="badge healthy">healthy</span>"#,
            r#"<span class="badge unhealthy" title="connect: connection refused">unhealthy: connect: connection refused</span>"#,
            r#"<span class="badge checking">checking</span>"#,
            r#"<span class="badge draining">draining</span>"#,
            r#"<span class="badge slow-start">slow start, 13 s left</span>"#,
            "<th>Probes in a row</th>",
            "4 passed, 0 failed",
            "250 ms ago (status 200)",
        ] {
            assert!(page.contains(want), "{want}\n{page}");
        }
    }

    /// An older module (no drain, no probe fields): the servers, their counts and `down`, no probe
    /// columns.
    #[test]
    fn the_card_renders_an_old_modules_answer() {
        let page = live_card(&state(crate::live_state::fixtures::OLD_JSON), 1_000).into_string();
        assert!(page.contains(r#"<td class="num active">3</td>"#), "{page}");
        assert!(page.contains(r#"<td class="num fails">2</td>"#), "{page}");
        assert!(
            page.contains(r#"<span class="badge down">down</span>"#),
            "{page}"
        );
        assert!(
            page.contains(r#"<span class="badge up">up</span>"#),
            "{page}"
        );
        assert!(!page.contains("Probes in a row"), "{page}");
        assert!(
            page.contains("<li><code>10.0.0.9:80</code>: 2 active, removed 61 s ago</li>"),
            "{page}"
        );
        assert!(!page.contains("healthy"), "{page}");
    }

    /// A module with statistics: per server requests, 5xx, failed tries since it
    /// joined, response time, and the probe's checks, next to its state.
    #[test]
    fn the_card_shows_each_servers_statistics_and_health() {
        let page = live_card(&state(crate::live_state::fixtures::STATS_JSON), 1_000).into_string();
        let row = |addr: &str| {
            let start = page
                .find(&format!("<tr data-address=\"{addr}\">"))
                .unwrap_or_else(|| panic!("{addr}: {page}"));
            let len = page[start..].find("</tr>").unwrap();
            page[start..start + len].to_string()
        };
        let one = row("10.0.0.1:80");
        for want in [
            r#"<td class="num requests">12</td>"#,
            r#"<td class="num r5xx">1</td>"#,
            r#"<td class="num failed-tries">0</td>"#,
            r#"<td class="num response-time">25 ms</td>"#,
            r#"<span class="badge healthy">healthy</span>"#,
            r#"<td class="health-checks">5 made, 0 failed, unhealthy 0 times</td>"#,
        ] {
            assert!(one.contains(want), "{want}\n{one}");
        }
        let two = row("10.0.0.2:80");
        for want in [
            r#"<td class="num requests">4</td>"#,
            r#"<td class="num fails">1</td>"#,
            r#"<td class="num failed-tries">4</td>"#,
            r#"<span class="badge unhealthy""#,
            r#"<td class="health-checks">6 made, 6 failed, unhealthy 1 time</td>"#,
        ] {
            assert!(two.contains(want), "{want}\n{two}");
        }
        assert!(page.contains(">Response time</th>"), "{page}");
    }

    /// Without statistics (an older module) the table has no statistics columns.
    #[test]
    fn the_card_has_no_statistics_columns_without_statistics() {
        for json in [
            crate::live_state::fixtures::OLD_JSON,
            crate::live_state::fixtures::PROBED_JSON,
        ] {
            let page = live_card(&state(json), 1_000).into_string();
            for absent in [
                "Requests",
                "Response time",
                "Health checks",
                "class=\"num requests\"",
            ] {
                assert!(!page.contains(absent), "{absent}\n{page}");
            }
        }
    }

    #[test]
    fn an_unreachable_module_is_one_line() {
        let mut l = state(crate::live_state::fixtures::OLD_JSON);
        l.error = Some("cannot reach the live API at unix:/x.sock:/api/: No such file".into());
        l.servers.clear();
        let page = live_card(&l, 0).into_string();
        assert!(
            page.contains("Live state unavailable: cannot reach the live API"),
            "{page}"
        );
        assert!(!page.contains("<table"), "{page}");
    }
}
