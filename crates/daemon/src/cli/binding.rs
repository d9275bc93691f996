//! `tributary binding add|list|show|rm|refresh`: clients of a running daemon's API.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand};
use hyper::Method;
use serde_json::Value;
use tributary_store::{OutcomeRecord, OutcomeStatus};

use super::config::{parse_kv, read_config, secret_keys, SourceArgs};
use super::print::{fleet_lines, live_lines, outcome_line, print_view};
use super::{env_path, print_json, DEFAULT_DATA_DIR, DEFAULT_LISTEN};
use crate::client::{ApiFailure, Client};
use crate::view::{
    BindingInput, BindingList, BindingShow, ErrorDetail, PluginList, RemoveResponse, SaveResponse,
    StoreView,
};

#[derive(Debug, Args)]
pub(super) struct ApiArgs {
    /// Daemon API address [env: TRIBUTARY_API; default http://127.0.0.1:9180].
    #[arg(long, global = true)]
    api: Option<String>,
    /// Data folder holding the daemon's token file (unless TRIBUTARY_TOKEN is set)
    /// [env: TRIBUTARY_DATA_DIR; default .tributary].
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    pub(super) json: bool,
}

#[derive(Debug, Subcommand)]
pub(super) enum BindingCmd {
    /// Create a binding (or replace it with --replace); waits for its first resolution.
    Add(AddArgs),
    /// List bindings with their last outcome.
    List,
    /// Show one binding: settings, last outcome, servers, history.
    Show { name: String },
    /// Remove a binding and its file (kept if nginx still needs it).
    Rm { name: String },
    /// Resolve a binding now and print the outcome (exit 1 when it failed).
    Refresh { name: String },
}

#[derive(Debug, Args)]
pub(super) struct AddArgs {
    /// Upstream name (letters, digits, _ - .; 1-128; not starting with .).
    name: String,
    #[command(flatten)]
    source: SourceArgs,
    /// Extra directive for the upstream block, e.g. 'keepalive 32;' (repeatable).
    #[arg(long = "directive")]
    directives: Vec<String>,
    /// Refresh interval in seconds (10 to 604800; default 60). `--interval` is an alias.
    #[arg(
        long = "interval-secs",
        visible_alias = "interval",
        value_name = "SECS"
    )]
    interval: Option<u64>,
    /// Health probe for live mode: the module's `probe` directive parameters, e.g.
    /// 'uri=/healthz interval=1s fails=2 passes=2' (written as `probe ...;` in the upstream block).
    #[arg(long, value_name = "PARAMS")]
    probe: Option<String>,
    /// Graceful removal for live mode: a target that leaves discovery is drained (no new requests)
    /// and removed after SECS, or once it has no request in flight (default 0: removed at once).
    #[arg(long = "drain-secs", value_name = "SECS")]
    drain_secs: Option<u64>,
    /// Replace the binding if it exists.
    #[arg(long)]
    replace: bool,
    /// Return right away instead of waiting for the first resolution.
    #[arg(long)]
    no_wait: bool,
}

pub(super) fn client(api: &ApiArgs) -> anyhow::Result<Client> {
    let data_dir = env_path(api.data_dir.clone(), "TRIBUTARY_DATA_DIR", DEFAULT_DATA_DIR);
    let addr = api
        .api
        .clone()
        .or_else(|| std::env::var("TRIBUTARY_API").ok())
        .unwrap_or_else(|| format!("http://{DEFAULT_LISTEN}"));
    let token = crate::token::for_client(&data_dir)?;
    Client::new(&addr, token)
}

/// Binding names go into URL paths: only the characters upstream names may hold are sent as is.
fn path_segment(name: &str) -> anyhow::Result<&str> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        bail!("{name:?} is not a valid upstream name (letters, digits, _ - . only)");
    }
    Ok(name)
}

pub(super) async fn run(api: ApiArgs, cmd: BindingCmd) -> anyhow::Result<ExitCode> {
    let c = client(&api)?;
    let result = run_inner(&c, api.json, cmd).await;
    finish(&api, result)
}

/// An API failure printed (as JSON with `--json`) with exit code 1; other errors returned.
pub(super) fn finish(api: &ApiArgs, result: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    match result {
        Err(e) => match e.downcast_ref::<ApiFailure>() {
            Some(f) if api.json => {
                let mut out = serde_json::json!({
                    "error": {"status": f.status, "message": f.message, "field": f.field}
                });
                if !f.errors.is_empty() {
                    out["errors"] = serde_json::to_value(&f.errors)?;
                }
                print_json(&out)?;
                Ok(ExitCode::FAILURE)
            }
            Some(f) => {
                let first = [ErrorDetail {
                    message: f.message.clone(),
                    field: f.field.clone(),
                }];
                let all = if f.errors.is_empty() {
                    &first[..]
                } else {
                    &f.errors[..]
                };
                for e in all {
                    match &e.field {
                        Some(field) => eprintln!("tributary: {} (field: {field})", e.message),
                        None => eprintln!("tributary: {}", e.message),
                    }
                }
                Ok(ExitCode::FAILURE)
            }
            None => Err(e),
        },
        ok => ok,
    }
}

