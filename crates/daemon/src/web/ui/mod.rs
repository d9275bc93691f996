//! The web UI: server-rendered pages (no build step, no CDN), a little vanilla JS for the copy
//! button and delete confirmation (`assets/app.js`), a stylesheet (`assets/style.css`).
//!
//! Pages: `/login`; `/ui/bindings` (list); `/ui/bindings/{name}` (servers, last outcomes, chart,
//! generated file, include line, refresh/edit/delete); `/ui/new` (provider choice, then the form);
//! `/ui/bindings/{name}/edit`; `/ui/nginx`. Forms are generated from the provider's
//! `configuration.fields`; secret fields are password inputs that are never filled in.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::Value;
use tributary_protocol::{FieldType, ProviderDecl};
use tributary_store::{DroppedRecord, OutcomeRecord, OutcomeStatus};

use super::api_extra::{preview, Preview};
use super::html::{esc, fmt_time, page, secure, time_el};
use super::session::{self, Session};
use super::WebState;
use crate::engine::EngineError;
use crate::view::{BindingInput, BindingView};

const STYLE: &str = include_str!("../../assets/style.css");
const SCRIPT: &str = include_str!("../../assets/app.js");

/// The UI routes.
pub fn router(st: WebState) -> Router {
    let authed = Router::new()
        .route("/ui/bindings", get(list))
        .route("/ui/new", get(new_form).post(new_submit))
        .route("/ui/bindings/{name}", get(detail))
        .route("/ui/bindings/{name}/edit", get(edit_form).post(edit_submit))
        .route("/ui/bindings/{name}/refresh", post(refresh))
        .route("/ui/bindings/{name}/delete", post(delete))
        .route("/ui/nginx", get(nginx_page))
        .route("/logout", post(logout))
        .layer(middleware::from_fn_with_state(st.clone(), require_session))
        .with_state(st.clone());
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/bindings") }))
        .route("/login", get(login_form).post(login_submit))
        .route("/ui/assets/style.css", get(|| asset("text/css", STYLE)))
        .route(
            "/ui/assets/app.js",
            get(|| asset("text/javascript", SCRIPT)),
        )
        .with_state(st)
        .merge(authed)
}

async fn asset(kind: &'static str, text: &'static str) -> Response {
    secure(([(header::CONTENT_TYPE, kind)], text).into_response())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn require_session(State(st): State<WebState>, mut req: Request, next: Next) -> Response {
    let s =
        session::cookie(req.headers(), session::SESSION_COOKIE).and_then(|id| st.sessions.get(id));
    match s {
        Some(s) => {
            req.extensions_mut().insert(s);
            next.run(req).await
        }
        None => secure(Redirect::to("/login").into_response()),
    }
}

/// A form body as key/value pairs (repeated keys kept).
fn form(body: &Bytes) -> Result<Vec<(String, String)>, Box<Response>> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).map_err(|_| {
        Box::new(page(
            StatusCode::BAD_REQUEST,
            "Bad request",
            None,
            "<p class=\"error\">The form could not be read.</p>",
        ))
    })
}

/// Refuses a posted form (unreadable, or a CSRF token not the session's) for the action buttons.
fn require_csrf(s: &Session, body: &Bytes) -> Result<(), Box<Response>> {
    check_csrf(s, &form(body)?)
}

fn get_field<'a>(f: &'a [(String, String)], key: &str) -> Option<&'a str> {
    f.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Checks the form's CSRF token against the session's.
fn check_csrf(s: &Session, f: &[(String, String)]) -> Result<(), Box<Response>> {
    match get_field(f, "csrf") {
        Some(t) if session::equal(t, &s.csrf) => Ok(()),
        _ => Err(Box::new(page(
            StatusCode::FORBIDDEN,
            "Forbidden",
            Some(&s.csrf),
            "<p class=\"error\">The form's security token is missing or stale: reload the page \
             and try again.</p>",
        ))),
    }
}

// ---- login ---------------------------------------------------------------------------------

