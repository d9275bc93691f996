//! The `tributary` command line (reference: `docs/cli.md`).
//!
//! - `serve`: the daemon (engine + JSON API).
//! - `binding add|list|show|rm|refresh`: clients of a running daemon's API.
//! - `plugin list|check`: read a plugins directory / run the conformance checker.
//! - `resolve`: a dry run that calls a plugin once and touches nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Parser, Subcommand};
use hyper::Method;
use serde_json::Value;
use tributary_apply::{Applier, ApplyOptions, CommandNginx, ReloadConfirm};
use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_store::{Applied, OutcomeRecord, OutcomeStatus};

use crate::api::ApiState;
use crate::client::{ApiFailure, Client};
use crate::engine::{ApplyMode, Engine, EngineOptions, LiveOptions};
use crate::live_api::LiveApi;
use crate::view::{
    BindingDetail, BindingInput, BindingList, BindingView, ErrorDetail, PluginList, RemoveResponse,
    SaveResponse, StoreView,
};

/// Default API address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9180";
/// Default data folder (relative to the working directory).
pub const DEFAULT_DATA_DIR: &str = ".tributary";

#[derive(Debug, Parser)]
#[command(
    name = "tributary",
    version,
    about = "Dynamic upstreams for nginx: bind an upstream to a discovered service"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the daemon: the engine and the JSON API.
    Serve(Box<ServeArgs>),
    /// Manage bindings of a running daemon (through its API).
    Binding {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        cmd: BindingCmd,
    },
    /// Inspect plugins.
    Plugin {
        #[command(subcommand)]
        cmd: PluginCmd,
    },
    /// Dry run: call a plugin once, print what would be written; touches nothing.
    Resolve(ResolveArgs),
}

#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct ServeArgs {
    /// TOML file of these options (keys in snake_case); options given here override it.
    /// Default: /etc/tributary/tributary.toml when it exists (see docs/cli.md).
    #[arg(long)]
    config_file: Option<PathBuf>,
    /// API address (loopback by default).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Data folder: the SQLite store and the API token [env: TRIBUTARY_DATA_DIR; default .tributary].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Plugins directory (one folder per plugin) [env: TRIBUTARY_PLUGINS_DIR; default ./plugins].
    #[arg(long)]
    plugins_dir: Option<PathBuf>,
    /// nginx conf dir; files go to CONF_DIR/upstreams/. Default: --conf-path of `nginx -V`.
    #[arg(long)]
    conf_dir: Option<PathBuf>,
    /// nginx binary, for `nginx -V` and the default test/reload commands.
    #[arg(long, default_value = "nginx")]
    nginx: PathBuf,
    /// Test command, split on whitespace. Default: `NGINX -t`.
    #[arg(long)]
    test_cmd: Option<String>,
    /// Reload command, split on whitespace. Default: `NGINX -s reload`.
    #[arg(long)]
    reload_cmd: Option<String>,
    /// Minimum gap between two reloads, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    min_reload_gap_ms: u64,
    /// The running nginx's pid file, to confirm reloads. Default: the main-level `pid` of the
    /// configuration the test command checks (`TEST_CMD -T`), else `--pid-path` of `nginx -V`.
    #[arg(long)]
    nginx_pid_file: Option<PathBuf>,
    /// nginx's main error log, read after a reload for the [emerg] text of a rejection. Default:
    /// the main-level `error_log` of that configuration, else `--error-log-path` of `nginx -V`.
    #[arg(long)]
    nginx_error_log: Option<PathBuf>,
    /// How long a reload has to be confirmed live (new workers only), in milliseconds.
    #[arg(long, default_value_t = 5000)]
    reload_confirm_timeout_ms: u64,
    /// Count a reload as live when the reload command exits 0, without watching the workers
    /// (nginx in another pid namespace, no /proc, master_process off).
    #[arg(long)]
    no_reload_confirm: bool,
    /// A batch of changes closes after this many ms without a new change...
    #[arg(long, default_value_t = 100)]
    batch_quiet_ms: u64,
    /// ...or this many ms after its first change.
    #[arg(long, default_value_t = 1000)]
    batch_max_ms: u64,
    /// A batch whose changes can all go live (live mode: no reload to share) closes after this
    /// many ms without a new change...
    #[arg(long, default_value_t = 2)]
    batch_live_quiet_ms: u64,
    /// ...or this many ms after its first change (at most --batch-max-ms).
    #[arg(long, default_value_t = 10)]
    batch_live_max_ms: u64,
    /// Outcomes kept per binding.
    #[arg(long, default_value_t = 20)]
    history: usize,
    /// How long a plugin may take to answer, in seconds.
    #[arg(long, default_value_t = 30)]
    plugin_timeout_secs: u64,
    /// A host name the API and UI answer to besides the listen address and localhost (e.g. a
    /// reverse proxy's name); repeatable. Requests naming any other host are refused (421).
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Refresh jitter in percent (0-50): the first scheduled refresh of a binding is spread over its
    /// interval and each later one comes up to this much early; 0 keeps the exact schedule.
    #[arg(long, default_value_t = crate::engine::refresh::DEFAULT_JITTER_PCT,
          value_parser = clap::value_parser!(u8).range(0..=crate::engine::refresh::MAX_JITTER_PCT as i64))]
    refresh_jitter_pct: u8,
    /// Calls in flight to one plugin at most; refreshes beyond wait their turn.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    plugin_concurrency: u32,
    /// How changes are made live: `reload` (always reload nginx), `live` (server changes through
    /// the module's upstreams API, needs --live-api; the rest by reload), `auto` (live when
    /// --live-api is given and answers, else reload).
    #[arg(long = "apply", value_enum, default_value_t = ApplyMode::Auto)]
    apply_mode: ApplyMode,
    /// The module's `upstreams_api` location: `unix:/path/to.sock[:/location/]` or
    /// `http://127.0.0.1:PORT/location/` (loopback only).
    #[arg(long)]
    live_api: Option<String>,
    #[command(flatten)]
    store: crate::store_args::StoreArgs,
}

