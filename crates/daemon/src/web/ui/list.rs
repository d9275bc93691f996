//! The bindings list `/ui/bindings`.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

use super::now_ms;
use super::widgets::{outcome_summary, state_of};
use crate::web::html::{esc, page, time_el};
use crate::web::session::Session;
use crate::web::WebState;

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    pub(super) deleted: Option<String>,
}

pub(super) async fn list(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Query(q): Query<ListQuery>,
) -> Response {
    let now = now_ms();
    let bindings = st.api.engine.list();
    let mut body = String::from("<h1>Bindings</h1>");
    if let Some(d) = &q.deleted {
        body.push_str(&format!(
            "<p class=\"notice\" role=\"status\">Deleted binding {} and its file.</p>",
            esc(d)
        ));
    }
    if bindings.is_empty() {
        body.push_str("<p>No bindings yet. <a href=\"/ui/new\">Create one</a>.</p>");
    } else {
        body.push_str(
            "<table class=\"bindings\"><thead><tr><th>Name</th><th>Service</th><th>Provider</th>\
             <th>State</th><th>Servers</th><th>Last resolution</th><th>Next refresh</th></tr>\
             </thead><tbody>",
        );
        for b in &bindings {
            let (state, class) = state_of(b, st.metrics.last_success_ms(&b.name));
            let last = match &b.last_outcome {
                Some(o) => format!("{} {}", time_el(o.at_ms, now), outcome_summary(o)),
                None => "not resolved yet".into(),
            };
            let next = match b.next_refresh_ms {
                Some(n) => time_el(n, now),
                None => "resolving…".into(),
            };
            body.push_str(&format!(
                "<tr class=\"{class}\" data-binding=\"{n}\"><td><a href=\"/ui/bindings/{n}\">{n}</a></td>\
                 <td>{}</td><td>{}/{}</td><td><span class=\"state {class}\">{}</span></td>\
                 <td class=\"num\">{}</td><td>{last}</td><td>{next}</td></tr>",
                esc(&b.service),
                esc(&b.plugin),
                esc(&b.provider),
                esc(&state),
                b.servers.len(),
                n = esc(&b.name),
            ));
        }
        body.push_str("</tbody></table>");
    }
    page(StatusCode::OK, "Bindings", Some(&s.csrf), &body)
}
