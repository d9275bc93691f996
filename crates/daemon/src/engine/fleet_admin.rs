//! The fleet as a whole, for people: the numbers of [`crate::view::fleet`] (set age and resolver
//! per binding, bindings behind per host) and `forget-host`, which removes what a host that is
//! gone left in the store (`docs/fleet.md`, "Forgetting a host").

use tributary_store::StoreError;

use super::{now_ms, Engine, EngineError, Inner};
use crate::view::{fleet, BindingFleet, BindingView, FleetHosts, ForgetHostResponse};

/// The fleet view of binding `name` with its published set's time and this host's own last
/// successful resolution (`resolved_here_ms`, from the binding's slot).
pub(crate) fn binding_fleet(
    inner: &Inner,
    name: &str,
    resolved_here_ms: Option<i64>,
) -> BindingFleet {
    let mut f: BindingFleet = inner.store.fleet_view(name).into();
    if let Some(set) = inner.store.published_targets(name) {
        f.set_at_ms = Some(set.at_ms);
        f.set_resolved_by = Some(set.resolved_by).filter(|h| !h.is_empty());
    }
    f.resolved_here_ms = resolved_here_ms;
    f
}

impl Engine {
    /// Reads the hosts' outcomes from the store now (of `name`, or of every binding) for the
    /// fleet views that follow: a host does not watch the others' outcomes (`docs/fleet.md`,
    /// "What a host watches"). Called where people ask (the API, the UI, the metrics).
    pub async fn refresh_fleet(&self, name: Option<&str>) {
        self.inner.store.refresh_fleet(name).await;
    }

    /// Every host the store knows of with the bindings it is behind, and every binding's set age
    /// and resolver (local reads only).
    pub fn fleet_hosts(&self) -> FleetHosts {
        self.fleet_summary(&self.list(), now_ms())
    }

    /// [`Engine::fleet_hosts`] of `bindings` (the engine's list, read by the caller) at `now`.
    pub fn fleet_summary(&self, bindings: &[BindingView], now: i64) -> FleetHosts {
        let st = self.inner.store.status();
        fleet::summarize(
            &st.host_id,
            st.kind,
            &self.inner.store.fleet_hosts(),
            bindings,
            now,
        )
    }

    /// Removes what host `host`, gone, left in the store (its outcomes, `unable` markers and
    /// writes' markers), refused while it is alive unless `force` (then its session is ended
    /// first). Nothing is deleted on an error.
    pub async fn forget_host(
        &self,
        host: &str,
        force: bool,
    ) -> Result<ForgetHostResponse, EngineError> {
        if host.is_empty()
            || host.len() > 253
            || host.contains('/')
            || host.chars().any(char::is_control)
        {
            return Err(EngineError::invalid(
                "host",
                format!("host id {host:?}: it must be 1-253 characters without '/' or control characters"),
            ));
        }
        let r = self.inner.store.forget_host(host, force).await;
        match r {
            Ok(done) => {
                tracing::info!(
                    host,
                    keys = done.keys,
                    session_ended = done.session_ended,
                    "forgot a host"
                );
                Ok(ForgetHostResponse {
                    host: host.to_string(),
                    keys_deleted: done.keys,
                    session_ended: done.session_ended,
                })
            }
            Err(e @ StoreError::NoSuchHost { .. }) => Err(EngineError::NoHost(e.to_string())),
            Err(e @ (StoreError::HostAlive { .. } | StoreError::NoFleet(_))) => {
                Err(EngineError::Conflict(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }
}
