//! Dispatch: the host's plugins by name, and one `discovery.resolve` call sent to a plugin's process
//! and its answer read (matched by `id`, bounded by the timeout, redacted).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::time::Instant;
use tributary_protocol::{ProviderDecl, Request, ResolveParams, ResolveResult, ResponsePayload};

use crate::conn::Reply;
use tributary_base::lock;

use crate::supervise::Slot;
use crate::{HostOptions, PluginInfo, ResolveError};

/// The plugins of a plugins directory and their processes. `Send + Sync`; share it as
/// `Arc<PluginHost>`. Processes start on the first call, which needs a tokio runtime.
pub struct PluginHost {
    pub(crate) slots: BTreeMap<String, Arc<Slot>>,
    pub(crate) opts: HostOptions,
    /// The temporary home root when none is configured (removed with the host).
    pub(crate) _home_tmp: Option<tempfile::TempDir>,
    pub(crate) next_id: AtomicU64,
    pub(crate) closed: AtomicBool,
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
}
