//! The web side of `tributary serve` next to the JSON API of [`crate::api`]:
//!
//! - [`api_extra`]: more `/api/v1` endpoints (history, test resolution, nginx status);
//! - [`openapi`]: `/api/v1/openapi.json`, the document of every `/api/v1` endpoint;
//! - [`metrics`]: `/metrics` in OpenMetrics or Prometheus text format by `Accept` (`prometheus-client`);
//! - [`session`]: the UI login (argon2 password hash), sessions, CSRF tokens, login rate limit;
//! - [`host`]: refuses requests whose `Host` is not this daemon's (DNS rebinding);
//! - [`ui`]: the server-rendered web UI under `/ui/` (plus `/`, `/login`, `/logout`).
//!
//! Access: `GET /api/v1/health` is open; `/api/v1/*` needs the bearer token; `/metrics` takes
//! the bearer token or a UI session; UI pages need a session (else they redirect to `/login`).

pub mod api_extra;
pub mod host;
pub mod html;
pub mod metrics;
pub mod openapi;
pub mod session;
pub mod ui;

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::api::ApiState;
use metrics::Metrics;
use session::{Login, Sessions};

/// What the web side needs besides the API state.
pub struct WebOptions {
    /// nginx conf dir (for the nginx status).
    pub conf_dir: PathBuf,
    pub login: Login,
    /// The `Host` values requests may carry.
    pub allowed_hosts: host::AllowedHosts,
}

/// Shared state of the web handlers.
#[derive(Clone)]
pub struct WebState {
    pub api: ApiState,
    pub metrics: Arc<Metrics>,
    pub sessions: Arc<Sessions>,
    pub login: Arc<Login>,
    pub conf_dir: Arc<PathBuf>,
    /// At most two password checks at a time (argon2 costs memory and CPU on purpose).
    pub login_gate: Arc<tokio::sync::Semaphore>,
    /// Wrong passwords per client address ([`session::LoginLimiter`]).
    pub login_limiter: Arc<session::LoginLimiter>,
}

/// The whole HTTP surface: [`crate::api::router`] merged with the routes of this module.
/// Starts the metrics task (needs a tokio runtime).
pub fn router(api: ApiState, opts: WebOptions) -> Router {
    let opts_hosts = opts.allowed_hosts;
    let st = WebState {
        metrics: Metrics::start(&api.engine),
        api: api.clone(),
        sessions: Arc::new(Sessions::default()),
        login: Arc::new(opts.login),
        conf_dir: Arc::new(opts.conf_dir),
        login_gate: Arc::new(tokio::sync::Semaphore::new(2)),
        login_limiter: Arc::new(session::LoginLimiter::default()),
    };
    let bearer = Router::new()
        .route("/api/v1/bindings/{name}/history", get(api_extra::history))
        .route("/api/v1/resolve", post(api_extra::test_resolve))
        .route("/api/v1/nginx", get(api_extra::nginx))
        .route("/api/v1/openapi.json", get(openapi::serve))
        .layer(middleware::from_fn_with_state(st.clone(), require_bearer))
        .with_state(st.clone());
    let metrics = Router::new()
        .route("/metrics", get(metrics_text))
        .layer(middleware::from_fn_with_state(
            st.clone(),
            require_bearer_or_session,
        ))
        .with_state(st.clone());
    crate::api::router(api)
        .merge(bearer)
        .merge(metrics)
        .merge(ui::router(st))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(
            Arc::new(opts_hosts),
            host::check,
        ))
}

/// Under `/api/`, error answers that are not JSON (axum's own rejections of a bad query string or
/// path, which are plain text) become the API's `{"error": {"message", "field"}}`.
async fn json_errors(req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let text = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    // "Failed to deserialize query string: wait: ..." names the parameter.
    let field = text
        .strip_prefix("Failed to deserialize query string: ")
        .and_then(|rest| rest.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .filter(|n| !n.is_empty() && !n.contains(' '));
    let mut out = api_extra::error(status, text, field);
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

fn bearer_ok(st: &WebState, req: &Request) -> bool {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| crate::token::equal(t.trim(), &st.api.token))
}

fn unauthorized() -> Response {
    let mut resp = api_extra::error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong API token: send Authorization: Bearer <token>",
        None,
    );
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

async fn require_bearer(State(st): State<WebState>, req: Request, next: Next) -> Response {
    if bearer_ok(&st, &req) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

async fn require_bearer_or_session(
    State(st): State<WebState>,
    req: Request,
    next: Next,
) -> Response {
    let session = session::cookie(req.headers(), session::SESSION_COOKIE)
        .and_then(|id| st.sessions.get(id))
        .is_some();
    if session || bearer_ok(&st, &req) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

/// `/metrics`: the format the scraper asks for in `Accept` ([`metrics::Format`]).
async fn metrics_text(State(st): State<WebState>, headers: axum::http::HeaderMap) -> Response {
    let format = metrics::Format::from_accept(
        headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    (
        [(header::CONTENT_TYPE, format.content_type())],
        st.metrics.render(&st.api.engine, format),
    )
        .into_response()
}
