//! Runs Tributary discovery plugins.
//!
//! [`PluginHost::load`] reads a plugins directory (one folder per plugin, each with a `plugin.json`),
//! reports bad manifests and keeps the rest. Each plugin's executable is started once, lazily, on the
//! first call, and kept running; JSON-RPC 2.0 messages travel as one JSON object per line on its
//! stdin/stdout. Requests may be concurrent and are matched by `id`; each waits at most
//! [`HostOptions::timeout`]. A plugin that exits fails the requests in flight ([`ResolveError::Crashed`])
//! and is started again on a later call, after a back-off that doubles with each consecutive crash.
//! Lines over [`HostOptions::max_line`] and lines that are not JSON fail only the request they answer
//! (found by a tolerant scan for the `id`, or the single request in flight), never the others.
//! Stderr is the plugin's log: kept as the last [`HostOptions::stderr_lines`] lines, with every config
//! value ever sent to the plugin redacted before it is stored.
//!
//! Every config value is secret: no `Display` of this crate contains one (plugin error messages are
//! redacted), and nothing here logs them.
//!
//! [`check::check_plugin`] is the conformance checker behind `tributary plugin check DIR`.

pub mod check;
mod conn;
mod lines;
mod redact;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tributary_protocol::{
    Manifest, ManifestError, ProviderDecl, Request, ResolveParams, ResolveResult, ResponsePayload,
    RpcError,
};

use conn::{Conn, Reply};
pub use redact::{Redactor, MIN_SECRET_LEN, REDACTED};

/// Name of the manifest file in a plugin's folder.
pub const MANIFEST_FILE: &str = "plugin.json";

/// Tunables of the host. `Default` gives the production values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostOptions {
    /// How long one `discovery.resolve` may take (default 30 s).
    pub timeout: Duration,
    /// Longest accepted stdout line in bytes, without the `\n` (default 4 MiB).
    pub max_line: usize,
    /// How many stderr lines are kept per plugin (default 200). Each line is cut at 4 KiB.
    pub stderr_lines: usize,
    /// Wait before restarting a plugin after its first crash (default 1 s); doubles per consecutive
    /// crash, reset by a successful answer.
    pub restart_backoff: Duration,
    /// Cap of the restart back-off (default 60 s).
    pub restart_backoff_max: Duration,
    /// How long [`PluginHost::shutdown`] lets a plugin exit after closing its stdin before killing
    /// it (default 2 s).
    pub shutdown_grace: Duration,
    /// After this many calls in a row without an answer in time (default 3), the process is killed
    /// and restarted after the restart back-off. Any answer resets the count.
    pub max_timeouts: u32,
    /// Calls in flight to one plugin at most (default 16); further calls wait for a free place
    /// before their timeout starts. At least 1.
    pub max_concurrent: usize,
    /// Folder holding each plugin's private `HOME` (`<home_root>/<plugin name>`, mode 0700,
    /// created when missing). `None`: a temporary folder the host removes when dropped.
    pub home_root: Option<PathBuf>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_line: 4 * 1024 * 1024,
            stderr_lines: 200,
            restart_backoff: Duration::from_secs(1),
            restart_backoff_max: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(2),
            max_timeouts: 3,
            max_concurrent: 16,
            home_root: None,
        }
    }
}

/// A loaded plugin. Serialises as `{name, version, description, dir, manifest}`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    /// The plugin's folder.
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// A plugin folder that was refused at load. The others stay usable.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read plugins directory {}: {source}", dir.display())]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no plugin.json in the plugin folder", dir.display())]
    NoManifest { dir: PathBuf },
    #[error("{}: cannot read plugin.json: {source}", dir.display())]
    ReadManifest {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", dir.display())]
    Manifest { dir: PathBuf, source: ManifestError },
    #[error("{}: executable {} does not exist", dir.display(), path.display())]
    MissingExecutable { dir: PathBuf, path: PathBuf },
    #[error("{}: executable {} is not an executable file", dir.display(), path.display())]
    NotExecutable { dir: PathBuf, path: PathBuf },
    #[error("{}: plugin name {name:?} is already used by {}", dir.display(), first.display())]
    DuplicateName {
        dir: PathBuf,
        name: String,
        first: PathBuf,
    },
}

