//! `tributary resolve`: the dry run's options and output (the run itself is [`crate::dry_run`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tributary_plugin_host::{HostOptions, PluginHost};

use super::config::{parse_kv, read_config, secret_keys, SourceArgs};
use crate::engine::{ApplyMode, LiveOptions};
use crate::live_api::LiveApi;

#[derive(Debug, Args)]
pub(super) struct ResolveArgs {
    #[arg(long)]
    plugins_dir: PathBuf,
    #[command(flatten)]
    source: SourceArgs,
    /// Upstream name in the rendered file (default: the service if it is a valid name, else `upstream`).
    #[arg(long)]
    upstream: Option<String>,
    /// Extra directive (repeatable).
    #[arg(long = "directive")]
    directives: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// How long the plugin may take, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Show the file as `serve --apply MODE` writes it (with `--live-api`, live and auto add
    /// the `zone` line); nothing is contacted.
    #[arg(long = "apply", value_enum, default_value_t = ApplyMode::Auto)]
    apply_mode: ApplyMode,
    /// As `serve --live-api` (only whether it is given matters here; it is not contacted).
    #[arg(long)]
    live_api: Option<String>,
}

pub(super) async fn run(a: ResolveArgs) -> ExitCode {
    // Which fields are secret: from the plugin's manifest (loading starts no process).
    let (host, _) = PluginHost::load(&a.plugins_dir, HostOptions::default());
    let secrets = secret_keys(host.provider(&a.source.plugin, &a.source.provider).as_ref());
    drop(host);
    let config = parse_kv(&a.source.config).and_then(|list| {
        read_config(
            &list,
            |k| secrets.iter().any(|s| s == k),
            &mut std::io::stdin(),
        )
    });
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            let f = crate::dry_run::DryRunFailure {
                error: crate::dry_run::DryRunError {
                    code: tributary_protocol::ERR_INVALID_PARAMS,
                    message: e.to_string(),
                    field: Some("config".into()),
                },
            };
            return print_failure(&f, a.json);
        }
    };
    let api = match a.live_api.as_deref().map(LiveApi::parse).transpose() {
        Ok(api) => api,
        Err(e) => {
            let f = crate::dry_run::DryRunFailure {
                error: crate::dry_run::DryRunError {
                    code: tributary_protocol::ERR_INVALID_PARAMS,
                    message: format!("--live-api: {e}"),
                    field: Some("live_api".into()),
                },
            };
            return print_failure(&f, a.json);
        }
    };
    let args = crate::dry_run::DryRun {
        plugins_dir: a.plugins_dir,
        plugin: a.source.plugin,
        provider: a.source.provider,
        service: a.source.service,
        config,
        upstream: a.upstream,
        directives: a.directives,
        host_options: HostOptions {
            timeout: Duration::from_secs(a.timeout_secs.max(1)),
            ..HostOptions::default()
        },
        live: LiveOptions {
            mode: a.apply_mode,
            api,
            ..LiveOptions::default()
        },
    };
    match crate::dry_run::run(args).await {
        Ok(ok) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string(&ok).unwrap_or_else(|_| "{}".into())
                );
            } else {
                print!("{}", ok.rendered);
                if !ok.dropped.is_empty() {
                    eprintln!("{}", tributary_core::summarize_dropped(&ok.dropped));
                }
                eprintln!(
                    "{} servers, ttl {} s (dry run: nothing written)",
                    ok.targets.len(),
                    ok.ttl_seconds
                );
            }
            ExitCode::SUCCESS
        }
        Err(f) => print_failure(&f, a.json),
    }
}

fn print_failure(f: &crate::dry_run::DryRunFailure, json: bool) -> ExitCode {
    if json {
        println!(
            "{}",
            serde_json::to_string(f).unwrap_or_else(|_| "{}".into())
        );
    } else {
        match &f.error.field {
            Some(field) => eprintln!(
                "tributary: {} (code {}, field {field})",
                f.error.message, f.error.code
            ),
            None => eprintln!("tributary: {} (code {})", f.error.message, f.error.code),
        }
    }
    ExitCode::FAILURE
}
