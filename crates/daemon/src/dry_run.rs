//! `tributary resolve`: calls a plugin once and shows what would be written. Touches nothing:
//! no store, no nginx, no file.
//!
//! Success (`--json`, exit 0):
//! `{"targets":[{"address","port","weight"}...],"dropped":[{"target":{...},"reason":"..."}...],
//!   "ttl_seconds":N,"rendered":"<the file>"}`.
//! Failure (`--json`, exit 1): `{"error":{"code":N,"message":"...","field":"..."|null}}` where
//! `code` is the plugin's JSON-RPC error code when the plugin answered an error, `-32000` for
//! other plugin failures (timeout, crash, malformed answer, no valid target), `-32003` when the
//! config does not match the provider's declared fields (`field` = the key), and `-32602` for bad
//! command-line input (`field` = `plugin`, `provider`, `service`, `upstream`, `directive` or `config`).

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;
use tributary_core::{Binding, UpstreamName};
use tributary_core::{Dropped, ExtraDirective, Target};
use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_protocol::{ConfigMap, ResolveParams, ERR_CONFIG, ERR_INVALID_PARAMS, ERR_PROVIDER};

use crate::resolution::Resolved;

/// Inputs of a dry run.
#[derive(Clone)]
pub struct DryRun {
    pub plugins_dir: PathBuf,
    pub plugin: String,
    pub provider: String,
    pub service: String,
    /// `KEY=VALUE` pairs, already split; values are secret.
    pub config: Vec<(String, String)>,
    /// Upstream name for the rendered file; default: the service when it is a valid upstream
    /// name, else `upstream`.
    pub upstream: Option<String>,
    pub directives: Vec<String>,
    pub host_options: HostOptions,
    /// `--apply` / `--live-api`: the rendered file is shown as `serve` with these writes it.
    pub live: crate::engine::LiveOptions,
}

/// The success answer.
#[derive(Debug, Serialize)]
pub struct DryRunOk {
    pub targets: Vec<Target>,
    pub dropped: Vec<Dropped>,
    pub ttl_seconds: u64,
    pub rendered: String,
}

/// The failure answer (`{"error": ...}`).
#[derive(Debug, Serialize)]
pub struct DryRunFailure {
    pub error: DryRunError,
}

/// Code, message and the field at fault (`null` when none).
#[derive(Debug, Serialize)]
pub struct DryRunError {
    pub code: i64,
    pub message: String,
    pub field: Option<String>,
}

fn fail(code: i64, message: impl Into<String>, field: Option<&str>) -> DryRunFailure {
    DryRunFailure {
        error: DryRunError {
            code,
            message: message.into(),
            field: field.map(str::to_string),
        },
    }
}

/// Runs the dry run. Needs a tokio runtime (the plugin process is driven by it).
pub async fn run(args: DryRun) -> Result<DryRunOk, DryRunFailure> {
    let name = match &args.upstream {
        Some(u) => UpstreamName::parse(u).map_err(|e| {
            fail(
                ERR_INVALID_PARAMS,
                format!("upstream name {u:?}: {e}"),
                Some("upstream"),
            )
        })?,
        None => UpstreamName::parse(&args.service)
            .or_else(|_| UpstreamName::parse("upstream"))
            .map_err(|e| fail(ERR_INVALID_PARAMS, e.to_string(), Some("upstream")))?,
    };
    let mut directives = Vec::new();
    for d in &args.directives {
        directives.push(ExtraDirective::parse(d).map_err(|e| {
            fail(
                ERR_INVALID_PARAMS,
                format!("extra directive {d:?}: {e}"),
                Some("directive"),
            )
        })?);
    }

    let (host, errors) = PluginHost::load(&args.plugins_dir, args.host_options.clone());
    if !host.plugins().iter().any(|p| p.name == args.plugin) {
        let mut msg = format!(
            "no plugin named {:?} in {}",
            args.plugin,
            args.plugins_dir.display()
        );
        if !errors.is_empty() {
            let texts: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            msg.push_str(&format!(" (refused at load: {})", texts.join("; ")));
        }
        return Err(fail(ERR_INVALID_PARAMS, msg, Some("plugin")));
    }
    let Some(decl) = host.provider(&args.plugin, &args.provider) else {
        return Err(fail(
            ERR_INVALID_PARAMS,
            format!(
                "plugin {:?} has no provider {:?}",
                args.plugin, args.provider
            ),
            Some("provider"),
        ));
    };
    let mut config = ConfigMap::new();
    for (k, v) in &args.config {
        config.insert(k.clone(), Value::String(v.clone()));
    }
    if let Err(e) = tributary_core::coerce_config(&mut config, &decl) {
        return Err(fail(ERR_CONFIG, e.to_string(), Some(e.field())));
    }
    let binding = Binding {
        name: name.clone(),
        plugin: args.plugin.clone(),
        provider: args.provider.clone(),
        config: config.clone(),
        service: args.service.clone(),
        interval: tributary_core::schedule::DEFAULT_INTERVAL,
        directives: directives.clone(),
        drain_secs: 0,
        probe: None,
    };
    if let Err(e) = binding.validate() {
        return Err(fail(ERR_INVALID_PARAMS, e.to_string(), Some(e.field())));
    }
    if let Err(e) = binding.validate_against(&decl) {
        return Err(fail(ERR_CONFIG, e.to_string(), Some(e.field())));
    }

    let params = ResolveParams {
        provider: args.provider.clone(),
        config,
        service: args.service.clone(),
    };
    let answer = host.resolve(&args.plugin, params).await;
    host.shutdown().await;
    let answer =
        answer.map_err(|e| fail(e.code().unwrap_or(ERR_PROVIDER), e.to_string(), e.field()))?;
    let r = Resolved::new(&name, &directives, &answer);
    let Some(rendered) = r.rendered else {
        let reason = r.no_target_reason().unwrap_or_default();
        return Err(fail(
            ERR_PROVIDER,
            format!("{reason}: nothing would be written"),
            None,
        ));
    };
    Ok(DryRunOk {
        targets: r.targets,
        dropped: r.dropped,
        ttl_seconds: r.ttl_seconds,
        rendered: args.live.file_text(rendered),
    })
}