impl LoadError {
    /// The folder (or plugins directory) the error is about.
    pub fn dir(&self) -> &Path {
        match self {
            LoadError::ReadDir { dir, .. }
            | LoadError::NoManifest { dir }
            | LoadError::ReadManifest { dir, .. }
            | LoadError::Manifest { dir, .. }
            | LoadError::MissingExecutable { dir, .. }
            | LoadError::NotExecutable { dir, .. }
            | LoadError::DuplicateName { dir, .. } => dir,
        }
    }
}

/// Why a `discovery.resolve` call failed. `Display` never contains a config value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    #[error("unknown plugin {0:?}")]
    UnknownPlugin(String),
    #[error("plugin {plugin:?} has no provider {provider:?}")]
    UnknownProvider { plugin: String, provider: String },
    /// The plugin answered an error; message and data are redacted.
    #[error("plugin error: {0}")]
    Plugin(RpcError),
    #[error("no answer within {}", fmt_duration(*.0))]
    Timeout(Duration),
    /// The plugin exited while the request was in flight, or is waiting for its restart back-off.
    #[error("{0}")]
    Crashed(String),
    /// The answer was not a valid response or result (not JSON, too long, no `targets` array, ...).
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The executable could not be started.
    #[error("cannot start plugin: {0}")]
    Spawn(String),
}

impl ResolveError {
    /// The JSON-RPC error code, for errors the plugin answered.
    pub fn code(&self) -> Option<i64> {
        match self {
            ResolveError::Plugin(e) => Some(e.code),
            _ => None,
        }
    }

    /// `data.field` of an error the plugin answered (the config key at fault, or `"service"`).
    pub fn field(&self) -> Option<&str> {
        match self {
            ResolveError::Plugin(e) => e.field(),
            _ => None,
        }
    }

