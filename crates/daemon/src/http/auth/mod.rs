//! Who may call what: the API's bearer token ([`require_bearer`]), the UI's login and sessions
//! ([`session`]: password, sessions, CSRF tokens, login rate limit), and the two checks on a
//! request ([`session_of`], [`csrf_ok`]) the UI's route guard and forms use. Refusals of the
//! bearer check are the API's JSON error (`401` with `WWW-Authenticate: Bearer`); the UI renders
//! its own (a redirect to `/login`, a `403` page).

pub mod session;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;
use session::Session;

/// Whether the request carries `Authorization: Bearer <the API token>` (constant-time compare).
pub fn bearer_ok(st: &AppState, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| crate::token::equal(t.trim(), &st.token))
}

/// The live session of the request's session cookie (marks it used).
pub fn session_of(st: &AppState, headers: &HeaderMap) -> Option<Session> {
    session::cookie(headers, session::SESSION_COOKIE).and_then(|id| st.sessions.get(id))
}

/// Whether a posted form's CSRF token is the session's (constant-time compare).
pub fn csrf_ok(s: &Session, form_token: Option<&str>) -> bool {
    form_token.is_some_and(|t| session::equal(t, &s.csrf))
}

fn unauthorized() -> Response {
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong API token: send Authorization: Bearer <token>",
        None,
    )
    .into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// Middleware of the API: the bearer token, else `401`.
pub async fn require_bearer(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if bearer_ok(&st, req.headers()) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

/// Middleware of `/metrics`: a UI session or the bearer token, else `401`.
pub async fn require_bearer_or_session(
    State(st): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if session_of(&st, req.headers()).is_some() || bearer_ok(&st, req.headers()) {
        next.run(req).await
    } else {
        unauthorized()
    }
}
