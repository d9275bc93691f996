//! The one error answer of the JSON API: `{"error": {"message", "field"}}` ([`ErrorBody`]), with
//! `errors` listing every invalid field when a binding was checked field by field. Every error
//! under `/api/` has this shape: the handlers' ([`ApiError`]), the engine's ([`EngineError`],
//! status from [`EngineError::http_status`]), the extractors' ([`crate::http::json`]), the
//! bearer check's, the `Host` check's, and axum's own plain-text refusals ([`json_errors`]).

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tributary_core::FieldError;
use tributary_store::StoreError;

use crate::engine::EngineError;
use crate::view::{ErrorBody, ErrorDetail};

/// An error answer with the status that fits.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    /// One error; `field` names the input at fault when there is one.
    pub fn new(status: StatusCode, message: impl Into<String>, field: Option<String>) -> ApiError {
        ApiError {
            status,
            body: ErrorBody {
                error: ErrorDetail {
                    message: message.into(),
                    field,
                },
                errors: Vec::new(),
            },
        }
    }

    /// `400` for bad input.
    pub fn bad_request(message: impl Into<String>, field: Option<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message, field)
    }
}

impl EngineError {
    /// The HTTP status of this error: the one mapping, used by the JSON API and the web UI.
    pub fn http_status(&self) -> StatusCode {
        match self {
            EngineError::Invalid(_) => StatusCode::BAD_REQUEST,
            EngineError::NotFound(_) | EngineError::NoHost(_) => StatusCode::NOT_FOUND,
            EngineError::Duplicate(_) | EngineError::Conflict(_) => StatusCode::CONFLICT,
            EngineError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            EngineError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            // The store cannot be reached (etcd down): nothing was written, try again later.
            EngineError::Store(StoreError::Unavailable { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            EngineError::Store(StoreError::Conflict(_) | StoreError::Duplicate(_)) => {
                StatusCode::CONFLICT
            }
            // etcd refused this host's etcd user (its roles, or the user itself): the request is
            // forbidden, and stays so until the user or its roles change (not "try again later").
            EngineError::Store(
                StoreError::PermissionDenied { .. } | StoreError::AuthFailed { .. },
            ) => StatusCode::FORBIDDEN,
            // etcd refused the request as larger than its members take.
            EngineError::Store(StoreError::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            EngineError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let status = e.http_status();
        match e {
            EngineError::Invalid(errors) => ApiError {
                status,
                body: ErrorBody {
                    error: errors.first().map(detail).unwrap_or_else(|| ErrorDetail {
                        message: "invalid input".into(),
                        field: None,
                    }),
                    errors: errors.iter().map(detail).collect(),
                },
            },
            e => ApiError::new(status, e.to_string(), None),
        }
    }
}

fn detail(e: &FieldError) -> ErrorDetail {
    ErrorDetail {
        message: e.message.clone(),
        field: Some(e.field.clone()),
    }
}

/// An engine error as a JSON API answer (status from [`EngineError::http_status`]).
impl IntoResponse for EngineError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// The fallback: `404` "no such endpoint".
pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint", None)
}

/// Under `/api/`, error answers that are not JSON (axum's own refusals of a bad path or method,
/// which are plain text or empty) become the API's error body, their text as the message.
pub async fn json_errors(req: Request, next: Next) -> Response {
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
    let mut out = ApiError::new(status, text, None).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_their_status() {
        let cases = [
            (EngineError::invalid("service", "x"), 400),
            (EngineError::NotFound("a".into()), 404),
            (EngineError::Duplicate("a".into()), 409),
            (EngineError::Conflict("nginx -t".into()), 409),
            (EngineError::ShuttingDown, 503),
            (EngineError::Timeout("a".into()), 504),
            (
                EngineError::Store(StoreError::Unavailable {
                    store: "etcd".into(),
                    why: "down".into(),
                }),
                503,
            ),
            (EngineError::Store(StoreError::Conflict("a".into())), 409),
            (
                EngineError::Store(StoreError::PermissionDenied {
                    store: "etcd".into(),
                    user: "\"host-b\"".into(),
                    keys: "/t/bindings/a".into(),
                    why: "etcdserver: permission denied".into(),
                }),
                403,
            ),
            (
                EngineError::Store(StoreError::AuthFailed {
                    store: "etcd".into(),
                    user: "\"host-b\"".into(),
                    why: "etcdserver: authentication failed".into(),
                }),
                403,
            ),
            (
                EngineError::Store(StoreError::TooLarge {
                    store: "etcd".into(),
                    why: "etcdserver: request is too large".into(),
                }),
                413,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(e.http_status().as_u16(), status, "{e:?}");
            assert_eq!(e.into_response().status().as_u16(), status);
        }
    }

    #[test]
    fn invalid_input_answers_every_field_first_one_as_error() {
        let e = EngineError::Invalid(vec![
            FieldError::new("interval_secs", "too short"),
            FieldError::new("service", "service is empty"),
        ]);
        let a = ApiError::from(e);
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        let v = serde_json::to_value(&a.body).unwrap();
        assert_eq!(v["error"]["field"], "interval_secs");
        assert_eq!(v["errors"][1]["field"], "service");
        assert_eq!(v["errors"][0], v["error"]);
        // Other errors have no field and no list.
        let v =
            serde_json::to_value(ApiError::from(EngineError::NotFound("a".into())).body).unwrap();
        assert_eq!(v["error"]["message"], "no binding named \"a\"");
        assert!(v.get("errors").is_none(), "{v}");
    }
}