    fn redacted(self, r: &Redactor) -> Self {
        match self {
            ResolveError::Plugin(mut e) => {
                e.message = r.redact(&e.message);
                if let Some(d) = e.data.as_mut() {
                    r.redact_value(d);
                }
                ResolveError::Plugin(e)
            }
            ResolveError::Crashed(m) => ResolveError::Crashed(r.redact(&m)),
            ResolveError::Malformed(m) => ResolveError::Malformed(r.redact(&m)),
            ResolveError::Spawn(m) => ResolveError::Spawn(r.redact(&m)),
            other => other,
        }
    }
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Bounded, redacted stderr of one plugin (kept across restarts).
#[derive(Debug)]
struct StderrLog {
    lines: std::collections::VecDeque<String>,
    cap: usize,
}

impl StderrLog {
    fn push(&mut self, line: String) {
        if self.cap == 0 {
            return;
        }
        while self.lines.len() >= self.cap {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// Restart bookkeeping of one plugin.
#[derive(Default)]
struct SlotState {
    conn: Option<Arc<Conn>>,
    consecutive_crashes: u32,
    /// Calls in a row that got no answer in time from the current process.
    consecutive_timeouts: u32,
    not_before: Option<Instant>,
}

/// One plugin: its manifest and, once started, its process.
struct Slot {
    info: PluginInfo,
    exe: PathBuf,
    /// The whole environment of the process: the clean base and the manifest's variables.
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The private `HOME` (created at each start when missing).
    home: PathBuf,
    /// Places for calls in flight ([`HostOptions::max_concurrent`]).
    calls: tokio::sync::Semaphore,
    state: Mutex<SlotState>,
    /// Every config value ever sent to this plugin: redacted from its stderr.
    secrets: Mutex<Redactor>,
    stderr: Mutex<StderrLog>,
}

impl Slot {
    fn note(&self, text: String) {
        let text = lock(&self.secrets).redact(&text);
        tracing::debug!(plugin = %self.info.name, "{text}");
        lock(&self.stderr).push(format!("[tributary] {text}"));
    }
}

/// Locks a mutex, going on with the data of a poisoned one (every critical section here leaves
/// the data consistent).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The plugins of a plugins directory and their processes. `Send + Sync`; share it as
/// `Arc<PluginHost>`. Processes start on the first call, which needs a tokio runtime.
pub struct PluginHost {
    slots: BTreeMap<String, Arc<Slot>>,
    opts: HostOptions,
    /// The temporary home root when none is configured (removed with the host).
    _home_tmp: Option<tempfile::TempDir>,
    next_id: AtomicU64,
    closed: AtomicBool,
}

impl fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginHost")
            .field("plugins", &self.slots.keys().collect::<Vec<_>>())
            .field("opts", &self.opts)
            .finish()
    }
}

impl PluginHost {
    /// Reads every folder of `plugins_dir` (hidden ones excepted). Refused folders are returned as
    /// errors; the host holds the others. Starts no process.
    pub fn load(plugins_dir: &Path, opts: HostOptions) -> (PluginHost, Vec<LoadError>) {
        let mut errors = Vec::new();
        let mut slots: BTreeMap<String, Arc<Slot>> = BTreeMap::new();
        let mut dirs = Vec::new();
        match std::fs::read_dir(plugins_dir) {
            Ok(rd) => {
                for entry in rd.flatten() {
                    let path = entry.path();
                    let hidden = entry.file_name().to_string_lossy().starts_with('.');
                    if path.is_dir() && !hidden {
                        dirs.push(path);
                    }
                }
            }
            Err(source) => errors.push(LoadError::ReadDir {
                dir: plugins_dir.to_path_buf(),
                source,
            }),
        }
        dirs.sort();
        let (home_root, home_tmp) = match &opts.home_root {
            Some(r) => (r.clone(), None),
            None => match tempfile::Builder::new()
                .prefix("tributary-plugin-homes-")
                .tempdir()
            {
                Ok(t) => (t.path().to_path_buf(), Some(t)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a temporary folder for plugin homes");
                    (std::env::temp_dir().join("tributary-plugin-homes"), None)
                }
            },
        };
        for dir in dirs {
            match load_one(&dir) {
                Ok((info, exe)) => {
                    if let Some(first) = slots.get(&info.name) {
                        errors.push(LoadError::DuplicateName {
                            dir,
                            name: info.name.clone(),
                            first: first.info.dir.clone(),
                        });
                        continue;
                    }
                    let slot = Slot {
                        env: plugin_environment(&info.manifest.environment, std::env::vars_os()),
                        home: home_root.join(&info.name),
                        calls: tokio::sync::Semaphore::new(opts.max_concurrent.max(1)),
                        info,
                        exe,
                        state: Mutex::new(SlotState::default()),
                        secrets: Mutex::new(Redactor::default()),
                        stderr: Mutex::new(StderrLog {
                            lines: Default::default(),
                            cap: opts.stderr_lines,
                        }),
                    };
                    slots.insert(slot.info.name.clone(), Arc::new(slot));
                }
                Err(e) => errors.push(e),
            }
        }
        for e in &errors {
            tracing::warn!("plugin refused: {e}");
        }
        let host = PluginHost {
            slots,
            opts,
            _home_tmp: home_tmp,
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        };
        (host, errors)
    }

    /// The loaded plugins, by name.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        self.slots.values().map(|s| s.info.clone()).collect()
    }

    /// The provider `code` of `plugin`.
    pub fn provider(&self, plugin: &str, code: &str) -> Option<ProviderDecl> {
        self.slots
            .get(plugin)?
            .info
            .manifest
            .provider(code)
            .cloned()
    }

    /// The options in force.
    pub fn options(&self) -> &HostOptions {
        &self.opts
    }

    /// The last captured stderr lines of `plugin` (already redacted), oldest first. Lines starting
    /// with `[tributary]` are the host's own notes (exits, restarts, ignored stdout lines).
    pub fn stderr_tail(&self, plugin: &str) -> Vec<String> {
        match self.slots.get(plugin) {
            Some(s) => lock(&s.stderr).lines.iter().cloned().collect(),
            None => Vec::new(),
        }
    }

