//! `tributary serve`: its options and the daemon's start-up (store, applier, plugins, engine,
//! API and web UI) until a signal stops it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use tributary_apply::{Applier, ApplyOptions, CommandNginx, ReloadConfirm};
use tributary_plugin_host::{HostOptions, PluginHost};

use super::{env_path, DEFAULT_DATA_DIR, DEFAULT_LISTEN};
use crate::engine::{ApplyMode, Engine, EngineOptions, LiveOptions, LiveTest};
use crate::live_api::LiveApi;

#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub(super) struct ServeArgs {
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
    /// interval and each later one is drawn from a window of this much of the delay (up to this
    /// much early; later at the 10 s minimum); 0 keeps the exact schedule.
    #[arg(long, default_value_t = crate::engine::refresh::DEFAULT_JITTER_PCT,
          value_parser = clap::value_parser!(u8).range(0..=crate::engine::refresh::MAX_JITTER_PCT as i64))]
    refresh_jitter_pct: u8,
    /// Degraded mode for a fleet (opt-in): while the store (etcd) is unreachable, each host
    /// resolves its bindings itself and applies what it resolved (every host calls the registry;
    /// hosts may differ until the store answers and the fleet's sets are applied again).
    #[arg(long)]
    resolve_during_store_outage: bool,
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
    /// Which live changes run the test command: `first` (an upstream's first live change after
    /// start; later ones differ from a tested file only in server addresses and weights, checked
    /// by the daemon), `every` (each one, after its PUT; a failed test takes the set back).
    #[arg(long, value_enum, default_value_t = LiveTest::First)]
    live_test: LiveTest,
    #[command(flatten)]
    store: crate::store_args::StoreArgs,
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

/// `--apply` and `--live-api` checked: live mode needs an API; the API is probed once to say in
/// the log what will happen (every batch asks it again). A read-only API (no `write=on`) stops
/// `--apply live` here with the fix; `auto` says so and reloads until it takes writes.
async fn live_options(
    mode: ApplyMode,
    live_api: Option<&str>,
    test: LiveTest,
) -> anyhow::Result<LiveOptions> {
    let api = live_api
        .map(LiveApi::parse)
        .transpose()
        .map_err(|e| anyhow!("--live-api: {e}"))?;
    if mode == ApplyMode::Live && api.is_none() {
        bail!("--apply live needs --live-api (the module's upstreams_api location)");
    }
    match (&api, mode) {
        (Some(api), ApplyMode::Live | ApplyMode::Auto) => match api.probe().await {
            Ok(l) if !l.write && mode == ApplyMode::Live => {
                bail!("--apply live: {}", api.read_only())
            }
            Ok(l) if !l.write => {
                tracing::warn!(live_api = %api, mode = ?mode, "{}; until then every change is applied by reload", api.read_only())
            }
            Ok(l) => {
                let names: Vec<&String> = l.upstreams.keys().collect();
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
    Ok(LiveOptions {
        mode,
        api,
        test,
        zone_floors: Default::default(),
    })
}

pub(super) async fn run(a: ServeArgs) -> anyhow::Result<()> {
    init_tracing();
    if let Some(f) = &a.config_file {
        tracing::info!(config_file = %f.display(), "settings read from the configuration file");
    }
    // Checked before anything is opened: a bad name changes nothing.
    let allowed_hosts = crate::http::host::AllowedHosts::new(a.listen, &a.allowed_hosts)?;
    let live = live_options(a.apply_mode, a.live_api.as_deref(), a.live_test).await?;
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
    // What this host can resolve, for the fleet's resolver choice (`docs/fleet.md`): a host
    // without a binding's plugin is left out of it rather than holding its claim.
    let providers = host
        .plugins()
        .iter()
        .flat_map(|p| {
            p.manifest
                .providers()
                .iter()
                .map(|d| tributary_store::provider_pair(&p.name, &d.code))
                .collect::<Vec<_>>()
        })
        .collect();
    let store = a.store.open(&data_dir, a.history, providers).await?;
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
            resolve_during_outage: a.resolve_during_store_outage,
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
    let (login, source) = crate::http::auth::session::Login::load_or_create(&data_dir)?;
    match &source {
        crate::http::auth::session::PasswordSource::Created(file) => tracing::info!(
            ui = %format!("http://{}/", listener.local_addr()?),
            password_file = %file.display(),
            "web UI login: a password was created; read it from the password file"
        ),
        src => {
            tracing::info!(ui = %format!("http://{}/", listener.local_addr()?), password = ?src, "web UI")
        }
    }
    let app = crate::http::router(
        engine.clone(),
        crate::http::Options {
            token,
            load_errors: load_errors.iter().map(|e| e.to_string()).collect(),
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Cmd};

    #[test]
    fn a_later_serve_option_wins() {
        // settings.rs puts the configuration file's options first: a later option must win.
        let cli = Cli::parse_from(["tributary", "serve", "--history", "5", "--history", "7"]);
        assert!(matches!(cli.cmd, Cmd::Serve(a) if a.history == 7));
    }
}
