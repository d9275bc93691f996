//! A host that cannot resolve a binding steps out of resolving it (`docs/fleet.md`,
//! "A host that cannot resolve a binding"): after [`STEP_OUT_AFTER`] failed resolutions in a row
//! it calls `BindingStore::step_out` (its claim goes, the other hosts leave it out of the resolver
//! choice) and, [`step_out_for`] later, `step_in`. A host without the binding's plugin or key never
//! gets the claim in the first place: the store decides that from the hosts' heartbeats.

use std::time::{Duration, Instant};

use tributary_core::Binding;
use tributary_store::OutcomeStatus;

use super::resolve::Step;
use super::{lock, Inner, Slot};

/// Failed resolutions in a row after which a host steps out of resolving a binding.
pub(crate) const STEP_OUT_AFTER: u32 = 3;

/// How long a host that stepped out of a binding stays out: ten intervals, at least 5 minutes.
fn step_out_for(binding: &Binding) -> Duration {
    (binding.interval * 10).max(Duration::from_secs(300))
}

/// Counts this host's failed resolutions of the binding; at [`STEP_OUT_AFTER`] in a row the host
/// steps out of resolving it (`BindingStore::step_out`: its claim goes, the other hosts leave it
/// out of the choice), so that a host that cannot reach the registry, or whose plugin keeps
/// failing, does not freeze the binding for the whole fleet. A host alone (SQLite) never does.
pub(crate) async fn count_resolution(inner: &Inner, slot: &Slot, binding: &Binding, step: &Step) {
    if !step.resolved || inner.store.status().kind == "sqlite" {
        return;
    }
    let failed = step.outcome.status == OutcomeStatus::Failed && step.generation.is_none();
    let n = {
        let mut st = lock(&slot.state);
        st.resolve_failures = if failed {
            st.resolve_failures.saturating_add(1)
        } else {
            0
        };
        st.resolve_failures
    };
    if n < STEP_OUT_AFTER {
        return;
    }
    let name = binding.name.as_str();
    let kind = step.outcome.failure.map_or("failure", |f| f.as_str());
    let why = format!("{n} failed resolutions in a row ({kind})");
    let out_for = step_out_for(binding);
    match inner.store.step_out(name, &why).await {
        Ok(()) => {
            let mut st = lock(&slot.state);
            st.resolve_failures = 0;
            st.stepped_out_until = Some(Instant::now() + out_for);
            tracing::warn!(binding = %name, why = %why, back_in_secs = out_for.as_secs(), "this host steps out of resolving the binding; another host resolves it");
        }
        Err(e) => {
            tracing::warn!(binding = %name, error = %e, "stepping out of resolving the binding failed")
        }
    }
}

/// A host whose time out of resolving the binding is over is a candidate again.
pub(crate) async fn step_back_in(inner: &Inner, slot: &Slot, binding: &Binding) {
    let due = {
        let st = lock(&slot.state);
        st.stepped_out_until.is_some_and(|t| t <= Instant::now())
    };
    if !due {
        return;
    }
    let name = binding.name.as_str();
    match inner.store.step_in(name).await {
        Ok(()) => {
            lock(&slot.state).stepped_out_until = None;
            tracing::info!(binding = %name, "this host steps back in as a candidate resolver of the binding");
        }
        Err(e) => {
            tracing::warn!(binding = %name, error = %e, "stepping back in failed; tried again at the next run")
        }
    }
}
