//! The binding page `/ui/bindings/{name}` and its refresh and delete buttons.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::html;
use serde_json::Value;
use tributary_store::{now_ms, OutcomeStatus};

use super::chart::chart;
use super::html::{csrf_field, error_page, page, time_el};
use super::live::live_card;
use super::widgets::{
    fleet_card, outcome_block, outcome_summary, state_of, store_banner, targets_table,
};
use super::{require_csrf, urlencode};
use crate::engine::EngineError;
use crate::http::auth::session::Session;
use crate::http::AppState;
use crate::live_state;
use crate::live_state::LiveState;

/// The page of binding `name`; `live` is its upstream's live state read for this page (`None`:
/// changes are not applied live, so there is no zone to read).
pub(super) fn detail_page(
    st: &AppState,
    s: &Session,
    name: &str,
    banner: Option<(&str, &str)>,
    live: Option<&LiveState>,
) -> Response {
    let d = match st.engine.show(name) {
        Ok(d) => d,
        Err(e) => return engine_page(s, e),
    };
    let b = &d.binding;
    let now = now_ms();
    let (state, class) = state_of(b, st.metrics.last_success_ms(&b.name));
    let n = &b.name;
    let decl = st.engine.host().provider(&b.plugin, &b.provider);
    let label = |k: &str| {
        decl.as_ref()
            .and_then(|d| d.field(k))
            .map(|f| f.display_name.clone())
            .unwrap_or_else(|| k.to_string())
    };
    // Charts, oldest first; failed resolutions keep the previous server count.
    let mut count = Vec::new();
    let mut latency = Vec::new();
    let mut servers_now = 0.0;
    for o in d.history.iter().rev() {
        let failed = o.status == OutcomeStatus::Failed;
        if !failed {
            servers_now = o.kept.len() as f64;
        }
        count.push((o.at_ms, servers_now, failed));
        latency.push((o.at_ms, o.duration_ms as f64, failed));
    }
    let file = std::fs::read_to_string(&b.file).ok();
    let store = st.engine.store_status();
    // How many bindings each host is behind (the whole fleet; none with one SQLite host).
    let fleet = (store.kind != "sqlite").then(|| st.engine.fleet_hosts());
    let body = html! {
        h1 { (n) " " span class={"state " (class)} { (state) } }
        (store_banner(&store))
        @if let Some((kind, text)) = banner {
            p class=(kind) role="alert" { (text) }
        }
        section.card {
            h2 { "Add at nginx's http level" }
            p {
                code #include-line { (b.include_line) } " "
                button type="button" data-copy="include-line" { "Copy" }
            }
            div.actions {
                form method="post" action={"/ui/bindings/" (n) "/refresh"} {
                    (csrf_field(&s.csrf))
                    button type="submit" { "Refresh now" }
                }
                a.button href={"/ui/bindings/" (n) "/edit"} { "Edit" }
                form method="post" action={"/ui/bindings/" (n) "/delete"}
                    data-confirm={"Delete binding " (n) " and its file?"} {
                    (csrf_field(&s.csrf))
                    button.danger type="submit" { "Delete" }
                }
            }
        }
        section.card {
            h2 { "Settings" }
            dl {
                dt { "Plugin / provider" } dd { (b.plugin) "/" (b.provider) }
                dt { "Service" } dd { (b.service) }
                dt { "Refresh interval" } dd { (b.interval_secs) " s" }
                dt { "Next refresh" }
                dd {
                    @match b.next_refresh_ms {
                        Some(t) => (time_el(t, now)),
                        None => "resolving…",
                    }
                }
                @for (k, v) in &b.config {
                    dt { (label(k)) }
                    dd {
                        @match v {
                            Value::String(s) => (s),
                            v => (v.to_string()),
                        }
                    }
                }
                @for (k, set) in &b.secrets {
                    dt { (label(k)) }
                    dd.secret { (if *set { "secret, set" } else { "secret, not set" }) }
                }
                @for dir in &b.directives {
                    dt { "Directive" } dd { code { (dir) } }
                }
                @if let Some(p) = &b.probe {
                    dt { "Health probe" } dd { code { "probe " (p) ";" } }
                }
                @if b.drain_secs > 0 {
                    dt { "Drain before removal" } dd { (b.drain_secs) " s" }
                }
            }
        }
        section.card {
            h2 { "Last resolution" }
            @match &b.last_outcome {
                Some(o) => (outcome_block(o, now)),
                None => p { "Not resolved yet." },
            }
        }
        section.card {
            h2 { "Current servers" }
            (targets_table(&b.servers))
        }
        @if let Some(l) = live {
            (live_card(l, now))
        }
        (fleet_card(&b.fleet, &store, fleet.as_ref(), b.interval_secs, now))
        @if !d.history.is_empty() {
            section.card.charts {
                h2 { "Over time" }
                (chart("Servers", &count, "servers"))
                (chart("Resolution latency", &latency, "ms"))
            }
        }
        section.card {
            h2 { "Generated file" }
            p { code { (b.file) } }
            @match &file {
                Some(t) => pre #generated-file { (t) },
                None => p { "No file yet." },
            }
        }
        section.card {
            h2 { "History" }
            table.history {
                thead {
                    tr {
                        th { "When" } th { "Outcome" } th { "Took" } th { "Servers" }
                        th { "Dropped" } th { "Changed" } th { "Reloaded" } th { "Applied" }
                        th { "Code / field" }
                    }
                }
                tbody {
                    @for o in &d.history {
                        tr class=(if o.status == OutcomeStatus::Failed { "failing" } else { "" }) {
                            td { (time_el(o.at_ms, now)) }
                            td { (outcome_summary(o)) }
                            td.num { (o.duration_ms) " ms" }
                            td.num { (o.kept.len()) }
                            td.num { (crate::resolution::dropped_total(&o.dropped)) }
                            td { (if o.changed { "yes" } else { "no" }) }
                            td { (if o.reloaded { "yes" } else { "no" }) }
                            td.applied {
                                @if let Some(a) = o.applied {
                                    (a.as_str())
                                    @if let Some(r) = o.reload_reason { " (" span.reason { (r.as_str()) } ")" }
                                    @if let Some(w) = &o.applied_reason { span.why { ": " (w) } }
                                }
                            }
                            td {
                                @match (o.code, &o.field) {
                                    (Some(c), Some(f)) => { (c) " / " (f) }
                                    (Some(c), None) => (c),
                                    (None, Some(f)) => (f),
                                    (None, None) => {},
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    page(StatusCode::OK, &b.name, Some(&s.csrf), body)
}

pub(super) fn engine_page(s: &Session, e: EngineError) -> Response {
    error_page(e.http_status(), "Error", Some(&s.csrf), &e.to_string())
}

pub(super) async fn detail(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    let live = read_live(&st, &name).await;
    // The page shows every host's state (its Fleet card): read on demand.
    st.engine.refresh_fleet(None).await;
    detail_page(&st, &s, &name, None, live.as_ref())
}

/// The live state of binding `name`'s upstream for its page (`None` when changes are not applied
/// live); waits at most `live_api::READ_TIMEOUT`.
async fn read_live(st: &AppState, name: &str) -> Option<LiveState> {
    let api = crate::http::live_api_of(&st.engine)?;
    st.engine.get(name)?;
    Some(live_state::read(api, name).await)
}

pub(super) async fn refresh(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = require_csrf(&s, &body) {
        return *r;
    }
    match st.engine.refresh(&name).await {
        Ok(_) => Redirect::to(&format!("/ui/bindings/{}", urlencode(&name))).into_response(),
        Err(e) => engine_page(&s, e),
    }
}

pub(super) async fn delete(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = require_csrf(&s, &body) {
        return *r;
    }
    match st.engine.remove(&name).await {
        Ok(_) => {
            Redirect::to(&format!("/ui/bindings?deleted={}", urlencode(&name))).into_response()
        }
        Err(e @ EngineError::Conflict(_)) => {
            let live = read_live(&st, &name).await;
            let mut r = detail_page(
                &st,
                &s,
                &name,
                Some(("error", &e.to_string())),
                live.as_ref(),
            );
            *r.status_mut() = e.http_status();
            r
        }
        Err(e) => engine_page(&s, e),
    }
}