#[derive(Debug, Args)]
struct ApiArgs {
    /// Daemon API address [env: TRIBUTARY_API; default http://127.0.0.1:9180].
    #[arg(long, global = true)]
    api: Option<String>,
    /// Data folder holding the daemon's token file (unless TRIBUTARY_TOKEN is set)
    /// [env: TRIBUTARY_DATA_DIR; default .tributary].
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum BindingCmd {
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
struct AddArgs {
    /// Upstream name (letters, digits, _ - .; 1-128; not starting with .).
    name: String,
    #[arg(long)]
    plugin: String,
    #[arg(long)]
    provider: String,
    #[arg(long)]
    service: String,
    /// Provider config, KEY=VALUE, KEY=@FILE (the file's text) or KEY=- (standard input)
    /// (repeatable). Secret fields only as @FILE or -, never inline.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
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
    /// Replace the binding if it exists.
    #[arg(long)]
    replace: bool,
    /// Return right away instead of waiting for the first resolution.
    #[arg(long)]
    no_wait: bool,
}

#[derive(Debug, Subcommand)]
enum PluginCmd {
    /// List the plugins of a directory and their providers.
    List {
        /// Plugins directory [env: TRIBUTARY_PLUGINS_DIR; default ./plugins].
        #[arg(long)]
        plugins_dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Conformance check of one plugin folder (exit 1 when a check fails).
    Check {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct ResolveArgs {
    #[arg(long)]
    plugins_dir: PathBuf,
    #[arg(long)]
    plugin: String,
    #[arg(long)]
    provider: String,
    #[arg(long)]
    service: String,
    /// Provider config, KEY=VALUE, KEY=@FILE (the file's text) or KEY=- (standard input)
    /// (repeatable). Secret fields only as @FILE or -, never inline.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
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

/// Entry point of the binary.
pub fn main() -> ExitCode {
    use clap::CommandFactory;
    let cli = match crate::settings::expand_args(std::env::args_os().collect(), &Cli::command()) {
        Ok(args) => Cli::parse_from(args),
        Err(e) => {
            eprintln!("tributary: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tributary: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.cmd {
            Cmd::Serve(a) => serve(*a).await.map(|_| ExitCode::SUCCESS),
            Cmd::Binding { api, cmd } => binding(api, cmd).await,
            Cmd::Plugin { cmd } => plugin(cmd).await,
            Cmd::Resolve(a) => Ok(resolve(a).await),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tributary: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn env_path(flag: Option<PathBuf>, var: &str, default: &str) -> PathBuf {
    flag.or_else(|| std::env::var_os(var).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(default))
}

/// How reloads are confirmed: the options, else what nginx's configuration says.
fn reload_confirm(
    nginx: &Path,
    test_cmd: &[String],
    pid_file: Option<PathBuf>,
    error_log: Option<PathBuf>,
    timeout_ms: u64,
    off: bool,
) -> anyhow::Result<Option<ReloadConfirm>> {
    if off {
        tracing::warn!(
            "--no-reload-confirm: a reload counts as live once the reload command exits 0"
        );
        return Ok(None);
    }
    let found = match (&pid_file, &error_log) {
        (Some(_), Some(_)) => tributary_apply::ReloadPaths::default(),
        _ => tributary_apply::discover_reload_paths(nginx, test_cmd),
    };
    let pid_file = pid_file.or(found.pid_file).ok_or_else(|| {
        anyhow!(
            "cannot tell where nginx writes its pid file (neither `{} -T` nor `{} -V` says): \
             pass --nginx-pid-file, or --no-reload-confirm",
            test_cmd.join(" "),
            nginx.display()
        )
    })?;
    let error_log = error_log.or(found.error_log);
    if error_log.is_none() {
        tracing::warn!(
            "nginx's error log is not a file tributary can read: a rejected reload is reported \
             without nginx's [emerg] text (pass --nginx-error-log)"
        );
    }
    tracing::info!(pid_file = %pid_file.display(), error_log = ?error_log, "reloads are confirmed by watching nginx's workers");
    Ok(Some(ReloadConfirm {
        pid_file,
        error_log,
        timeout: Duration::from_millis(timeout_ms.max(1)),
    }))
}

/// Logs what crash recovery found in the upstreams folder at start.
fn log_recovery(r: &tributary_apply::RecoveryReport) {
    if r.pending.is_empty() {
        return;
    }
    let names: Vec<&str> = r.pending.iter().map(|n| n.as_str()).collect();
    if let Some(e) = &r.restore_error {
        tracing::error!(upstreams = ?names, error = %e, "changes interrupted by a crash could not be undone; their journals are kept");
    } else if r.restored {
        tracing::warn!(upstreams = ?names, test_error = ?r.test_error, reload_error = ?r.reload.as_ref().and_then(|x| x.as_ref().err()), "changes interrupted by a crash were undone");
    } else {
        tracing::info!(upstreams = ?names, "changes interrupted by a crash pass nginx -t and were made live");
    }
    if let Some(e) = &r.still_failing {
        tracing::error!(error = %e, "nginx -t still fails, not because of tributary's files");
    }
}

fn split_cmd(s: &str, what: &str) -> anyhow::Result<Vec<String>> {
    let v: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    if v.is_empty() {
        bail!("{what} is empty");
    }
    Ok(v)
}

/// Longest `--config KEY=@FILE` / `KEY=-` value read.
const MAX_CONFIG_VALUE: u64 = 1024 * 1024;

/// Where one `--config` value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ConfigValue {
    /// `KEY=VALUE` (`KEY=@@X` gives the value `@X`).
    Inline(String),
    /// `KEY=@FILE`: the file's text.
    File(PathBuf),
    /// `KEY=-`: standard input's text.
    Stdin,
}

fn parse_kv(list: &[String]) -> anyhow::Result<Vec<(String, ConfigValue)>> {
    list.iter()
        .map(|kv| {
            // The argument may be a secret value: never echo it.
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                anyhow!("--config expects KEY=VALUE, KEY=@FILE or KEY=-; one --config argument has no '='")
            })?;
            if k.is_empty() {
                bail!("--config expects KEY=VALUE, got an empty KEY");
            }
            let value = if v == "-" {
                ConfigValue::Stdin
            } else if let Some(rest) = v.strip_prefix("@@") {
                ConfigValue::Inline(format!("@{rest}"))
            } else if let Some(path) = v.strip_prefix('@') {
                if path.is_empty() {
                    bail!("--config {k}=@ names no file: give {k}=@FILE");
                }
                ConfigValue::File(PathBuf::from(path))
            } else {
                ConfigValue::Inline(v.to_string())
            };
            Ok((k.to_string(), value))
        })
        .collect()
}

/// The `--config` values as text: files and stdin read (one final line break dropped), inline
/// values of the fields `is_secret` says are secret refused (they would show in `ps` and in shell
/// history). Errors name the key and the file, never a value.
fn read_config(
    list: &[(String, ConfigValue)],
    is_secret: impl Fn(&str) -> bool,
    stdin: &mut dyn std::io::Read,
) -> anyhow::Result<Vec<(String, String)>> {
    use std::io::Read;
    let from_stdin = list
        .iter()
        .filter(|(_, v)| *v == ConfigValue::Stdin)
        .count();
    if from_stdin > 1 {
        bail!("--config KEY=- reads standard input: only one key can be given that way");
    }
    let mut out = Vec::with_capacity(list.len());
    for (k, v) in list {
        let text = match v {
            ConfigValue::Inline(_) if is_secret(k) => bail!(
                "--config {k}: {k:?} is a secret field; a value on the command line shows in `ps` and in shell history: give it as {k}=@FILE (read from a file) or {k}=- (read from standard input)"
            ),
            ConfigValue::Inline(t) => t.clone(),
            ConfigValue::File(path) => {
                let f = std::fs::File::open(path).with_context(|| {
                    format!("--config {k}=@{}: cannot open the file", path.display())
                })?;
                let mut buf = Vec::new();
                f.take(MAX_CONFIG_VALUE + 1)
                    .read_to_end(&mut buf)
                    .with_context(|| {
                        format!("--config {k}=@{}: cannot read the file", path.display())
                    })?;
                config_text(k, buf, &format!("the file {}", path.display()))?
            }
            ConfigValue::Stdin => {
                let mut buf = Vec::new();
                stdin
                    .take(MAX_CONFIG_VALUE + 1)
                    .read_to_end(&mut buf)
                    .with_context(|| format!("--config {k}=-: cannot read standard input"))?;
                config_text(k, buf, "standard input")?
            }
        };
        out.push((k.clone(), text));
    }
    Ok(out)
}

/// A value read for `--config key`: UTF-8, at most [`MAX_CONFIG_VALUE`] bytes, one final `\n`
/// (or `\r\n`) dropped.
fn config_text(key: &str, mut buf: Vec<u8>, from: &str) -> anyhow::Result<String> {
    if buf.len() as u64 > MAX_CONFIG_VALUE {
        bail!("--config {key}: {from} holds more than {MAX_CONFIG_VALUE} bytes");
    }
    if buf.ends_with(b"\n") {
        buf.pop();
        if buf.ends_with(b"\r") {
            buf.pop();
        }
    }
    String::from_utf8(buf).map_err(|_| anyhow!("--config {key}: {from} is not UTF-8 text"))
}

/// The secret field keys of `plugin`'s `provider` in `decls` (none when it is unknown: the daemon
/// or the dry run refuses it with its own error).
fn secret_keys(decl: Option<&tributary_protocol::ProviderDecl>) -> Vec<String> {
    decl.map(|d| {
        d.configuration
            .fields
            .iter()
            .filter(|f| f.secret)
            .map(|f| f.key.clone())
            .collect()
    })
    .unwrap_or_default()
}

/// `--apply` and `--live-api` checked: live mode needs an API; the API is probed once to say in
/// the log what will happen (every batch asks it again).
async fn live_options(mode: ApplyMode, live_api: Option<&str>) -> anyhow::Result<LiveOptions> {
    let api = live_api
        .map(LiveApi::parse)
        .transpose()
        .map_err(|e| anyhow!("--live-api: {e}"))?;
    if mode == ApplyMode::Live && api.is_none() {
        bail!("--apply live needs --live-api (the module's upstreams_api location)");
    }
    match (&api, mode) {
        (Some(api), ApplyMode::Live | ApplyMode::Auto) => match api.list().await {
            Ok(names) => {
                tracing::info!(live_api = %api, upstreams = ?names, mode = ?mode, "live API answers: server changes go live")
            }
            Err(e) => {
                tracing::warn!(live_api = %api, error = %e, mode = ?mode, "live API does not answer now: changes take the reload path until it does")
            }
        },
        (None, _) => {
            tracing::info!(mode = ?mode, "no --live-api: every change is applied by reload")
        }
        (Some(_), ApplyMode::Reload) => {
            tracing::info!("--apply reload: --live-api is not used")
        }
    }
    Ok(LiveOptions { mode, api })
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    init_tracing();
    if let Some(f) = &a.config_file {
        tracing::info!(config_file = %f.display(), "settings read from the configuration file");
    }
    // Checked before anything is opened: a bad name changes nothing.
    let allowed_hosts = crate::web::host::AllowedHosts::new(a.listen, &a.allowed_hosts)?;
    let live = live_options(a.apply_mode, a.live_api.as_deref()).await?;
    let data_dir = env_path(a.data_dir, "TRIBUTARY_DATA_DIR", DEFAULT_DATA_DIR);
    let plugins_dir = env_path(a.plugins_dir, "TRIBUTARY_PLUGINS_DIR", "plugins");
    if !data_dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&data_dir)
            .with_context(|| format!("creating data folder {}", data_dir.display()))?;
    }
    let token = crate::token::load_or_create(&data_dir)?;
    let store = a.store.open(&data_dir, a.history).await?;
    let conf_dir = match a.conf_dir {
        Some(d) => d,
        None => tributary_apply::conf_dir_from_nginx_v(&a.nginx).with_context(|| {
            format!(
                "finding the conf dir from `{} -V` (or pass --conf-dir)",
                a.nginx.display()
            )
        })?,
    };
    let nginx = a.nginx.display().to_string();
    let test_cmd = match &a.test_cmd {
        Some(s) => split_cmd(s, "--test-cmd")?,
        None => vec![nginx.clone(), "-t".into()],
    };
    let reload_cmd = match &a.reload_cmd {
        Some(s) => split_cmd(s, "--reload-cmd")?,
        None => vec![nginx.clone(), "-s".into(), "reload".into()],
    };
    let confirm = reload_confirm(
        &a.nginx,
        &test_cmd,
        a.nginx_pid_file,
        a.nginx_error_log,
        a.reload_confirm_timeout_ms,
        a.no_reload_confirm,
    )?;
    let applier = Applier::open(
        &conf_dir,
        Box::new(CommandNginx::new(test_cmd, reload_cmd)),
        ApplyOptions {
            min_reload_gap: Duration::from_millis(a.min_reload_gap_ms),
            confirm,
        },
    )
    .with_context(|| format!("opening the nginx conf dir {}", conf_dir.display()))?;
    log_recovery(applier.recovery());
    let host_opts = HostOptions {
        timeout: Duration::from_secs(a.plugin_timeout_secs.max(1)),
        max_concurrent: a.plugin_concurrency as usize,
        // Each plugin's private HOME: <data dir>/plugin-homes/<plugin>.
        home_root: Some(std::path::absolute(data_dir.join("plugin-homes"))?),
        ..HostOptions::default()
    };
    let (host, load_errors) = PluginHost::load(&plugins_dir, host_opts);
    for e in &load_errors {
        tracing::warn!(error = %e, "plugin refused");
    }
    let names: Vec<String> = host.plugins().into_iter().map(|p| p.name).collect();
    tracing::info!(plugins_dir = %plugins_dir.display(), plugins = ?names, "plugins loaded");
    let engine = Engine::start(
        store,
        Arc::new(host),
        applier,
        EngineOptions {
            conf_dir: conf_dir.clone(),
            batch_quiet: Duration::from_millis(a.batch_quiet_ms),
            batch_max: Duration::from_millis(a.batch_max_ms.max(a.batch_quiet_ms)),
            batch_live_quiet: Duration::from_millis(a.batch_live_quiet_ms),
            batch_live_max: Duration::from_millis(a.batch_live_max_ms.max(a.batch_live_quiet_ms)),
            history_limit: a.history.max(1),
            refresh_jitter_pct: a.refresh_jitter_pct,
            live,
        },
    )?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    if !a.listen.ip().is_loopback() {
        tracing::warn!(listen = %a.listen, "the API listens beyond loopback");
    }
    tracing::info!(
        api = %format!("http://{}", listener.local_addr()?),
        conf_dir = %conf_dir.display(),
        token_file = %crate::token::token_path(&data_dir).display(),
        "tributary serving"
    );
    let state = ApiState {
        engine: engine.clone(),
        token: token.into(),
        load_errors: Arc::new(load_errors.iter().map(|e| e.to_string()).collect()),
    };
    let (login, source) = crate::web::session::Login::load_or_create(&data_dir)?;
    match &source {
        crate::web::session::PasswordSource::Created(file) => tracing::info!(
            ui = %format!("http://{}/", listener.local_addr()?),
            password_file = %file.display(),
            "web UI login: a password was created; read it from the password file"
        ),
        src => {
            tracing::info!(ui = %format!("http://{}/", listener.local_addr()?), password = ?src, "web UI")
        }
    }
    let app = crate::web::router(
        state,
        crate::web::WebOptions {
            conf_dir: conf_dir.clone(),
            login,
            allowed_hosts,
        },
    );
    // The client address reaches the handlers (the login rate limit counts per address).
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await
    .context("serving the API")?;
    tracing::info!("stopping");
    engine.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn client(api: &ApiArgs) -> anyhow::Result<Client> {
    let data_dir = env_path(api.data_dir.clone(), "TRIBUTARY_DATA_DIR", DEFAULT_DATA_DIR);
    let addr = api
        .api
        .clone()
        .or_else(|| std::env::var("TRIBUTARY_API").ok())
        .unwrap_or_else(|| format!("http://{DEFAULT_LISTEN}"));
    let token = crate::token::for_client(&data_dir)?;
    Client::new(&addr, token)
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
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

async fn binding(api: ApiArgs, cmd: BindingCmd) -> anyhow::Result<ExitCode> {
    let c = client(&api)?;
    let result = binding_inner(&c, api.json, cmd).await;
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

async fn binding_inner(c: &Client, json: bool, cmd: BindingCmd) -> anyhow::Result<ExitCode> {
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
                .find(|p| p.name == a.plugin)
                .and_then(|p| p.providers.iter().find(|d| d.code == a.provider));
            let secrets = secret_keys(decl);
            let input = BindingInput {
                name: name.clone(),
                plugin: a.plugin,
                provider: a.provider,
                config: read_config(
                    &parse_kv(&a.config)?,
                    |k| secrets.iter().any(|s| s == k),
                    &mut std::io::stdin(),
                )?
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect(),
                service: a.service,
                interval_secs: a.interval,
                directives: a.directives,
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
            let d: BindingDetail = c
                .call::<(), _>(Method::GET, &format!("/api/v1/bindings/{name}"), None)
                .await?;
            if json {
                print_json(&d)?;
            } else {
                println!("binding {}", d.binding.name);
                print_view(&d.binding);
                let store: Option<StoreView> = c
                    .call::<(), _>(Method::GET, "/api/v1/store", None)
                    .await
                    .ok();
                for line in d.binding.fleet.text_lines(store.as_ref()) {
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

fn outcome_line(o: &OutcomeRecord) -> String {
    let mut s = format!(
        "{} {}{} in {} ms: {} servers",
        format_time(o.at_ms),
        o.status.as_str(),
        o.failure.map(|f| format!(" ({f})")).unwrap_or_default(),
        o.duration_ms,
        o.kept.len()
    );
    if o.changed {
        s.push_str(", file changed");
    }
    match (o.applied, &o.applied_reason) {
        (Some(Applied::Live), _) => s.push_str(", applied live (no reload)"),
        (Some(Applied::Reload), Some(why)) => {
            s.push_str(&format!(", nginx reloaded (applied by reload: {why})"))
        }
        _ if o.reloaded => s.push_str(", nginx reloaded"),
        _ => {}
    }
    if let Some(code) = o.code {
        s.push_str(&format!(", code {code}"));
    }
    if let Some(f) = &o.field {
        s.push_str(&format!(", field {f}"));
    }
    if let Some(w) = &o.why {
        s.push_str(&format!(" — {w}"));
    }
    s
}

pub(crate) fn format_time(ms: i64) -> String {
    // UTC, without pulling a date crate: days since epoch → civil date.
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn print_view(b: &BindingView) {
    println!("  plugin/provider: {}/{}", b.plugin, b.provider);
    println!("  service: {}", b.service);
    println!("  interval: {} s", b.interval_secs);
    for (k, v) in &b.config {
        println!("  config {k}: {v}");
    }
    for (k, set) in &b.secrets {
        println!(
            "  config {k}: {}",
            if *set {
                "(secret, set)"
            } else {
                "(secret, not set)"
            }
        );
    }
    for d in &b.directives {
        println!("  directive: {d}");
    }
    println!("  file: {}", b.file);
    println!("  add at http level: {}", b.include_line);
    match &b.last_outcome {
        Some(o) => {
            println!("  last: {}", outcome_line(o));
            if let Some(e) = &o.nginx_error {
                println!("  nginx: {}", e.trim());
            }
            for d in &o.dropped {
                println!("  dropped: {} ({})", d.target, d.reason);
            }
        }
        None => println!("  last: not resolved yet"),
    }
    if b.servers.is_empty() {
        println!("  servers: none known");
    } else {
        println!("  servers:");
        for s in &b.servers {
            println!("    {s}");
        }
    }
    if let Some(n) = b.next_refresh_ms {
        println!("  next refresh: {}", format_time(n));
    }
}

async fn plugin(cmd: PluginCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginCmd::List { plugins_dir, json } => {
            let dir = env_path(plugins_dir, "TRIBUTARY_PLUGINS_DIR", "plugins");
            let (host, errors) = PluginHost::load(&dir, HostOptions::default());
            let list = PluginList {
                plugins: host
                    .plugins()
                    .into_iter()
                    .map(|p| crate::view::PluginView {
                        providers: p.manifest.providers().to_vec(),
                        name: p.name,
                        version: p.version,
                        description: p.description,
                        dir: p.dir.display().to_string(),
                    })
                    .collect(),
                errors: errors.iter().map(|e| e.to_string()).collect(),
            };
            if json {
                print_json(&list)?;
            } else {
                for p in &list.plugins {
                    println!("{} {} — {}", p.name, p.version, p.description);
                    for pr in &p.providers {
                        let fields: Vec<String> = pr
                            .configuration
                            .fields
                            .iter()
                            .map(|f| {
                                let mut s = f.key.clone();
                                if f.required {
                                    s.push('*');
                                }
                                if f.secret {
                                    s.push_str(" (secret)");
                                }
                                s
                            })
                            .collect();
                        println!(
                            "  provider {} ({}): {}",
                            pr.code,
                            pr.name,
                            fields.join(", ")
                        );
                    }
                }
                for e in &list.errors {
                    println!("refused: {e}");
                }
                if list.plugins.is_empty() && list.errors.is_empty() {
                    println!("no plugins in {}", dir.display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCmd::Check { dir, json } => plugin_check(&dir, json).await,
    }
}

async fn plugin_check(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let report = tributary_plugin_host::check::check_plugin(dir).await;
    if json {
        print_json(&report)?;
    } else {
        print!("{report}");
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn resolve(a: ResolveArgs) -> ExitCode {
    // Which fields are secret: from the plugin's manifest (loading starts no process).
    let (host, _) = PluginHost::load(&a.plugins_dir, HostOptions::default());
    let secrets = secret_keys(host.provider(&a.plugin, &a.provider).as_ref());
    drop(host);
    let config = parse_kv(&a.config).and_then(|list| {
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
        plugin: a.plugin,
        provider: a.provider,
        service: a.service,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_parsing_never_echoes_values() {
        let err = parse_kv(&["s3cr3tvalue".into()]).unwrap_err().to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
        assert_eq!(
            parse_kv(&["a=b=c".into()]).unwrap(),
            vec![("a".to_string(), ConfigValue::Inline("b=c".into()))]
        );
        assert!(parse_kv(&["=v".into()]).is_err());
        assert_eq!(
            parse_kv(&["a=@/f".into(), "b=-".into(), "c=@@x".into()]).unwrap(),
            vec![
                ("a".to_string(), ConfigValue::File("/f".into())),
                ("b".to_string(), ConfigValue::Stdin),
                ("c".to_string(), ConfigValue::Inline("@x".into())),
            ]
        );
        assert!(parse_kv(&["a=@".into()]).is_err());
    }

    fn read(args: &[&str], stdin: &str) -> anyhow::Result<Vec<(String, String)>> {
        let list: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        read_config(&parse_kv(&list)?, |k| k == "token", &mut stdin.as_bytes())
    }

    #[test]
    fn config_values_come_from_files_and_stdin_and_secrets_never_inline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cr3t-from-file\n").unwrap();
        let arg = format!("token=@{}", file.display());
        assert_eq!(
            read(&[&arg, "address=http://a"], "").unwrap(),
            vec![
                ("token".to_string(), "s3cr3t-from-file".to_string()),
                ("address".to_string(), "http://a".to_string())
            ]
        );
        assert_eq!(
            read(&["token=-"], "s3cr3t-from-stdin\r\n").unwrap(),
            vec![("token".to_string(), "s3cr3t-from-stdin".to_string())]
        );
        // A secret field given inline is refused, naming the field and the ways to give it.
        let err = read(&["token=s3cr3t-inline"], "").unwrap_err().to_string();
        assert!(err.contains("\"token\" is a secret field"), "{err}");
        assert!(
            err.contains("token=@FILE") && err.contains("token=-"),
            "{err}"
        );
        assert!(!err.contains("s3cr3t"), "{err}");
        // Two keys from stdin, a missing file, a file too big: clear errors without values.
        let err = read(&["token=-", "address=-"], "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("only one key"), "{err}");
        let err = read(&["token=@/no/such/file"], "").unwrap_err();
        assert!(
            format!("{err:#}").contains("token=@/no/such/file: cannot open"),
            "{err:#}"
        );
        std::fs::write(&file, vec![b'x'; MAX_CONFIG_VALUE as usize + 1]).unwrap();
        let err = read(&[&arg], "").unwrap_err().to_string();
        assert!(err.contains("more than 1048576 bytes"), "{err}");
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        let err = read(&[&arg], "").unwrap_err().to_string();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn time_formatting() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(1_700_000_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        // settings.rs puts the configuration file's options first: a later option must win.
        let cli = Cli::parse_from(["tributary", "serve", "--history", "5", "--history", "7"]);
        assert!(matches!(cli.cmd, Cmd::Serve(a) if a.history == 7));
    }
}
