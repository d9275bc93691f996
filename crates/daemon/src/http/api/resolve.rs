//! `POST /api/v1/resolve`: a test resolution of a binding input (also the web form's preview):
//! validated like a save, one plugin call, rendered; nothing is saved, written or reloaded.

use axum::extract::State;
use axum::Json;
use tributary_protocol::ResolveParams;

use crate::engine::{Engine, EngineError};
use crate::http::error::ApiError;
use crate::http::json::JsonBody;
use crate::http::AppState;
use crate::resolution::Resolved;
use crate::view::{BindingInput, Preview};

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
            let directives = binding.file_directives(engine.live_options().zoned());
            let r = Resolved::new(&binding.name, &directives, &answer);
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

pub async fn test_resolve(
    State(s): State<AppState>,
    JsonBody(input): JsonBody<BindingInput>,
) -> Result<Json<Preview>, ApiError> {
    Ok(Json(preview(&s.engine, &input, None).await?))
}
