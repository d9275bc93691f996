//! `/api/v1` status: health (open), plugins, stats, the store's state, the nginx status.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::engine::Engine;
use crate::http::AppState;
use crate::view::{NginxStatus, PluginList, PluginView, StoreView};

/// `200 {"status":"ok","store":{...}}` while the engine's long-lived tasks run;
/// `200 {"status":"degraded",...,"message"}` when only the store is unreachable (this host still
/// serves its last applied servers); `503 {"status":"unhealthy","dead":[...],"message"}` when the
/// apply or the record task has ended (the daemon must be restarted: no change reaches nginx, or
/// no outcome is stored, any more). `store` holds the kind, `connected` and
/// `unreachable_since_ms` only: where the store is stays behind the token (`/api/v1/store`).
pub async fn health(State(s): State<AppState>) -> Response {
    health_of(&s.engine)
}

fn health_of(engine: &Engine) -> Response {
    let dead = engine.dead_tasks();
    let st = engine.store_status();
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

pub async fn plugins(State(s): State<AppState>) -> Json<PluginList> {
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

pub async fn stats(State(s): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "bindings": s.engine.list().len(),
        "batches": s.engine.batches(),
    }))
}

/// `GET /api/v1/store`: the store's connection state (kind, host id, connected, since when not,
/// the last error, where it is).
pub async fn store(State(s): State<AppState>) -> Json<StoreView> {
    Json(s.engine.store_status())
}

/// The nginx status (shared by the API and the UI page): the generated files and the counters.
pub fn nginx_status(s: &AppState) -> NginxStatus {
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

/// `GET /api/v1/nginx`.
pub async fn nginx(State(s): State<AppState>) -> Json<NginxStatus> {
    Json(nginx_status(&s))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use tributary_apply::{Applier, ApplyOptions, CommandNginx};
    use tributary_plugin_host::{HostOptions, PluginHost};
    use tributary_store::SqliteStore;

    async fn state(dir: &std::path::Path) -> Engine {
        let store = SqliteStore::open(&dir.join("db"), Default::default(), "test").unwrap();
        state_on(dir, Arc::new(store)).await
    }

    async fn state_on(
        dir: &std::path::Path,
        store: Arc<dyn tributary_store::BindingStore>,
    ) -> Engine {
        std::fs::create_dir_all(dir.join("plugins")).unwrap();
        let (host, _) = PluginHost::load(&dir.join("plugins"), HostOptions::default());
        let nginx = CommandNginx::new(vec!["true".into()], vec!["true".into()]);
        let applier =
            Applier::open(&dir.join("conf"), Box::new(nginx), ApplyOptions::default()).unwrap();
        Engine::start(store, Arc::new(host), applier, Default::default()).unwrap()
    }

    async fn health_json(s: &Engine) -> (StatusCode, serde_json::Value) {
        let resp = health_of(s);
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Waits (bounded) until the aborted task has ended.
    async fn until_dead(s: &Engine, task: &str) {
        for _ in 0..200 {
            if s.dead_tasks().contains(&task) {
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
        let (status, body) = health_json(&s).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "ok");
        // The SQLite store is always connected; where it is stays behind the token.
        assert_eq!(
            body["store"],
            serde_json::json!({"kind": "sqlite", "connected": true, "unreachable_since_ms": null})
        );
        s.kill_task_for_test("apply");
        until_dead(&s, "apply").await;
        let (status, body) = health_json(&s).await;
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
        let (status, body) = health_json(&s).await;
        assert_eq!((status, &body["status"]), (StatusCode::OK, &"ok".into()));
        fleet.set_reachable("h1", false);
        let (status, body) = health_json(&s).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "degraded");
        assert_eq!(body["store"]["connected"], false);
        assert!(body["store"]["unreachable_since_ms"].is_i64(), "{body}");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("keeps serving its last applied servers"));
        // The full state, with where the store is, is behind the token.
        let v = s.store_status();
        assert_eq!((v.kind.as_str(), v.connected), ("etcd", false));
        assert!(v.last_error.is_some() && !v.location.is_empty(), "{v:?}");
        fleet.set_reachable("h1", true);
        let (_, body) = health_json(&s).await;
        assert_eq!(body["status"], "ok");
    }

    #[tokio::test]
    async fn health_is_unhealthy_when_the_record_task_died() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path()).await;
        s.kill_task_for_test("record");
        until_dead(&s, "record").await;
        let (status, body) = health_json(&s).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["dead"], serde_json::json!(["record"]));
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("record task has stopped"));
    }
}
