//! The JSON API (see `docs/api.md`). Everything but `GET /api/v1/health` needs
//! `Authorization: Bearer <token>`; the token is compared in constant time and never logged.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tributary_core::FieldError;
use tributary_store::StoreError;
use tributary_store::Upsert;

use crate::engine::{Engine, EngineError};
use crate::view::{
    BindingInput, BindingList, BulkInput, BulkResponse, ErrorBody, ErrorDetail, PluginList,
    PluginView, SaveResponse,
};

/// Shared state of the handlers.
#[derive(Clone)]
pub struct ApiState {
    pub engine: Engine,
    pub token: Arc<str>,
    /// Plugins that failed to load at start-up, as text.
    pub load_errors: Arc<Vec<String>>,
}

/// The router: `/api/v1/...`.
pub fn router(state: ApiState) -> Router {
    let authed = Router::new()
        .route("/api/v1/bindings", get(list).post(create))
        .route("/api/v1/bindings/bulk", post(bulk))
        .route(
            "/api/v1/bindings/{name}",
            get(show).put(replace).delete(remove),
        )
        .route("/api/v1/bindings/{name}/refresh", post(refresh))
        .route("/api/v1/plugins", get(plugins))
        .route("/api/v1/stats", get(stats))
        .route("/api/v1/store", get(store))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state.clone());
    let open = Router::new()
        .route("/api/v1/health", get(health))
        .with_state(state.clone());
    Router::new().merge(open).merge(authed).fallback(not_found)
}

/// An error answer with the status that fits.
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>, field: Option<String>) -> ApiError {
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
}

