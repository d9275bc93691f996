//! `/api/v1/bindings...`: create, replace, bulk save, list, show, remove, refresh, history.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use tributary_store::{OutcomeRecord, Upsert};

use crate::http::error::ApiError;
use crate::http::json::{JsonBody, WaitQuery};
use crate::http::AppState;
use crate::live_state;
use crate::view::{
    BindingInput, BindingList, BindingShow, BulkInput, BulkResponse, History, RemoveResponse,
    SaveResponse,
};

type ApiResult<T> = Result<T, ApiError>;

pub async fn list(State(s): State<AppState>) -> Json<BindingList> {
    // The hosts' outcomes are read on demand (docs/fleet.md, "What a host watches").
    s.engine.refresh_fleet(None).await;
    Json(BindingList {
        bindings: s.engine.list(),
    })
}

pub async fn create(
    State(s): State<AppState>,
    q: WaitQuery,
    JsonBody(input): JsonBody<BindingInput>,
) -> ApiResult<(StatusCode, Json<SaveResponse>)> {
    let name = input.name.clone();
    let view = s.engine.add(&input).await?;
    let view = if q.wait {
        s.engine.wait_first(&name).await?;
        s.engine.get(&name).unwrap_or(view)
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

pub async fn replace(
    State(s): State<AppState>,
    Path(name): Path<String>,
    q: WaitQuery,
    JsonBody(input): JsonBody<BindingInput>,
) -> ApiResult<(StatusCode, Json<SaveResponse>)> {
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

pub async fn bulk(
    State(s): State<AppState>,
    JsonBody(input): JsonBody<BulkInput>,
) -> ApiResult<Json<BulkResponse>> {
    let results = s.engine.put_many(&input.bindings).await?;
    Ok(Json(BulkResponse { results }))
}

/// `GET /api/v1/bindings/{name}`: the binding, its history and, in live mode, its upstream's live
/// state read from the module now (at most `live_api::READ_TIMEOUT`; a failed read is a `live`
/// with its `error`, never a failed answer).
pub async fn show(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<BindingShow>> {
    s.engine.refresh_fleet(Some(&name)).await;
    let d = s.engine.show(&name)?;
    let live = match crate::http::live_api_of(&s.engine) {
        Some(api) => Some(live_state::read(api, &name).await),
        None => None,
    };
    Ok(Json(BindingShow::new(d, live)))
}

pub async fn remove(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<RemoveResponse>> {
    Ok(Json(s.engine.remove(&name).await?))
}

pub async fn refresh(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<OutcomeRecord>> {
    Ok(Json(s.engine.refresh(&name).await?))
}

/// `GET /api/v1/bindings/{name}/history`: newest first.
pub async fn history(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<History>> {
    let d = s.engine.show(&name)?;
    Ok(Json(History {
        name,
        history: d.history,
    }))
}
