//! `/api/v1/fleet/hosts...`: every host of the fleet with the bindings it is behind, and the
//! removal of what a host that is gone left in the store (`docs/fleet.md`, "Forgetting a host").

use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::Json;

use crate::http::error::ApiError;
use crate::http::AppState;
use crate::view::{FleetHosts, ForgetHostResponse};

/// `GET /api/v1/fleet/hosts`: the hosts this host knows of (alive or not) with how many bindings
/// each is behind, and every binding's set age and resolver; read from this host's copy of the
/// store.
pub async fn hosts(State(s): State<AppState>) -> Json<FleetHosts> {
    // The hosts' outcomes are read on demand (docs/fleet.md, "What a host watches").
    s.engine.refresh_fleet(None).await;
    Json(s.engine.fleet_hosts())
}

/// `DELETE /api/v1/fleet/hosts/{host}[?force=true]`: removes the host's outcomes and markers;
/// `409` while it is alive (unless `force`), `404` when the store has nothing of it.
pub async fn forget(
    State(s): State<AppState>,
    Path(host): Path<String>,
    q: ForceQuery,
) -> Result<Json<ForgetHostResponse>, ApiError> {
    Ok(Json(s.engine.forget_host(&host, q.force).await?))
}

/// `?force=true|false` (at most once; no other parameter).
pub struct ForceQuery {
    pub force: bool,
}

impl ForceQuery {
    pub fn parse(query: &str) -> Result<ForceQuery, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
            .map_err(|_| ApiError::bad_request("the query string could not be read", None))?;
        let mut force = None;
        for (k, v) in pairs {
            let bad = |why: String| {
                ApiError::bad_request(format!("invalid query string: {why}"), Some(k.clone()))
            };
            if k != "force" {
                return Err(bad(format!(
                    "unknown parameter {k:?} (only force is taken)"
                )));
            }
            if force.is_some() {
                return Err(bad("force is given twice".into()));
            }
            force = Some(match v.as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(bad("force must be true or false".into())),
            });
        }
        Ok(ForceQuery {
            force: force.unwrap_or(false),
        })
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ForceQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        ForceQuery::parse(parts.uri.query().unwrap_or(""))
    }
}

#[cfg(test)]
mod tests {
    use super::ForceQuery;

    #[test]
    fn force_is_true_false_or_absent_and_nothing_else_is_taken() {
        assert!(!ForceQuery::parse("").unwrap().force);
        assert!(ForceQuery::parse("force=true").unwrap().force);
        assert!(!ForceQuery::parse("force=false").unwrap().force);
        for bad in ["force=yes", "force=true&force=true", "forse=true", "force"] {
            let e = ForceQuery::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} taken"));
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
