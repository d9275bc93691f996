//! The bindings list `/ui/bindings`.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::html;
use serde::Deserialize;
use tributary_store::now_ms;

use super::html::{page, time_el};
use super::widgets::{outcome_summary, state_of, store_banner};
use crate::http::auth::session::Session;
use crate::http::AppState;

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    pub(super) deleted: Option<String>,
}

pub(super) async fn list(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
    Query(q): Query<ListQuery>,
) -> Response {
    let now = now_ms();
    st.engine.refresh_fleet(None).await;
    let bindings = st.engine.list();
    let body = html! {
        h1 { "Bindings" }
        (store_banner(&st.engine.store_status()))
        @if let Some(d) = &q.deleted {
            p.notice role="status" { "Deleted binding " (d) " and its file." }
        }
        @if bindings.is_empty() {
            p { "No bindings yet. " a href="/ui/new" { "Create one" } "." }
        } @else {
            table.bindings {
                thead {
                    tr {
                        th { "Name" } th { "Service" } th { "Provider" } th { "State" }
                        th { "Servers" } th { "Last resolution" } th { "Next refresh" }
                    }
                }
                tbody {
                    @for b in &bindings {
                        @let (state, class) = state_of(b, st.metrics.last_success_ms(&b.name));
                        tr class=(class) data-binding=(b.name) {
                            td { a href={"/ui/bindings/" (b.name)} { (b.name) } }
                            td { (b.service) }
                            td { (b.plugin) "/" (b.provider) }
                            td { span class={"state " (class)} { (state) } }
                            td.num { (b.servers.len()) }
                            td {
                                @match &b.last_outcome {
                                    Some(o) => { (time_el(o.at_ms, now)) " " (outcome_summary(o)) }
                                    None => "not resolved yet",
                                }
                            }
                            td {
                                @match b.next_refresh_ms {
                                    Some(n) => (time_el(n, now)),
                                    None => "resolving…",
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    page(StatusCode::OK, "Bindings", Some(&s.csrf), body)
}