fn login_page(status: StatusCode, token: &str, error: Option<&str>) -> Response {
    let err = error
        .map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>", esc(e)))
        .unwrap_or_default();
    let body = format!(
        "<h1>Log in</h1>{err}<form method=\"post\" action=\"/login\" class=\"card narrow\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label for=\"password\">Password</label>\
         <input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" autofocus>\
         <button type=\"submit\">Log in</button>\
         <small>The password is $TRIBUTARY_UI_PASSWORD, or the one created at first start in \
         ui-initial-password in the daemon's data folder.</small></form>",
        esc(token)
    );
    let mut resp = page(status, "Log in", None, &body);
    if let Ok(v) = session::set_cookie(session::LOGIN_COOKIE, token, Some(3600)).parse() {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

async fn login_form(State(st): State<WebState>, headers: HeaderMap) -> Response {
    if session::cookie(&headers, session::SESSION_COOKIE)
        .and_then(|id| st.sessions.get(id))
        .is_some()
    {
        return Redirect::to("/ui/bindings").into_response();
    }
    match session::random_hex(32) {
        Ok(t) => login_page(StatusCode::OK, &t, None),
        Err(_) => page(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Error",
            None,
            "<p>no randomness</p>",
        ),
    }
}

async fn login_submit(State(st): State<WebState>, headers: HeaderMap, body: Bytes) -> Response {
    let f = match form(&body) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let fresh = session::random_hex(32).unwrap_or_default();
    let cookie_token = session::cookie(&headers, session::LOGIN_COOKIE).unwrap_or("");
    let form_token = get_field(&f, "csrf").unwrap_or("");
    if cookie_token.len() != 64 || !session::equal(cookie_token, form_token) {
        return login_page(
            StatusCode::FORBIDDEN,
            &fresh,
            Some("The login form expired: please try again."),
        );
    }
    let password = get_field(&f, "password").unwrap_or("").to_string();
    let login = st.login.clone();
    let _permit = st.login_gate.acquire().await;
    let ok = tokio::task::spawn_blocking(move || login.verify(&password))
        .await
        .unwrap_or(false);
    if !ok {
        tracing::warn!("UI login refused: wrong password");
        return login_page(StatusCode::UNAUTHORIZED, &fresh, Some("Wrong password."));
    }
    let id = match st.sessions.create() {
        Ok(id) => id,
        Err(_) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Error",
                None,
                "<p>no randomness</p>",
            )
        }
    };
    let mut resp = Redirect::to("/ui/bindings").into_response();
    let h = resp.headers_mut();
    if let Ok(v) = session::set_cookie(session::SESSION_COOKIE, &id, None).parse() {
        h.append(header::SET_COOKIE, v);
    }
    if let Ok(v) = session::set_cookie(session::LOGIN_COOKIE, "", Some(0)).parse() {
        h.append(header::SET_COOKIE, v);
    }
    secure(resp)
}

async fn logout(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = require_csrf(&s, &body) {
        return *r;
    }
    if let Some(id) = session::cookie(&headers, session::SESSION_COOKIE) {
        st.sessions.remove(id);
    }
    let mut resp = Redirect::to("/login").into_response();
    if let Ok(v) = session::set_cookie(session::SESSION_COOKIE, "", Some(0)).parse() {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    secure(resp)
}

// ---- state of a binding --------------------------------------------------------------------

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

fn outcome_summary(o: &OutcomeRecord) -> String {
    let mut s = format!(
        "<span class=\"status {}\">{}</span>",
        o.status.as_str(),
        o.status.as_str()
    );
    if let Some(w) = &o.why {
        s.push_str(&format!(" <span class=\"why\">{}</span>", esc(w)));
    }
    s
}

// ---- list ----------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    deleted: Option<String>,
}

async fn list(
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

// ---- detail --------------------------------------------------------------------------------

fn chart(title: &str, points: &[(i64, f64, bool)], unit: &str) -> String {
    const W: f64 = 320.0;
    const H: f64 = 90.0;
    if points.is_empty() {
        return String::new();
    }
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0);
    let step = if points.len() > 1 {
        (W - 20.0) / (points.len() - 1) as f64
    } else {
        0.0
    };
    let xy: Vec<(f64, f64)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| (10.0 + step * i as f64, H - 10.0 - (p.1 / max) * (H - 25.0)))
        .collect();
    let line: Vec<String> = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let mut dots = String::new();
    for ((x, y), p) in xy.iter().zip(points) {
        dots.push_str(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" class=\"{}\"><title>{}: {} {unit}</title></circle>",
            if p.2 { "bad" } else { "good" },
            fmt_time(p.0),
            p.1
        ));
    }
    format!(
        "<figure class=\"chart\"><figcaption>{t} (max {max} {unit})</figcaption>\
         <svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{t}\">\
         <polyline points=\"{}\" fill=\"none\" stroke=\"#2a6fb0\" stroke-width=\"2\"/>{dots}</svg></figure>",
        line.join(" "),
        t = esc(title)
    )
}

