//! The login page, its form post and logout.

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::html;

use super::html::{csrf_field, error_page, page, secure};
use super::{form, get_field, require_csrf};
use crate::http::auth::session::{self, Session};
use crate::http::AppState;

pub(super) fn login_page(status: StatusCode, token: &str, error: Option<&str>) -> Response {
    let body = html! {
        h1 { "Log in" }
        @if let Some(e) = error {
            p.error role="alert" { (e) }
        }
        form.card.narrow method="post" action="/login" {
            (csrf_field(token))
            label for="password" { "Password" }
            input type="password" id="password" name="password" autocomplete="current-password" autofocus;
            button type="submit" { "Log in" }
            small {
                "The password is $TRIBUTARY_UI_PASSWORD, or the one created at first start in \
                 ui-initial-password in the daemon's data folder."
            }
        }
    };
    let mut resp = page(status, "Log in", None, body);
    if let Ok(v) = session::set_cookie(session::LOGIN_COOKIE, token, Some(3600)).parse() {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

pub(super) async fn login_form(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if session::cookie(&headers, session::SESSION_COOKIE)
        .and_then(|id| st.sessions.get(id))
        .is_some()
    {
        return Redirect::to("/ui/bindings").into_response();
    }
    match session::random_hex(32) {
        Ok(t) => login_page(StatusCode::OK, &t, None),
        Err(_) => error_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Error",
            None,
            "no randomness",
        ),
    }
}

/// 429 with `Retry-After` for a client address locked out after wrong passwords.
fn too_many(token: &str, wait: std::time::Duration) -> Response {
    let secs = session::retry_after_secs(wait);
    let mut resp = login_page(
        StatusCode::TOO_MANY_REQUESTS,
        token,
        Some(&format!(
            "Too many wrong passwords from your address: try again in {secs} s."
        )),
    );
    if let Ok(v) = secs.to_string().parse() {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

pub(super) async fn login_submit(
    State(st): State<AppState>,
    ConnectInfo(client): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
    let now = std::time::Instant::now();
    if let Err(wait) = st.login_limiter.check(client.ip(), now) {
        return too_many(&fresh, wait);
    }
    let password = get_field(&f, "password").unwrap_or("").to_string();
    let login = st.login.clone();
    let _permit = st.login_gate.acquire().await;
    let ok = tokio::task::spawn_blocking(move || login.verify(&password))
        .await
        .unwrap_or(false);
    if !ok {
        tracing::warn!(client = %client.ip(), "UI login refused: wrong password");
        if let Some(wait) = st
            .login_limiter
            .failed(client.ip(), std::time::Instant::now())
        {
            tracing::warn!(client = %client.ip(), lockout_secs = wait.as_secs(), "UI login: too many wrong passwords; address locked out");
            return too_many(&fresh, wait);
        }
        return login_page(StatusCode::UNAUTHORIZED, &fresh, Some("Wrong password."));
    }
    st.login_limiter.succeeded(client.ip());
    let id = match st.sessions.create() {
        Ok(id) => id,
        Err(_) => {
            return error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Error",
                None,
                "no randomness",
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

pub(super) async fn logout(
    State(st): State<AppState>,
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