    /// Whether `plugin`'s process is running now.
    pub fn is_running(&self, plugin: &str) -> bool {
        self.slots
            .get(plugin)
            .and_then(|s| lock(&s.state).conn.clone())
            .is_some_and(|c| c.alive())
    }

    /// The process id of `plugin`'s running process.
    pub fn pid(&self, plugin: &str) -> Option<u32> {
        let conn = lock(&self.slots.get(plugin)?.state).conn.clone()?;
        conn.alive().then(|| conn.pid()).flatten()
    }

    /// Calls `discovery.resolve` on `plugin`. Checks the provider against the manifest first.
    pub async fn resolve(
        &self,
        plugin: &str,
        params: ResolveParams,
    ) -> Result<ResolveResult, ResolveError> {
        let slot = self
            .slots
            .get(plugin)
            .ok_or_else(|| ResolveError::UnknownPlugin(plugin.to_string()))?;
        if slot.info.manifest.provider(&params.provider).is_none() {
            return Err(ResolveError::UnknownProvider {
                plugin: plugin.to_string(),
                provider: params.provider.clone(),
            });
        }
        lock(&slot.secrets).add_config(&params.config);
        // A place among the calls in flight first: the timeout counts the plugin's time only.
        let _place = slot
            .calls
            .acquire()
            .await
            .map_err(|_| ResolveError::Spawn("the plugin host is shut down".into()))?;
        // Redacted with every value ever sent to this plugin (a superset of this call's config).
        self.call(slot, &params)
            .await
            .map_err(|e| e.redacted(&lock(&slot.secrets)))
    }

    async fn call(
        &self,
        slot: &Arc<Slot>,
        params: &ResolveParams,
    ) -> Result<ResolveResult, ResolveError> {
        let deadline = Instant::now() + self.opts.timeout;
        let conn = self.connection(slot, deadline).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = serde_json::to_vec(&Request::resolve(id, params))
            .map_err(|e| ResolveError::Malformed(format!("cannot encode the request: {e}")))?;
        line.push(b'\n');
        let rx = conn.register(id)?;
        let sent = tokio::time::timeout_at(deadline, conn.send(&line)).await;
        match sent {
            Err(_) => {
                conn.unregister(id);
                return Err(ResolveError::Timeout(self.opts.timeout));
            }
            Ok(Err(e)) => {
                conn.unregister(id);
                return Err(e);
            }
            Ok(Ok(())) => {}
        }
        // Per call, for the refresh-spread benchmark (`RUST_LOG=tributary_plugin_host=trace`).
        // The service is shown everywhere; no config value is logged.
        tracing::trace!(plugin = %slot.info.name, id, service = %params.service, "request sent");
        let reply = match tokio::time::timeout_at(deadline, rx).await {
            Err(_) => {
                conn.unregister(id);
                self.timed_out(slot, &conn);
                return Err(ResolveError::Timeout(self.opts.timeout));
            }
            Ok(Err(_)) => return Err(ResolveError::Crashed("the plugin connection closed".into())),
            Ok(Ok(reply)) => reply,
        };
        tracing::trace!(plugin = %slot.info.name, id, "answer received");
        let value = match reply {
            Reply::Exited(msg) => return Err(ResolveError::Crashed(msg)),
            Reply::Malformed(msg) => return Err(ResolveError::Malformed(msg)),
            Reply::Response(resp) => match resp.payload {
                ResponsePayload::Error(e) => {
                    self.answered(slot);
                    return Err(ResolveError::Plugin(e));
                }
                ResponsePayload::Result(v) => v,
            },
        };
        self.answered(slot);
        if !value.get("targets").is_some_and(|t| t.is_array()) {
            return Err(ResolveError::Malformed(
                "the result has no `targets` array".into(),
            ));
        }
        serde_json::from_value::<ResolveResult>(value).map_err(|e| {
            ResolveError::Malformed(format!("the result is not a discovery.resolve result: {e}"))
        })
    }