fn targets_table(servers: &[Value]) -> String {
    if servers.is_empty() {
        return "<p>No servers known.</p>".into();
    }
    let mut s = String::from(
        "<table class=\"servers\"><thead><tr><th>Address</th><th class=\"num\">Port</th><th class=\"num\">Weight</th>\
         <th>Tags</th></tr></thead><tbody>",
    );
    for t in servers {
        let txt = |k: &str| match &t[k] {
            Value::String(v) => v.clone(),
            Value::Null => String::new(),
            v => v.to_string(),
        };
        let tags = t["tags"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        s.push_str(&format!(
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&txt("address")),
            esc(&txt("port")),
            esc(&txt("weight")),
            esc(&tags)
        ));
    }
    s.push_str("</tbody></table>");
    s
}

fn outcome_block(o: &OutcomeRecord, now: i64) -> String {
    let mut s = format!(
        "<dl class=\"outcome\"><dt>When</dt><dd>{}</dd><dt>Outcome</dt><dd>{}</dd>\
         <dt>Took</dt><dd>{} ms</dd><dt>Valid targets</dt><dd>{}</dd>",
        time_el(o.at_ms, now),
        outcome_summary(o),
        o.duration_ms,
        o.kept.len()
    );
    if let Some(c) = o.code {
        s.push_str(&format!(
            "<dt>Plugin error code</dt><dd class=\"code\">{c}</dd>"
        ));
    }
    if let Some(f) = &o.field {
        s.push_str(&format!(
            "<dt>Field at fault</dt><dd class=\"field\">{}</dd>",
            esc(f)
        ));
    }
    if let Some(t) = o.ttl_seconds {
        s.push_str(&format!("<dt>TTL</dt><dd>{t} s</dd>"));
    }
    s.push_str(&format!(
        "<dt>File changed</dt><dd>{}</dd><dt>nginx reloaded</dt><dd>{}</dd>",
        if o.changed { "yes" } else { "no" },
        if o.reloaded { "yes" } else { "no" }
    ));
    s.push_str("</dl>");
    if !o.dropped.is_empty() {
        s.push_str("<h3>Dropped targets</h3>");
        s.push_str(&dropped_list(&o.dropped));
    }
    if let Some(e) = &o.nginx_error {
        s.push_str(&format!(
            "<h3>nginx said</h3><pre class=\"nginx-error\">{}</pre>",
            esc(e.trim())
        ));
    }
    s
}

