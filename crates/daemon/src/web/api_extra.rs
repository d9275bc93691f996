//! JSON API endpoints added next to [`crate::api`]: history, test resolution, nginx status.
//! They use the same bearer-token check and error shape.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use tributary_protocol::ResolveParams;
use tributary_store::{DroppedRecord, OutcomeRecord};

use crate::resolution::Resolved;

use super::metrics::NginxNumbers;
use super::WebState;
use crate::engine::{Engine, EngineError};
use crate::view::{BindingInput, ErrorBody, ErrorDetail};

/// An error answer in the API's shape.
pub fn error(status: StatusCode, message: impl Into<String>, field: Option<String>) -> Response {
    (
        status,
        Json(ErrorBody {
            error: ErrorDetail {
                message: message.into(),
                field,
            },
            errors: Vec::new(),
        }),
    )
        .into_response()
}

/// `GET /api/v1/bindings/{name}/history`.
#[derive(Debug, Serialize)]
pub struct History {
    pub name: String,
    /// Newest first.
    pub history: Vec<OutcomeRecord>,
}

pub async fn history(State(s): State<WebState>, Path(name): Path<String>) -> Response {
    match s.api.engine.show(&name) {
        Ok(d) => Json(History {
            name,
            history: d.history,
        })
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// What a test resolution would write (`POST /api/v1/resolve`); nothing is saved or applied.
#[derive(Debug, Clone, Serialize)]
pub struct Preview {
    /// `ok` or `failed`.
    pub result: String,
    pub targets: Vec<Value>,
    pub dropped: Vec<DroppedRecord>,
    pub ttl_seconds: Option<u64>,
    /// The file that would be written (`null` when nothing would be).
    pub rendered: Option<String>,
    pub why: Option<String>,
    pub code: Option<i64>,
    pub field: Option<String>,
}

/// Validates `input` like a save (secret fields left out keep the stored values of the binding
/// named `input.name`, or `path_name`), calls the plugin once and renders; touches nothing.
pub async fn preview(
    engine: &Engine,
    input: &BindingInput,
    path_name: Option<&str>,
) -> Result<Preview, EngineError> {
    let binding = engine.preview_binding(input, path_name)?;
    let mut p = Preview {
        result: "failed".into(),
        targets: vec![],
        dropped: vec![],
        ttl_seconds: None,
        rendered: None,
        why: None,
        code: None,
        field: None,
    };
    let params = ResolveParams {
        provider: binding.provider.clone(),
        config: binding.config.clone(),
        service: binding.service.clone(),
    };
    match engine.host().resolve(&binding.plugin, params).await {
        Err(e) => {
            p.why = Some(format!("plugin {:?}: {e}", binding.plugin));
            p.code = e.code();
            p.field = e.field().map(str::to_string);
        }
        Ok(answer) => {
            let r = Resolved::new(&binding.name, &binding.directives, &answer);
            p.ttl_seconds = Some(r.ttl_seconds);
            p.targets = r.kept_with_tags(&answer);
            p.dropped = r.dropped_records();
            if r.rendered.is_some() {
                p.result = "ok".into();
                p.why = r.dropped_note();
            } else {
                p.why = r
                    .no_target_reason()
                    .map(|reason| format!("{reason}: nothing would be written"));
            }
            // The exact bytes this daemon would write (live mode adds the `zone` line).
            p.rendered = r.rendered.map(|t| engine.live_options().file_text(t));
        }
    }
    Ok(p)
}

pub async fn test_resolve(State(s): State<WebState>, body: Bytes) -> Response {
    let input: BindingInput = match json_body(&body) {
        Ok(i) => i,
        Err((message, field)) => return error(StatusCode::BAD_REQUEST, message, field),
    };
    match preview(&s.api.engine, &input, None).await {
        Ok(p) => Json(p).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /api/v1/nginx`.
#[derive(Debug, Serialize)]
pub struct NginxStatus {
    pub conf_dir: String,
    pub upstreams_dir: String,
    /// `*.conf` files in the upstreams folder, by name.
    pub files: Vec<String>,
    #[serde(flatten)]
    pub numbers: NginxNumbers,
}

/// The nginx status (shared by the API and the UI page).
pub fn nginx_status(s: &WebState) -> NginxStatus {
    let dir = s.conf_dir.join("upstreams");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".conf"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    NginxStatus {
        conf_dir: s.conf_dir.display().to_string(),
        upstreams_dir: dir.display().to_string(),
        files,
        numbers: s.metrics.nginx_numbers(),
    }
}

pub async fn nginx(State(s): State<WebState>) -> Json<NginxStatus> {
    Json(nginx_status(&s))
}

/// Parses a JSON request body. On failure: a message that names the member at fault (`field`:
/// its path, e.g. `interval_secs` or `bindings[1].service`) and never repeats a string value
/// from the body (serde's "invalid type: string \"...\"" would echo it).
pub fn json_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, (String, Option<String>)> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let result: Result<T, _> = serde_path_to_error::deserialize(de);
    result.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = inner.to_string();
        let named = msg
            .split_once('`')
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(name, _)| name.to_string());
        // serde_path_to_error's path ends at the unknown member, but at the parent of a missing one.
        let field = if msg.starts_with("missing field") {
            named.map(|n| {
                if path == "." {
                    n
                } else {
                    format!("{path}.{n}")
                }
            })
        } else if path != "." {
            Some(path.clone())
        } else {
            None
        };
        let text = if msg.starts_with("invalid type") || msg.starts_with("invalid value") {
            let kind = if msg.starts_with("invalid type") {
                "invalid type"
            } else {
                "invalid value"
            };
            let end = msg.rfind(" at line ").unwrap_or(msg.len());
            let expected = msg[..end]
                .rfind(", expected ")
                .map(|i| msg[i + ", expected ".len()..end].to_string())
                .unwrap_or_else(|| "another value".into());
            format!("invalid JSON body: {kind} for {path}: expected {expected}")
        } else {
            format!("invalid JSON body: {msg}")
        };
        (text, field)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::BulkInput;

    #[test]
    fn json_errors_name_the_field_and_hide_values() {
        let e = json_body::<BindingInput>(br#"{"plugin":"p","provider":"q"}"#).unwrap_err();
        assert_eq!(e.1.as_deref(), Some("service"), "{e:?}");
        assert!(e.0.contains("missing field `service`"), "{e:?}");
        let e =
            json_body::<BindingInput>(br#"{"plugin":"p","provider":"q","service":"s","bogus":1}"#)
                .unwrap_err();
        assert_eq!(e.1.as_deref(), Some("bogus"), "{e:?}");
        let e = json_body::<BindingInput>(
            br#"{"plugin":"p","provider":"q","service":"s","config":"hunter2-secret"}"#,
        )
        .unwrap_err();
        assert_eq!(e.1.as_deref(), Some("config"), "{e:?}");
        assert!(!e.0.contains("hunter2"), "{e:?}");
        assert!(e.0.contains("expected a map"), "{e:?}");
        let e = json_body::<BindingInput>(
            br#"{"plugin":"p","provider":"q","service":"s","interval_secs":"soon-secret"}"#,
        )
        .unwrap_err();
        assert_eq!(e.1.as_deref(), Some("interval_secs"), "{e:?}");
        assert!(!e.0.contains("soon-secret"), "{e:?}");
        let e =
            json_body::<BulkInput>(br#"{"bindings":[{"plugin":"p","provider":"q"}]}"#).unwrap_err();
        assert_eq!(e.1.as_deref(), Some("bindings[0].service"), "{e:?}");
        let e = json_body::<BindingInput>(b"not json").unwrap_err();
        assert_eq!(e.1, None);
        assert!(e.0.starts_with("invalid JSON body"), "{e:?}");
    }
}
