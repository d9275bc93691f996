//! The web UI: server-rendered pages (no build step, no CDN), a little vanilla JS for the copy
//! button and delete confirmation (`assets/app.js`), a stylesheet (`assets/style.css`).
//!
//! Pages: `/login`; `/ui/bindings` (list); `/ui/bindings/{name}` (servers, last outcomes, chart,
//! generated file, include line, refresh/edit/delete); `/ui/new` (provider choice, then the form);
//! `/ui/bindings/{name}/edit`; `/ui/nginx`. Forms are generated from the provider's
//! `configuration.fields`; secret fields are password inputs that are never filled in.
//!
//! Files: `mod.rs` routes, guards the pages with a session ([`crate::http::auth::session_of`]),
//! checks CSRF tokens ([`crate::http::auth::csrf_ok`]) and reads forms; `html` the page frame,
//! security headers and times; `login`, `list`, `detail`, `edit` and
//! `nginx` are the pages; `form` renders and reads the create/edit form; `chart` draws the SVG
//! charts; `live` the binding page's live state card; `widgets` holds the pieces several pages
//! share.

mod chart;
mod detail;
mod edit;
mod form;
pub mod html;
mod list;
mod live;
mod login;
mod nginx;
mod widgets;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::html;

use crate::http::auth::session::Session;
use crate::http::auth::{csrf_ok, session_of};
use crate::http::AppState;
use html::{page, secure};

pub use widgets::state_of;

const STYLE: &str = include_str!("../../../assets/style.css");
const SCRIPT: &str = include_str!("../../../assets/app.js");

/// The UI routes.
pub fn router(st: AppState) -> Router {
    let authed = Router::new()
        .route("/ui/bindings", get(list::list))
        .route("/ui/new", get(edit::new_form).post(edit::new_submit))
        .route("/ui/bindings/{name}", get(detail::detail))
        .route(
            "/ui/bindings/{name}/edit",
            get(edit::edit_form).post(edit::edit_submit),
        )
        .route("/ui/bindings/{name}/refresh", post(detail::refresh))
        .route("/ui/bindings/{name}/delete", post(detail::delete))
        .route("/ui/nginx", get(nginx::nginx_page))
        .route("/logout", post(login::logout))
        .layer(middleware::from_fn_with_state(st.clone(), require_session))
        .with_state(st.clone());
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/bindings") }))
        .route("/login", get(login::login_form).post(login::login_submit))
        .route("/ui/assets/style.css", get(|| asset("text/css", STYLE)))
        .route(
            "/ui/assets/app.js",
            get(|| asset("text/javascript", SCRIPT)),
        )
        .with_state(st)
        .merge(authed)
}

pub(super) async fn asset(kind: &'static str, text: &'static str) -> Response {
    secure(([(header::CONTENT_TYPE, kind)], text).into_response())
}

pub(super) async fn require_session(
    State(st): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    match session_of(&st, req.headers()) {
        Some(s) => {
            req.extensions_mut().insert(s);
            next.run(req).await
        }
        None => secure(Redirect::to("/login").into_response()),
    }
}

/// A form body as key/value pairs (repeated keys kept).
pub(super) fn form(body: &Bytes) -> Result<Vec<(String, String)>, Box<Response>> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).map_err(|_| {
        Box::new(page(
            StatusCode::BAD_REQUEST,
            "Bad request",
            None,
            html! { p.error { "The form could not be read." } },
        ))
    })
}

/// Refuses a posted form (unreadable, or a CSRF token not the session's) for the action buttons.
pub(super) fn require_csrf(s: &Session, body: &Bytes) -> Result<(), Box<Response>> {
    check_csrf(s, &form(body)?)
}

pub(super) fn get_field<'a>(f: &'a [(String, String)], key: &str) -> Option<&'a str> {
    f.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Checks the form's CSRF token against the session's.
pub(super) fn check_csrf(s: &Session, f: &[(String, String)]) -> Result<(), Box<Response>> {
    if csrf_ok(s, get_field(f, "csrf")) {
        return Ok(());
    }
    Err(Box::new(page(
        StatusCode::FORBIDDEN,
        "Forbidden",
        Some(&s.csrf),
        html! {
            p.error {
                "The form's security token is missing or stale: reload the page and try again."
            }
        },
    )))
}

pub(super) fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)])
        .map(|t| t[2..].to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urlencoding_of_names() {
        assert_eq!(urlencode("api.v1"), "api.v1");
        assert_eq!(urlencode("a b&c"), "a+b%26c");
    }
}
