//! The binding page's "Live in nginx" card: each server as nginx runs it now (read from the
//! module's live API when the page is rendered), with a state badge per server.

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
    html! {
        table.live-servers {
            thead {
                tr {
                    th { "Address" } th { "Weight" } th { "Active" } th { "Fails" } th { "State" }
                    @if probed { th { "Probes in a row" } th { "Last probe" } }
                }
            }
            tbody {
                @for s in servers {
                    tr data-address=(s.address) {
                        td { code { (s.address) } @if s.backup { " (backup)" } }
                        td.num.weight { (s.weight) }
                        td.num.active { (s.active) }
                        td.num.fails { (s.fails) }
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
