//! The JSON API under `/api/v1` (reference: `docs/api.md`; the OpenAPI document in [`openapi`]).
//! Everything but `GET /api/v1/health` needs `Authorization: Bearer <token>` ([`super::auth`]).
//!
//! One file per resource: [`bindings`] (save, list, show, remove, refresh, history), [`resolve`]
//! (the test resolution), [`status`] (health, plugins, stats, store, nginx), [`fleet`] (the fleet's
//! hosts, forget-host), [`openapi`].
//! Bodies and `?wait=` are read by the extractors of [`super::json`]; errors are
//! [`super::error::ApiError`]s.

pub mod bindings;
pub mod fleet;
pub mod openapi;
pub mod resolve;
pub mod status;

use axum::middleware;
use axum::routing::{delete, get, post};
use axum::Router;

use super::auth::require_bearer;
use super::AppState;

/// The routes under `/api/v1`.
pub fn router(st: AppState) -> Router {
    let authed = Router::new()
        .route(
            "/api/v1/bindings",
            get(bindings::list).post(bindings::create),
        )
        .route("/api/v1/bindings/bulk", post(bindings::bulk))
        .route(
            "/api/v1/bindings/{name}",
            get(bindings::show)
                .put(bindings::replace)
                .delete(bindings::remove),
        )
        .route("/api/v1/bindings/{name}/refresh", post(bindings::refresh))
        .route("/api/v1/bindings/{name}/history", get(bindings::history))
        .route("/api/v1/resolve", post(resolve::test_resolve))
        .route("/api/v1/plugins", get(status::plugins))
        .route("/api/v1/stats", get(status::stats))
        .route("/api/v1/store", get(status::store))
        .route("/api/v1/fleet/hosts", get(fleet::hosts))
        .route("/api/v1/fleet/hosts/{host}", delete(fleet::forget))
        .route("/api/v1/nginx", get(status::nginx))
        .route("/api/v1/openapi.json", get(openapi::serve))
        .layer(middleware::from_fn_with_state(st.clone(), require_bearer))
        .with_state(st.clone());
    let open = Router::new()
        .route("/api/v1/health", get(status::health))
        .with_state(st);
    Router::new().merge(open).merge(authed)
}
