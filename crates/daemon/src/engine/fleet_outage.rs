//! The opt-in degraded mode of a fleet (`serve --resolve-during-store-outage`, `docs/fleet.md`,
//! "Degraded mode"): while the store cannot be reached, a binding's scheduled run (or a person's
//! refresh) resolves through this host's plugin and applies the answer here, instead of keeping the
//! servers until the store answers. Nothing reaches the store meanwhile (the set cannot be
//! published; the host's state is `stale` with why). The step counts as one that could not reach
//! the store, so when the store answers the binding runs again at once: its resolver publishes,
//! every other host applies the fleet's set again (also one it already had), and hosts that
//! diverged while apart agree again.

use tributary_core::Binding;
use tributary_store::{OutcomeStatus, StoreError};

use super::resolve::{resolve, Step};
use super::{lock, Inner, Slot};

/// Resolves and applies `binding` here while the store is unreachable (`e`).
pub(crate) async fn resolve_locally(
    inner: &Inner,
    slot: &Slot,
    binding: &Binding,
    e: &StoreError,
) -> Step {
    let updated_at_ms = lock(&slot.state).updated_at_ms;
    let mut step = resolve(inner, binding, updated_at_ms).await;
    let note = format!(
        "{e}; resolved by this host alone (--resolve-during-store-outage), the fleet's set is applied again when the store answers"
    );
    step.outcome.why = Some(match step.outcome.why.take() {
        Some(why) if step.outcome.status == OutcomeStatus::Failed => format!("{why}; {note}"),
        Some(why) => format!("{note}; {why}"),
        None => note,
    });
    // Not a resolution for the fleet: no step-out bookkeeping, no set age.
    step.resolved = false;
    step.store_down = true;
    step
}
