//! `GET /api/v1/openapi.json`: the OpenAPI 3.0 document of the JSON API
//! (`crates/daemon/assets/openapi.json`, embedded at build time). A test keeps it true to the
//! routers: every `/api/v1` route and `/metrics` is in it with the same methods, and nothing else.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The document's text.
pub const DOCUMENT: &str = include_str!("../../../assets/openapi.json");

pub async fn serve() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT).into_response()
}