    /// A valid answer: the plugin works, so the next crash starts the back-off afresh.
    fn answered(&self, slot: &Slot) {
        let mut st = lock(&slot.state);
        st.consecutive_crashes = 0;
        st.consecutive_timeouts = 0;
    }

    /// A call to `conn` got no answer in time: after [`HostOptions::max_timeouts`] in a row the
    /// process is killed (and restarted after the back-off by a later call).
    fn timed_out(&self, slot: &Arc<Slot>, conn: &Arc<Conn>) {
        let kill = {
            let mut st = lock(&slot.state);
            let current = st.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn));
            if !current {
                return;
            }
            st.consecutive_timeouts = st.consecutive_timeouts.saturating_add(1);
            st.consecutive_timeouts >= self.opts.max_timeouts.max(1)
        };
        if kill {
            conn.kill(
                slot,
                &self.opts,
                &format!(
                    "{} calls in a row got no answer within {}",
                    self.opts.max_timeouts.max(1),
                    fmt_duration(self.opts.timeout)
                ),
            );
        }
    }

    /// The running connection of `slot`, starting the process when there is none (after the
    /// restart back-off, if that ends before `deadline`).
    async fn connection(
        &self,
        slot: &Arc<Slot>,
        deadline: Instant,
    ) -> Result<Arc<Conn>, ResolveError> {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(ResolveError::Spawn("the plugin host is shut down".into()));
            }
            let wait_until = {
                let mut st = lock(&slot.state);
                if let Some(c) = &st.conn {
                    if c.alive() {
                        return Ok(c.clone());
                    }
                    st.conn = None;
                }
                match st.not_before {
                    Some(t) if t > Instant::now() => t,
                    _ => {
                        let conn = Conn::spawn(slot, &self.opts)?;
                        st.conn = Some(conn.clone());
                        return Ok(conn);
                    }
                }
            };
            if wait_until > deadline {
                let left = wait_until.saturating_duration_since(Instant::now());
                return Err(ResolveError::Crashed(format!(
                    "the plugin exited and is restarted in {}",
                    fmt_duration(Duration::from_millis(left.as_millis() as u64))
                )));
            }
            tokio::time::sleep_until(wait_until).await;
        }
    }

    /// Stops every plugin: closes its stdin, waits up to [`HostOptions::shutdown_grace`], then kills
    /// it. Later calls fail with [`ResolveError::Spawn`].
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for s in self.slots.values() {
            s.calls.close();
        }
        let conns: Vec<Arc<Conn>> = self
            .slots
            .values()
            .filter_map(|s| lock(&s.state).conn.take())
            .collect();
        let grace = self.opts.shutdown_grace;
        let mut stops = tokio::task::JoinSet::new();
        for c in conns {
            stops.spawn(async move { c.stop(grace).await });
        }
        while stops.join_next().await.is_some() {}
    }
}

/// The environment of a plugin process: `PATH` (the daemon's, else `/usr/local/bin:/usr/bin:/bin`),
/// `LANG` (the daemon's, else `C.UTF-8`), `TZ` (the daemon's, when set) and the daemon's variables
/// the manifest's `environment` lets through (never `TRIBUTARY_*`). `HOME` is added at start.
fn plugin_environment(
    declared: &[String],
    daemon: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    use std::ffi::OsString;
    let mut base: BTreeMap<String, OsString> = BTreeMap::new();
    base.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    base.insert("LANG".into(), "C.UTF-8".into());
    let mut passed = Vec::new();
    for (k, v) in daemon {
        let Some(name) = k.to_str() else { continue };
        match name {
            "PATH" | "LANG" | "TZ" => {
                base.insert(name.to_string(), v);
            }
            "HOME" => {}
            _ if tributary_protocol::environment_allows(declared, name) => passed.push((k, v)),
            _ => {}
        }
    }
    base.into_iter()
        .map(|(k, v)| (OsString::from(k), v))
        .chain(passed)
        .collect()
}