impl EngineError {
    /// The HTTP status of this error: the one mapping, used by the JSON API and the web UI.
    pub fn http_status(&self) -> StatusCode {
        match self {
            EngineError::Invalid(_) => StatusCode::BAD_REQUEST,
            EngineError::NotFound(_) => StatusCode::NOT_FOUND,
            EngineError::Duplicate(_) | EngineError::Conflict(_) => StatusCode::CONFLICT,
            EngineError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            EngineError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            // The store cannot be reached (etcd down): nothing was written, try again later.
            EngineError::Store(StoreError::Unavailable { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            EngineError::Store(StoreError::Conflict(_) | StoreError::Duplicate(_)) => {
                StatusCode::CONFLICT
            }
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

type ApiResult<T> = Result<T, ApiError>;

async fn auth(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let ok = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| crate::token::equal(t.trim(), &state.token));
    if ok {
        return next.run(req).await;
    }
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

/// `200 {"status":"ok","store":{...}}` while the engine's long-lived tasks run;
/// `200 {"status":"degraded",...,"message"}` when only the store is unreachable (this host still
/// serves its last applied servers); `503 {"status":"unhealthy","dead":[...],"message"}` when the
/// apply or the record task has ended (the daemon must be restarted: no change reaches nginx, or
/// no outcome is stored, any more). `store` holds the kind, `connected` and
/// `unreachable_since_ms` only: where the store is stays behind the token (`/api/v1/store`).
async fn health(State(s): State<ApiState>) -> Response {
    let dead = s.engine.dead_tasks();
    let st = s.engine.store_status();
    let store = serde_json::json!({
        "kind": st.kind,
        "connected": st.connected,
        "unreachable_since_ms": st.unreachable_since_ms,
    });
    if dead.is_empty() {
        if st.connected {
            return Json(serde_json::json!({ "status": "ok", "store": store })).into_response();
        }
        return Json(serde_json::json!({
            "status": "degraded",
            "store": store,
            "message": format!(
                "the {} store is unreachable: this host keeps serving its last applied servers",
                st.kind
            ),
        }))
        .into_response();
    }
    let why: Vec<&str> = dead
        .iter()
        .map(|t| match *t {
            "apply" => "the apply task has stopped: no change reaches nginx any more",
            "record" => "the record task has stopped: outcomes are not stored any more",
            "store" => {
                "the store task has stopped: changes made on other hosts do not reach this one"
            }
            _ => "an engine task has stopped",
        })
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(serde_json::json!({
            "status": "unhealthy",
            "dead": dead,
            "store": store,
            "message": format!("{}; restart the daemon", why.join("; ")),
        })),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint", None)
}

fn parse_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> ApiResult<T> {
    // The message names the member at fault (also in `field`) and never echoes a string value.
    crate::web::api_extra::json_body(body)
        .map_err(|(message, field)| ApiError::new(StatusCode::BAD_REQUEST, message, field))
}

#[derive(Debug, Deserialize)]
struct WaitQuery {
    #[serde(default)]
    wait: bool,
}

async fn list(State(s): State<ApiState>) -> Json<BindingList> {
    Json(BindingList {
        bindings: s.engine.list(),
    })
}

async fn create(
    State(s): State<ApiState>,
    Query(q): Query<WaitQuery>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<SaveResponse>)> {
    let input: BindingInput = parse_body(&body)?;
    let name = input.name.clone();
    let waiter = s.engine.clone();
    let view = s.engine.add(&input).await?;
    let view = if q.wait {
        waiter.wait_first(&name).await?;
        waiter.get(&name).unwrap_or(view)
    } else {
        view
    };
    Ok((
        StatusCode::CREATED,
        Json(SaveResponse {
            result: "created".into(),
            binding: view,
        }),
    ))
}

async fn replace(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Query(q): Query<WaitQuery>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<SaveResponse>)> {
    let input: BindingInput = parse_body(&body)?;
    let (upsert, view) = s.engine.put(&name, &input).await?;
    let view = if q.wait && upsert != Upsert::Unchanged {
        s.engine.wait_first(&name).await?;
        s.engine.get(&name).unwrap_or(view)
    } else {
        view
    };
    let (status, result) = match upsert {
        Upsert::Created => (StatusCode::CREATED, "created"),
        Upsert::Updated => (StatusCode::OK, "updated"),
        Upsert::Unchanged => (StatusCode::OK, "unchanged"),
    };
    Ok((
        status,
        Json(SaveResponse {
            result: result.into(),
            binding: view,
        }),
    ))
}

async fn bulk(State(s): State<ApiState>, body: Bytes) -> ApiResult<Json<BulkResponse>> {
    let input: BulkInput = parse_body(&body)?;
    let results = s.engine.put_many(&input.bindings).await?;
    Ok(Json(BulkResponse { results }))
}

async fn show(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<crate::view::BindingDetail>> {
    Ok(Json(s.engine.show(&name)?))
}

async fn remove(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<crate::view::RemoveResponse>> {
    Ok(Json(s.engine.remove(&name).await?))
}

async fn refresh(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<Json<tributary_store::OutcomeRecord>> {
    Ok(Json(s.engine.refresh(&name).await?))
}

async fn plugins(State(s): State<ApiState>) -> Json<PluginList> {
    Json(PluginList {
        plugins: s
            .engine
            .host()
            .plugins()
            .into_iter()
            .map(PluginView::from)
            .collect(),
        errors: s.load_errors.as_ref().clone(),
    })
}

async fn stats(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "bindings": s.engine.list().len(),
        "batches": s.engine.batches(),
    }))
}

/// `GET /api/v1/store`: the store's connection state (kind, host id, connected, since when not,
/// the last error, where it is).
async fn store(State(s): State<ApiState>) -> Json<crate::view::StoreView> {
    Json(s.engine.store_status())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_apply::{Applier, ApplyOptions, CommandNginx};
    use tributary_plugin_host::{HostOptions, PluginHost};
    use tributary_store::SqliteStore;

    async fn state(dir: &std::path::Path) -> ApiState {
        let store = SqliteStore::open(&dir.join("db"), Default::default(), "test").unwrap();
        state_on(dir, Arc::new(store)).await
    }

    async fn state_on(
        dir: &std::path::Path,
        store: Arc<dyn tributary_store::BindingStore>,
    ) -> ApiState {
        std::fs::create_dir_all(dir.join("plugins")).unwrap();
        let (host, _) = PluginHost::load(&dir.join("plugins"), HostOptions::default());
        let nginx = CommandNginx::new(vec!["true".into()], vec!["true".into()]);
        let applier =
            Applier::open(&dir.join("conf"), Box::new(nginx), ApplyOptions::default()).unwrap();
        let engine = Engine::start(store, Arc::new(host), applier, Default::default()).unwrap();
        ApiState {
            engine,
            token: Arc::from("t".repeat(32)),
            load_errors: Arc::new(Vec::new()),
        }
    }

    async fn health_of(s: &ApiState) -> (StatusCode, serde_json::Value) {
        let resp = health(State(s.clone())).await;
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Waits (bounded) until the aborted task has ended.
    async fn until_dead(s: &ApiState, task: &str) {
        for _ in 0..200 {
            if s.engine.dead_tasks().contains(&task) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{task} did not end");
    }

    #[tokio::test]
    async fn health_is_unhealthy_when_the_apply_task_died() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path()).await;
        let (status, body) = health_of(&s).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "ok");
        // The SQLite store is always connected; where it is stays behind the token.
        assert_eq!(
            body["store"],
            serde_json::json!({"kind": "sqlite", "connected": true, "unreachable_since_ms": null})
        );
        s.engine.kill_task_for_test("apply");
        until_dead(&s, "apply").await;
        let (status, body) = health_of(&s).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["status"], "unhealthy");
        assert_eq!(body["dead"], serde_json::json!(["apply"]));
        let msg = body["message"].as_str().unwrap();
        assert!(
            msg.contains("apply task has stopped") && msg.contains("restart"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn health_stays_200_but_says_degraded_while_the_store_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let fleet = tributary_fakes::fleet_store::Fleet::new();
        let s = state_on(dir.path(), fleet.member("h1")).await;
        let (status, body) = health_of(&s).await;
        assert_eq!((status, &body["status"]), (StatusCode::OK, &"ok".into()));
        fleet.set_reachable("h1", false);
        let (status, body) = health_of(&s).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "degraded");
        assert_eq!(body["store"]["connected"], false);
        assert!(body["store"]["unreachable_since_ms"].is_i64(), "{body}");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("keeps serving its last applied servers"));
        // The full state, with where the store is, is behind the token.
        let Json(v) = store(State(s.clone())).await;
        assert_eq!((v.kind.as_str(), v.connected), ("etcd", false));
        assert!(
            v.last_error.is_some() && v.unreachable_note().is_some(),
            "{v:?}"
        );
        fleet.set_reachable("h1", true);
        let (_, body) = health_of(&s).await;
        assert_eq!(body["status"], "ok");
    }

    #[tokio::test]
    async fn health_is_unhealthy_when_the_record_task_died() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path()).await;
        s.engine.kill_task_for_test("record");
        until_dead(&s, "record").await;
        let (status, body) = health_of(&s).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["dead"], serde_json::json!(["record"]));
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("record task has stopped"));
    }

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