async fn run_inner(c: &Client, json: bool, cmd: BindingCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        BindingCmd::Add(a) => {
            let name = path_segment(&a.name)?.to_string();
            // Which fields are secret: from the daemon's plugin list.
            let plugins: PluginList = c
                .call::<(), _>(Method::GET, "/api/v1/plugins", None)
                .await?;
            let decl = plugins
                .plugins
                .iter()
                .find(|p| p.name == a.source.plugin)
                .and_then(|p| p.providers.iter().find(|d| d.code == a.source.provider));
            let secrets = secret_keys(decl);
            let input = BindingInput {
                name: name.clone(),
                plugin: Some(a.source.plugin),
                provider: Some(a.source.provider),
                config: read_config(
                    &parse_kv(&a.source.config)?,
                    |k| secrets.iter().any(|s| s == k),
                    &mut std::io::stdin(),
                )?
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect(),
                service: Some(a.source.service),
                interval_secs: a.interval,
                directives: a.directives,
                probe: a.probe,
                drain_secs: a.drain_secs,
            };
            let wait = if a.no_wait { "" } else { "?wait=true" };
            let resp: SaveResponse = if a.replace {
                c.call(
                    Method::PUT,
                    &format!("/api/v1/bindings/{name}{wait}"),
                    Some(&input),
                )
                .await?
            } else {
                c.call(
                    Method::POST,
                    &format!("/api/v1/bindings{wait}"),
                    Some(&input),
                )
                .await?
            };
            if json {
                print_json(&resp)?;
            } else {
                println!("{} binding {}", resp.result, resp.binding.name);
                print_view(&resp.binding);
            }
            Ok(ExitCode::SUCCESS)
        }
        BindingCmd::List => {
            let list: BindingList = c
                .call::<(), _>(Method::GET, "/api/v1/bindings", None)
                .await?;
            if json {
                print_json(&list)?;
            } else if list.bindings.is_empty() {
                println!("no bindings");
            } else {
                println!(
                    "{:<24} {:<20} {:<16} {:<16} {:>7}  WHY",
                    "NAME", "PLUGIN/PROVIDER", "SERVICE", "STATUS", "SERVERS"
                );
                for b in &list.bindings {
                    // A failure shows its kind (reload_failed, plugin_error...).
                    let (status, why) = match &b.last_outcome {
                        Some(o) => (
                            o.failure.map_or(o.status.as_str(), |f| f.as_str()),
                            o.why.clone().unwrap_or_default(),
                        ),
                        None => ("pending", String::new()),
                    };
                    println!(
                        "{:<24} {:<20} {:<16} {:<16} {:>7}  {}",
                        b.name,
                        format!("{}/{}", b.plugin, b.provider),
                        b.service,
                        status,
                        b.servers.len(),
                        why
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        BindingCmd::Show { name } => {
            let name = path_segment(&name)?;
            let d: BindingShow = c
                .call::<(), _>(Method::GET, &format!("/api/v1/bindings/{name}"), None)
                .await?;
            if json {
                print_json(&d)?;
            } else {
                println!("binding {}", d.binding.name);
                print_view(&d.binding);
                if let Some(live) = &d.live {
                    for line in live_lines(live) {
                        println!("{line}");
                    }
                }
                let store: Option<StoreView> = c
                    .call::<(), _>(Method::GET, "/api/v1/store", None)
                    .await
                    .ok();
                for line in fleet_lines(&d.binding.fleet, store.as_ref()) {
                    println!("{line}");
                }
                if !d.history.is_empty() {
                    println!("  history (newest first):");
                    for o in &d.history {
                        println!("    {}", outcome_line(o));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        BindingCmd::Rm { name } => {
            let name = path_segment(&name)?;
            let r: RemoveResponse = c
                .call::<(), _>(Method::DELETE, &format!("/api/v1/bindings/{name}"), None)
                .await?;
            if json {
                print_json(&r)?;
            } else if r.file_removed {
                println!("removed binding {} and its file", r.name);
            } else {
                println!("removed binding {} (it had no file)", r.name);
            }
            Ok(ExitCode::SUCCESS)
        }
        BindingCmd::Refresh { name } => {
            let name = path_segment(&name)?;
            let o: OutcomeRecord = c
                .call::<(), _>(
                    Method::POST,
                    &format!("/api/v1/bindings/{name}/refresh"),
                    None,
                )
                .await?;
            if json {
                print_json(&o)?;
            } else {
                println!("{}", outcome_line(&o));
                if let Some(e) = &o.nginx_error {
                    println!("  nginx: {}", e.trim());
                }
            }
            Ok(if o.status == OutcomeStatus::Failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}
