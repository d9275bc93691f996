//! Everything `tributary serve` answers over HTTP, in one router ([`router`]) on one state
//! ([`AppState`]):
//!
//! - [`api`]: the JSON API under `/api/v1` (`docs/api.md`), one file per resource;
//! - [`error`]: the one JSON error body (`{"error": {"message", "field"}}`) and the HTTP status of
//!   each engine error;
//! - [`json`]: the JSON body and query extractors, whose errors are typed (never serde's prose);
//! - [`auth`]: the bearer token, the UI login and sessions, CSRF tokens;
//! - [`host`]: refuses requests whose `Host` is not this daemon's (DNS rebinding);
//! - [`metrics`]: `/metrics` in OpenMetrics or Prometheus text format by `Accept`;
//! - [`ui`]: the server-rendered web UI under `/ui/` (plus `/`, `/login`, `/logout`).
//!
//! Access: `GET /api/v1/health` is open; `/api/v1/*` needs the bearer token; `/metrics` takes
//! the bearer token or a UI session; UI pages need a session (else they redirect to `/login`).
//! The JSON shapes themselves are data in [`crate::view`], shared with the engine and the CLI.
//!
//! The router puts every answer under `/api/` in the JSON error shape and the `Host` check in front;
//! [`AppState`] holds the engine, token, metrics, sessions and login. `error.rs` is the one error
//! body (`ApiError`, plus `errors`), `EngineError::http_status` (the one mapping of engine errors to
//! HTTP status, used by the API and the web UI) and the middleware that turns axum's plain-text
//! refusals under `/api/` into that body. `auth/`: the bearer check (`require_bearer`, and
//! `require_bearer_or_session` for `/metrics`), the session and CSRF checks the UI uses
//! (`session_of`, `csrf_ok`) and `auth/session.rs`, the UI login (argon2id hash in the data dir, in-
//! memory sessions, CSRF tokens, the per-address login rate limit). `host.rs` takes `--allowed-host`.
//! `api/` (bearer token on everything but health) by resource: `bindings.rs` (save, bulk, list, show,
//! remove, refresh, history), `resolve.rs` (test resolution: `Engine::preview_binding` + one plugin
//! call, nothing applied; also the web form's preview), `status.rs` (health, plugins, stats, store,
//! nginx status), `openapi.rs` (serves `assets/openapi.json`). `metrics/` follows the engine's
//! `EngineEvent`s (outcomes, apply batches) over a broadcast channel and renders through `prometheus-
//! client` (`metrics/families.rs` declares every metric in one place, `Families`; `metrics/format.rs`
//! the two formats; `metrics/live.rs` the live state). `ui/` renders the pages server-side
//! (`ui/mod.rs` routes, the session guard and CSRF refusal pages and form reading; one file per page:
//! `login`, `list`, `detail`, `edit`, `nginx`; `ui/form.rs` the create/edit form, `ui/chart.rs` the
//! SVG charts, `ui/widgets.rs` the pieces several pages share, `ui/html.rs` the page frame, CSP
//! headers and times, `ui/live.rs` the live state; `assets/style.css`, `assets/app.js` embedded with
//! `include_str!`). Pages are maud `html!` templates: markup is checked at compile time and every
//! value spliced into a page is escaped. Browser tests live in `tests/browser/` (playwright-core +
//! Debian's chromium), run by `crates/daemon/tests/e2e/browser_ui.rs`.
//!
//! Modules depend one way: `http` → `engine`, `view`, `resolution`, `token`, `utc`, `live_state`,
//! `live_api`; `view` → `live_state` → `live_api`; inside it `api`, `metrics`, `ui` → `auth`, `json`
//! → `error`.

pub mod api;
pub mod auth;
pub mod error;
pub mod host;
pub mod json;
pub mod metrics;
pub mod ui;

use std::path::PathBuf;
use std::sync::Arc;

use axum::middleware;
use axum::Router;

use crate::engine::Engine;
use auth::session::{Login, LoginLimiter, Sessions};
use metrics::Metrics;

/// What `serve` hands the HTTP side besides the engine.
pub struct Options {
    /// The API token (compared in constant time, never logged).
    pub token: String,
    /// Plugins that failed to load at start-up, as text.
    pub load_errors: Vec<String>,
    /// nginx conf dir (for the nginx status).
    pub conf_dir: PathBuf,
    pub login: Login,
    /// The `Host` values requests may carry.
    pub allowed_hosts: host::AllowedHosts,
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub token: Arc<str>,
    /// Plugins that failed to load at start-up, as text.
    pub load_errors: Arc<Vec<String>>,
    pub metrics: Arc<Metrics>,
    pub sessions: Arc<Sessions>,
    pub login: Arc<Login>,
    pub conf_dir: Arc<PathBuf>,
    /// At most two password checks at a time (argon2 costs memory and CPU on purpose).
    pub login_gate: Arc<tokio::sync::Semaphore>,
    /// Wrong passwords per client address ([`LoginLimiter`]).
    pub login_limiter: Arc<LoginLimiter>,
}

impl AppState {
    /// The state of a daemon serving `engine`. Starts the metrics task (needs a tokio runtime).
    pub fn new(
        engine: Engine,
        token: String,
        load_errors: Vec<String>,
        conf_dir: PathBuf,
        login: Login,
    ) -> AppState {
        AppState {
            metrics: Metrics::start(&engine),
            engine,
            token: token.into(),
            load_errors: Arc::new(load_errors),
            sessions: Arc::new(Sessions::default()),
            login: Arc::new(login),
            conf_dir: Arc::new(conf_dir),
            login_gate: Arc::new(tokio::sync::Semaphore::new(2)),
            login_limiter: Arc::new(LoginLimiter::default()),
        }
    }
}

/// The API the servers' live state is read from for display: `Some` when changes go live
/// (`--apply live|auto` with `--live-api`), the only mode where upstreams have a zone the module
/// can show.
pub fn live_api_of(engine: &Engine) -> Option<&crate::live_api::LiveApi> {
    let opts = engine.live_options();
    if opts.zoned() {
        opts.api.as_ref()
    } else {
        None
    }
}

/// The whole HTTP surface: the JSON API, `/metrics` and the UI, every answer under `/api/` JSON
/// (also axum's own refusals), behind the `Host` check. Starts the metrics task.
pub fn router(engine: Engine, opts: Options) -> Router {
    let st = AppState::new(
        engine,
        opts.token,
        opts.load_errors,
        opts.conf_dir,
        opts.login,
    );
    Router::new()
        .merge(api::router(st.clone()))
        .merge(metrics::router(st.clone()))
        .merge(ui::router(st))
        .fallback(error::not_found)
        .layer(middleware::from_fn(error::json_errors))
        .layer(middleware::from_fn_with_state(
            Arc::new(opts.allowed_hosts),
            host::check,
        ))
}
