//! The binding page `/ui/bindings/{name}` and its refresh and delete buttons.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use serde_json::Value;
use tributary_store::OutcomeStatus;

use super::chart::chart;
use super::widgets::{outcome_block, outcome_summary, state_of, targets_table};
use super::{now_ms, require_csrf, urlencode};
use crate::engine::EngineError;
use crate::web::html::{esc, page, time_el};
use crate::web::session::Session;
use crate::web::WebState;

pub(super) fn detail_page(
    st: &WebState,
    s: &Session,
    name: &str,
    banner: Option<(&str, &str)>,
) -> Response {
    let d = match st.api.engine.show(name) {
        Ok(d) => d,
        Err(e) => return engine_page(s, e),
    };
    let b = &d.binding;
    let now = now_ms();
    let (state, class) = state_of(b, st.metrics.last_success_ms(&b.name));
    let n = esc(&b.name);
    let csrf = esc(&s.csrf);
    let mut body = format!(
        "<h1>{n} <span class=\"state {class}\">{}</span></h1>",
        esc(&state)
    );
    if let Some((kind, text)) = banner {
        body.push_str(&format!(
            "<p class=\"{kind}\" role=\"alert\">{}</p>",
            esc(text)
        ));
    }
    body.push_str(&format!(
        "<section class=\"card\"><h2>Add at nginx's http level</h2>\
         <p><code id=\"include-line\">{}</code> \
         <button type=\"button\" data-copy=\"include-line\">Copy</button></p>\
         <div class=\"actions\">\
         <form method=\"post\" action=\"/ui/bindings/{n}/refresh\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\">Refresh now</button></form>\
         <a class=\"button\" href=\"/ui/bindings/{n}/edit\">Edit</a>\
         <form method=\"post\" action=\"/ui/bindings/{n}/delete\" data-confirm=\"Delete binding {n} and its file?\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\" class=\"danger\">Delete</button></form></div></section>",
        esc(&b.include_line)
    ));
    body.push_str(&format!(
        "<section class=\"card\"><h2>Settings</h2><dl><dt>Plugin / provider</dt><dd>{}/{}</dd>\
         <dt>Service</dt><dd>{}</dd><dt>Refresh interval</dt><dd>{} s</dd><dt>Next refresh</dt><dd>{}</dd>",
        esc(&b.plugin),
        esc(&b.provider),
        esc(&b.service),
        b.interval_secs,
        b.next_refresh_ms
            .map(|t| time_el(t, now))
            .unwrap_or_else(|| "resolving…".into())
    ));
    let decl = st.api.engine.host().provider(&b.plugin, &b.provider);
    let label = |k: &str| {
        decl.as_ref()
            .and_then(|d| d.field(k))
            .map(|f| f.display_name.clone())
            .unwrap_or_else(|| k.to_string())
    };
    for (k, v) in &b.config {
        let v = match v {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        body.push_str(&format!("<dt>{}</dt><dd>{}</dd>", esc(&label(k)), esc(&v)));
    }
    for (k, set) in &b.secrets {
        body.push_str(&format!(
            "<dt>{}</dt><dd class=\"secret\">{}</dd>",
            esc(&label(k)),
            if *set {
                "secret, set"
            } else {
                "secret, not set"
            }
        ));
    }
    for dir in &b.directives {
        body.push_str(&format!(
            "<dt>Directive</dt><dd><code>{}</code></dd>",
            esc(dir)
        ));
    }
    body.push_str("</dl></section>");

    body.push_str("<section class=\"card\"><h2>Last resolution</h2>");
    match &b.last_outcome {
        Some(o) => body.push_str(&outcome_block(o, now)),
        None => body.push_str("<p>Not resolved yet.</p>"),
    }
    body.push_str("</section>");

    body.push_str(&format!(
        "<section class=\"card\"><h2>Current servers</h2>{}</section>",
        targets_table(&b.servers)
    ));

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
    if !d.history.is_empty() {
        body.push_str(&format!(
            "<section class=\"card charts\"><h2>Over time</h2>{}{}</section>",
            chart("Servers", &count, "servers"),
            chart("Resolution latency", &latency, "ms")
        ));
    }

    let file = std::fs::read_to_string(&b.file).ok();
    body.push_str(&format!(
        "<section class=\"card\"><h2>Generated file</h2><p><code>{}</code></p>{}</section>",
        esc(&b.file),
        match file {
            Some(t) => format!("<pre id=\"generated-file\">{}</pre>", esc(&t)),
            None => "<p>No file yet.</p>".into(),
        }
    ));

    body.push_str(
        "<section class=\"card\"><h2>History</h2><table class=\"history\"><thead><tr><th>When</th>\
         <th>Outcome</th><th>Took</th><th>Servers</th><th>Dropped</th><th>Changed</th><th>Reloaded</th>\
         <th>Code / field</th></tr></thead><tbody>",
    );
    for o in &d.history {
        body.push_str(&format!(
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td class=\"num\">{} ms</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if o.status == OutcomeStatus::Failed { "failing" } else { "" },
            time_el(o.at_ms, now),
            outcome_summary(o),
            o.duration_ms,
            o.kept.len(),
            crate::resolution::dropped_total(&o.dropped),
            if o.changed { "yes" } else { "no" },
            if o.reloaded { "yes" } else { "no" },
            match (o.code, &o.field) {
                (Some(c), Some(f)) => format!("{c} / {}", esc(f)),
                (Some(c), None) => c.to_string(),
                (None, Some(f)) => esc(f),
                (None, None) => String::new(),
            }
        ));
    }
    body.push_str("</tbody></table></section>");
    page(StatusCode::OK, &b.name, Some(&s.csrf), &body)
}

pub(super) fn engine_page(s: &Session, e: EngineError) -> Response {
    let status = match &e {
        EngineError::NotFound(_) => StatusCode::NOT_FOUND,
        EngineError::Invalid(_) => StatusCode::BAD_REQUEST,
        EngineError::Duplicate(_) | EngineError::Conflict(_) => StatusCode::CONFLICT,
        EngineError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        EngineError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        EngineError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    page(
        status,
        "Error",
        Some(&s.csrf),
        &format!(
            "<p class=\"error\" role=\"alert\">{}</p><p><a href=\"/ui/bindings\">Back to the bindings</a></p>",
            esc(&e.to_string())
        ),
    )
}

pub(super) async fn detail(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    detail_page(&st, &s, &name, None)
}

pub(super) async fn refresh(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = require_csrf(&s, &body) {
        return *r;
    }
    match st.api.engine.refresh(&name).await {
        Ok(_) => Redirect::to(&format!("/ui/bindings/{}", urlencode(&name))).into_response(),
        Err(e) => engine_page(&s, e),
    }
}

pub(super) async fn delete(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = require_csrf(&s, &body) {
        return *r;
    }
    match st.api.engine.remove(&name).await {
        Ok(_) => {
            Redirect::to(&format!("/ui/bindings?deleted={}", urlencode(&name))).into_response()
        }
        Err(EngineError::Conflict(why)) => {
            let mut r = detail_page(&st, &s, &name, Some(("error", &why)));
            *r.status_mut() = StatusCode::CONFLICT;
            r
        }
        Err(e) => engine_page(&s, e),
    }
}
