//! The login page, its form post and logout.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::html;

use super::{form, get_field, require_csrf};
use crate::web::html::{csrf_field, error_page, page, secure};
use crate::web::session::{self, Session};
use crate::web::WebState;

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

pub(super) async fn login_form(State(st): State<WebState>, headers: HeaderMap) -> Response {
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

pub(super) async fn login_submit(
    State(st): State<WebState>,
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