fn detail_page(st: &WebState, s: &Session, name: &str, banner: Option<(&str, &str)>) -> Response {
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
            o.dropped.len(),
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

fn engine_page(s: &Session, e: EngineError) -> Response {
    let status = match &e {
        EngineError::NotFound(_) => StatusCode::NOT_FOUND,
        EngineError::Invalid { .. } => StatusCode::BAD_REQUEST,
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

async fn detail(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    detail_page(&st, &s, &name, None)
}

async fn refresh(
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

async fn delete(
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

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)])
        .map(|t| t[2..].to_string())
        .unwrap_or_default()
}

// ---- create / edit form --------------------------------------------------------------------

/// What the form shows: the person's values (never secret values), errors by field, a preview.
#[derive(Default)]
struct FormState {
    name: String,
    service: String,
    interval: String,
    directives: String,
    values: BTreeMap<String, String>,
    checked: BTreeSet<String>,
    errors: BTreeMap<String, String>,
    top_error: Option<String>,
    preview: Option<Preview>,
}

const FIXED: [&str; 6] = [
    "name",
    "service",
    "interval_secs",
    "directives",
    "plugin",
    "provider",
];

fn field_error(st: &FormState, key: &str) -> String {
    st.errors
        .get(key)
        .map(|m| {
            format!(
                "<span class=\"field-error\" id=\"err-{}\" role=\"alert\">{}</span>",
                esc(key),
                esc(m)
            )
        })
        .unwrap_or_default()
}

fn input_row(
    label: &str,
    id: &str,
    required: bool,
    control: &str,
    hint: Option<&str>,
    err: &str,
) -> String {
    format!(
        "<div class=\"row{}\"><label for=\"{id}\">{}{}</label>{control}{}{err}</div>",
        if err.is_empty() { "" } else { " invalid" },
        esc(label),
        if required {
            " <span class=\"req\" title=\"required\">*</span>"
        } else {
            ""
        },
        hint.map(|h| format!("<small>{}</small>", esc(h)))
            .unwrap_or_default()
    )
}

fn render_form(
    s: &Session,
    decl: &ProviderDecl,
    plugin: &str,
    edit: Option<&BindingView>,
    fs: &FormState,
    status: StatusCode,
) -> Response {
    let action = match edit {
        Some(b) => format!("/ui/bindings/{}/edit", esc(&b.name)),
        None => "/ui/new".into(),
    };
    let title = match edit {
        Some(b) => format!("Edit {}", b.name),
        None => format!("New binding: {}", decl.name),
    };
    let mut body = format!("<h1>{}</h1>", esc(&title));
    if let Some(e) = &fs.top_error {
        body.push_str(&format!("<p class=\"error\" role=\"alert\">{}</p>", esc(e)));
    }
    body.push_str(&format!(
        "<form method=\"post\" action=\"{action}\" class=\"card binding-form\" novalidate>\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"plugin\" value=\"{}\"><input type=\"hidden\" name=\"provider\" value=\"{}\">\
         <p>Plugin <b>{}</b>, provider <b>{}</b> ({})</p>",
        esc(&s.csrf),
        esc(plugin),
        esc(&decl.code),
        esc(plugin),
        esc(&decl.code),
        esc(&decl.name)
    ));
    let name_ctl = match edit {
        Some(b) => format!("<input id=\"f-name\" name=\"name\" value=\"{}\" readonly>", esc(&b.name)),
        None => format!(
            "<input id=\"f-name\" name=\"name\" value=\"{}\" required pattern=\"[A-Za-z0-9_][A-Za-z0-9_.\\-]*\">",
            esc(&fs.name)
        ),
    };
    body.push_str(&input_row(
        "Upstream name",
        "f-name",
        true,
        &name_ctl,
        Some("letters, digits, _ - . (the file is upstreams/<name>.conf)"),
        &field_error(fs, "name"),
    ));
    body.push_str(&input_row(
        "Service",
        "f-service",
        true,
        &format!(
            "<input id=\"f-service\" name=\"service\" value=\"{}\" required>",
            esc(&fs.service)
        ),
        Some("the service in the provider's own terms"),
        &field_error(fs, "service"),
    ));
    for f in &decl.configuration.fields {
        let id = format!("cfg-{}", f.key);
        let name = format!("cfg.{}", f.key);
        let err = if FIXED.contains(&f.key.as_str()) {
            String::new()
        } else {
            field_error(fs, &f.key)
        };
        let ctl = if f.field_type == FieldType::Bool {
            format!(
                "<input type=\"checkbox\" id=\"{}\" name=\"{}\" value=\"true\"{}>",
                esc(&id),
                esc(&name),
                if fs.checked.contains(&f.key) {
                    " checked"
                } else {
                    ""
                }
            )
        } else if f.secret {
            let set = edit.is_some_and(|b| b.secrets.get(&f.key).copied().unwrap_or(false));
            format!(
                "<input type=\"password\" id=\"{}\" name=\"{}\" value=\"\" autocomplete=\"new-password\" placeholder=\"{}\"{}>",
                esc(&id),
                esc(&name),
                if set { "set — leave empty to keep" } else { "" },
                if f.required && !set { " required" } else { "" }
            )
        } else {
            format!(
                "<input type=\"text\" id=\"{}\" name=\"{}\" value=\"{}\"{}{}>",
                esc(&id),
                esc(&name),
                esc(fs.values.get(&f.key).map(String::as_str).unwrap_or("")),
                if f.field_type == FieldType::Number {
                    " inputmode=\"numeric\""
                } else {
                    ""
                },
                if f.required { " required" } else { "" }
            )
        };
        body.push_str(&input_row(
            &f.display_name,
            &id,
            f.required,
            &ctl,
            f.description.as_deref(),
            &err,
        ));
    }
    body.push_str(&input_row(
        "Refresh interval (seconds)",
        "f-interval",
        false,
        &format!("<input id=\"f-interval\" name=\"interval_secs\" inputmode=\"numeric\" value=\"{}\" placeholder=\"60\">", esc(&fs.interval)),
        Some("10 to 604800; default 60"),
        &field_error(fs, "interval_secs"),
    ));
    body.push_str(&input_row(
        "Extra directives",
        "f-directives",
        false,
        &format!("<textarea id=\"f-directives\" name=\"directives\" rows=\"3\" placeholder=\"keepalive 32;\">{}</textarea>", esc(&fs.directives)),
        Some("one per line, e.g. keepalive 32;"),
        &field_error(fs, "directives"),
    ));
    body.push_str(
        "<div class=\"actions\"><button type=\"submit\" name=\"action\" value=\"save\">Save</button>\
         <button type=\"submit\" name=\"action\" value=\"test\" class=\"secondary\">Test resolve</button></div></form>",
    );
    if let Some(p) = &fs.preview {
        body.push_str("<section class=\"card preview\" id=\"preview\"><h2>Test resolve (nothing was saved or applied)</h2>");
        body.push_str(&format!(
            "<p><span class=\"status {}\">{}</span> {}</p>",
            if p.result == "ok" { "ok" } else { "failed" },
            esc(&p.result),
            esc(p.why.as_deref().unwrap_or(""))
        ));
        if let Some(c) = p.code {
            body.push_str(&format!(
                "<p>Plugin error code <span class=\"code\">{c}</span>{}</p>",
                p.field
                    .as_ref()
                    .map(|f| format!(", field <span class=\"field\">{}</span>", esc(f)))
                    .unwrap_or_default()
            ));
        }
        body.push_str(&targets_table(&p.targets));
        if !p.dropped.is_empty() {
            body.push_str(&dropped_list(&p.dropped));
        }
        if let Some(r) = &p.rendered {
            body.push_str(&format!(
                "<h3>Would be written</h3><pre id=\"preview-file\">{}</pre>",
                esc(r)
            ));
        }
        body.push_str("</section>");
    }
    page(status, &title, Some(&s.csrf), &body)
}

/// Builds the input from the form; bad interval text is reported for its field.
fn input_from_form(
    decl: &ProviderDecl,
    plugin: &str,
    f: &[(String, String)],
    fs: &mut FormState,
) -> Option<BindingInput> {
    fs.name = get_field(f, "name").unwrap_or("").trim().to_string();
    fs.service = get_field(f, "service").unwrap_or("").to_string();
    fs.interval = get_field(f, "interval_secs")
        .unwrap_or("")
        .trim()
        .to_string();
    fs.directives = get_field(f, "directives").unwrap_or("").to_string();
    let mut config = BTreeMap::new();
    for fd in &decl.configuration.fields {
        let v = get_field(f, &format!("cfg.{}", fd.key));
        if fd.field_type == FieldType::Bool {
            let on = v.is_some_and(|v| v == "true" || v == "on");
            if on {
                fs.checked.insert(fd.key.clone());
            }
            config.insert(fd.key.clone(), Value::Bool(on));
            continue;
        }
        let v = v.unwrap_or("");
        if !fd.secret {
            fs.values.insert(fd.key.clone(), v.to_string());
        }
        if !v.trim().is_empty() {
            config.insert(fd.key.clone(), Value::String(v.to_string()));
        }
    }
    let interval_secs = if fs.interval.is_empty() {
        None
    } else {
        match fs.interval.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                fs.errors.insert(
                    "interval_secs".into(),
                    "the refresh interval must be a whole number of seconds".into(),
                );
                return None;
            }
        }
    };
    Some(BindingInput {
        name: fs.name.clone(),
        plugin: plugin.to_string(),
        provider: decl.code.clone(),
        config,
        service: fs.service.clone(),
        interval_secs,
        directives: fs
            .directives
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

fn put_error(fs: &mut FormState, decl: &ProviderDecl, e: EngineError) {
    match e {
        EngineError::Invalid {
            message,
            field: Some(field),
        } if FIXED.contains(&field.as_str()) || decl.field(&field).is_some() => {
            fs.errors.insert(field, message);
        }
        EngineError::Duplicate(n) => {
            fs.errors.insert(
                "name".into(),
                format!("a binding named {n:?} already exists"),
            );
        }
        e => fs.top_error = Some(e.to_string()),
    }
}

#[derive(Debug, Deserialize)]
struct NewQuery {
    plugin: Option<String>,
    provider: Option<String>,
}

fn provider_choice(st: &WebState, s: &Session) -> Response {
    let mut body =
        String::from("<h1>New binding</h1><p>Choose a provider:</p><ul class=\"providers\">");
    for p in st.api.engine.host().plugins() {
        for pr in p.manifest.providers() {
            body.push_str(&format!(
                "<li><a href=\"/ui/new?plugin={}&amp;provider={}\">{} — {}</a> <small>({} {})</small></li>",
                esc(&urlencode(&p.name)),
                esc(&urlencode(&pr.code)),
                esc(&pr.name),
                esc(&pr.code),
                esc(&p.name),
                esc(&p.version)
            ));
        }
    }
    body.push_str("</ul>");
    page(StatusCode::OK, "New binding", Some(&s.csrf), &body)
}

async fn new_form(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Query(q): Query<NewQuery>,
) -> Response {
    let (Some(plugin), Some(provider)) = (q.plugin, q.provider) else {
        return provider_choice(&st, &s);
    };
    let Some(decl) = st.api.engine.host().provider(&plugin, &provider) else {
        return page(
            StatusCode::NOT_FOUND,
            "New binding",
            Some(&s.csrf),
            "<p class=\"error\">No such plugin or provider. <a href=\"/ui/new\">Choose one</a>.</p>",
        );
    };
    let mut fs = FormState::default();
    for f in &decl.configuration.fields {
        match (&f.default, f.field_type) {
            (Some(Value::Bool(true)), FieldType::Bool) => {
                fs.checked.insert(f.key.clone());
            }
            (Some(v), _) if !f.secret && f.field_type != FieldType::Bool => {
                let t = match v {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                fs.values.insert(f.key.clone(), t);
            }
            _ => {}
        }
    }
    render_form(&s, &decl, &plugin, None, &fs, StatusCode::OK)
}

async fn submit(st: &WebState, s: &Session, body: &Bytes, edit: Option<BindingView>) -> Response {
    let f = match form(body) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    if let Err(r) = check_csrf(s, &f) {
        return *r;
    }
    let plugin = get_field(&f, "plugin").unwrap_or("").to_string();
    let provider = get_field(&f, "provider").unwrap_or("").to_string();
    let Some(decl) = st.api.engine.host().provider(&plugin, &provider) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Bad request",
            Some(&s.csrf),
            "<p class=\"error\">No such plugin or provider.</p>",
        );
    };
    let mut fs = FormState::default();
    let input = input_from_form(&decl, &plugin, &f, &mut fs);
    if let Some(input) = &input {
        fs.errors = super::check::field_errors(&decl, input, edit.as_ref());
    }
    let Some(input) = input.filter(|_| fs.errors.is_empty()) else {
        return render_form(
            s,
            &decl,
            &plugin,
            edit.as_ref(),
            &fs,
            StatusCode::BAD_REQUEST,
        );
    };
    let path_name = edit.as_ref().map(|b| b.name.as_str());
    if get_field(&f, "action") == Some("test") {
        match preview(&st.api.engine, &input, path_name).await {
            Ok(p) => {
                fs.preview = Some(p);
                return render_form(s, &decl, &plugin, edit.as_ref(), &fs, StatusCode::OK);
            }
            Err(e) => {
                put_error(&mut fs, &decl, e);
                return render_form(
                    s,
                    &decl,
                    &plugin,
                    edit.as_ref(),
                    &fs,
                    StatusCode::BAD_REQUEST,
                );
            }
        }
    }
    let engine = &st.api.engine;
    let saved = match path_name {
        Some(n) => engine
            .put(n, &input)
            .await
            .map(|(u, v)| (u != tributary_store::Upsert::Unchanged, v.name)),
        None => engine.add(&input).await.map(|v| (true, v.name)),
    };
    match saved {
        Ok((changed, name)) => {
            if changed {
                // Show the page after the first resolution of the saved binding.
                let _ = engine.wait_first(&name).await;
            }
            Redirect::to(&format!("/ui/bindings/{}", urlencode(&name))).into_response()
        }
        Err(e) => {
            put_error(&mut fs, &decl, e);
            render_form(
                s,
                &decl,
                &plugin,
                edit.as_ref(),
                &fs,
                StatusCode::BAD_REQUEST,
            )
        }
    }
}

async fn new_submit(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    body: Bytes,
) -> Response {
    submit(&st, &s, &body, None).await
}

async fn edit_form(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
) -> Response {
    let Some(b) = st.api.engine.get(&name) else {
        return engine_page(&s, EngineError::NotFound(name));
    };
    let Some(decl) = st.api.engine.host().provider(&b.plugin, &b.provider) else {
        return page(
            StatusCode::CONFLICT,
            "Edit",
            Some(&s.csrf),
            "<p class=\"error\">The binding's plugin or provider is not loaded.</p>",
        );
    };
    let mut fs = FormState {
        name: b.name.clone(),
        service: b.service.clone(),
        interval: b.interval_secs.to_string(),
        directives: b.directives.join("\n"),
        ..FormState::default()
    };
    for (k, v) in &b.config {
        match v {
            Value::Bool(true) => {
                fs.checked.insert(k.clone());
            }
            Value::Bool(false) => {}
            Value::String(t) => {
                fs.values.insert(k.clone(), t.clone());
            }
            v => {
                fs.values.insert(k.clone(), v.to_string());
            }
        }
    }
    let plugin = b.plugin.clone();
    render_form(&s, &decl, &plugin, Some(&b), &fs, StatusCode::OK)
}

async fn edit_submit(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let Some(b) = st.api.engine.get(&name) else {
        return engine_page(&s, EngineError::NotFound(name));
    };
    submit(&st, &s, &body, Some(b)).await
}

// ---- nginx ---------------------------------------------------------------------------------

async fn nginx_page(State(st): State<WebState>, Extension(s): Extension<Session>) -> Response {
    let now = now_ms();
    let n = super::api_extra::nginx_status(&st);
    let mut body = format!(
        "<h1>nginx</h1><section class=\"card\"><dl><dt>Conf dir</dt><dd><code>{}</code></dd>\
         <dt>Upstream files</dt><dd><code>{}</code>: {}</dd><dt>Apply batches</dt><dd>{}</dd>\
         <dt>Reloads</dt><dd>{}</dd><dt>Changes refused by nginx -t</dt><dd>{}</dd>\
         <dt>Last successful reload</dt><dd>{}</dd></dl></section>",
        esc(&n.conf_dir),
        esc(&n.upstreams_dir),
        if n.files.is_empty() {
            "none".to_string()
        } else {
            esc(&n.files.join(", "))
        },
        n.numbers.apply_batches,
        n.numbers.reloads,
        n.numbers.test_failures,
        n.numbers
            .last_reload_ms
            .map(|t| time_el(t, now))
            .unwrap_or_else(|| "none since start".into())
    );
    if let Some(f) = &n.numbers.last_test_failure {
        body.push_str(&format!(
            "<section class=\"card\"><h2>Last refused change</h2><p>{} of <a href=\"/ui/bindings/{b}\">{b}</a></p>\
             <pre class=\"nginx-error\">{}</pre></section>",
            time_el(f.at_ms, now),
            esc(f.nginx_error.trim()),
            b = esc(&f.binding)
        ));
    }
    page(StatusCode::OK, "nginx", Some(&s.csrf), &body)
}

/// The dropped targets of an answer, each with its reason.
fn dropped_list(dropped: &[DroppedRecord]) -> String {
    let mut s = String::from("<ul class=\"dropped\">");
    for d in dropped {
        s.push_str(&format!(
            "<li><code>{}</code>: {}</li>",
            esc(&d.target.to_string()),
            esc(&d.reason)
        ));
    }
    s.push_str("</ul>");
    s
}

#[cfg(test)]
mod tests {
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
                at_ms: now_ms(),
                duration_ms: 1,
                status,
                why: None,
                code: None,
                field: None,
                kept: vec![],
                dropped: vec![],
                ttl_seconds: None,
                changed: false,
                reloaded: false,
                nginx_error: None,
            }),
            servers: vec![],
            next_refresh_ms: None,
            consecutive_failures: 0,
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
    fn charts_scale_points_and_mark_failures() {
        let svg = chart("Servers", &[(0, 2.0, false), (1_000, 4.0, true)], "servers");
        assert!(svg.contains("max 4 servers"), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("class=\"bad\""));
        assert_eq!(chart("x", &[], "ms"), "");
    }

    #[test]
    fn urlencoding_of_names() {
        assert_eq!(urlencode("api.v1"), "api.v1");
        assert_eq!(urlencode("a b&c"), "a+b%26c");
    }
}