/// Creates `home` (and the folders above it) with mode 0700, and forces `home` and its parent
/// (the home root) back to 0700.
fn private_home(home: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    for dir in [home.parent(), Some(home)].into_iter().flatten() {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Back-off before start number `crashes + 1`.
fn backoff(opts: &HostOptions, crashes: u32) -> Duration {
    let factor = 2u32.saturating_pow(crashes.saturating_sub(1).min(20));
    opts.restart_backoff
        .saturating_mul(factor)
        .min(opts.restart_backoff_max)
}

fn load_one(dir: &Path) -> Result<(PluginInfo, PathBuf), LoadError> {
    let mpath = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&mpath) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LoadError::NoManifest {
                dir: dir.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(LoadError::ReadManifest {
                dir: dir.to_path_buf(),
                source,
            })
        }
    };
    let manifest = Manifest::parse(&text).map_err(|source| LoadError::Manifest {
        dir: dir.to_path_buf(),
        source,
    })?;
    let exe = executable_path(dir, &manifest)?;
    let info = PluginInfo {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        description: manifest.description.clone(),
        dir: dir.to_path_buf(),
        manifest,
    };
    Ok((info, exe))
}

/// The manifest's executable, resolved against the plugin folder and made absolute, checked to be an
/// executable file.
pub fn executable_path(dir: &Path, manifest: &Manifest) -> Result<PathBuf, LoadError> {
    use std::os::unix::fs::PermissionsExt;
    // Absolute: the process starts with the plugin folder as working directory, where a path
    // relative to ours would point elsewhere.
    let joined = dir.join(&manifest.executable);
    let path = std::path::absolute(&joined).unwrap_or(joined);
    match std::fs::metadata(&path) {
        Err(_) => Err(LoadError::MissingExecutable {
            dir: dir.to_path_buf(),
            path,
        }),
        Ok(m) if !m.is_file() || m.permissions().mode() & 0o111 == 0 => {
            Err(LoadError::NotExecutable {
                dir: dir.to_path_buf(),
                path,
            })
        }
        Ok(_) => Ok(path),
    }
}

/// Keeps the names used in the stderr notes short and stable.
fn describe_exit(status: Option<std::process::ExitStatus>) -> String {
    match status {
        Some(s) => format!("the plugin exited ({s})"),
        None => "the plugin closed its stdout and was killed".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_send_sync() {
        fn is<T: Send + Sync>() {}
        is::<PluginHost>();
        is::<ResolveError>();
    }

    #[test]
    fn plugin_environment_is_the_clean_base_and_the_declared_variables() {
        let daemon = [
            ("PATH", "/opt/bin:/usr/bin"),
            ("HOME", "/root"),
            ("TZ", "Europe/Paris"),
            ("TRIBUTARY_TOKEN", "tok"),
            ("TRIBUTARY_UI_PASSWORD", "pw"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("CONSUL_CACERT", "/ca.pem"),
            ("RUST_LOG", "debug"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let declared = vec!["AWS_*".to_string(), "CONSUL_CACERT".to_string()];
        let env = plugin_environment(&declared, daemon.clone().into_iter());
        let env: BTreeMap<String, String> = env
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        let want: BTreeMap<String, String> = [
            ("PATH", "/opt/bin:/usr/bin"),
            ("LANG", "C.UTF-8"),
            ("TZ", "Europe/Paris"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_SECRET_ACCESS_KEY", "k"),
            ("CONSUL_CACERT", "/ca.pem"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect();
        assert_eq!(env, want);
        // Nothing declared: the base only; no TZ when the daemon has none.
        let env = plugin_environment(&[], std::iter::empty());
        let keys: Vec<_> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(keys, ["LANG", "PATH"]);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let o = HostOptions {
            restart_backoff: Duration::from_millis(100),
            restart_backoff_max: Duration::from_millis(500),
            ..HostOptions::default()
        };
        let got: Vec<u128> = (1..=5).map(|n| backoff(&o, n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
    }
}
