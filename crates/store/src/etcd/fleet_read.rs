//! The hosts' outcomes read on demand (`BindingStore::refresh_fleet`; `docs/fleet.md`, "What a
//! host watches"): a host does not watch `P/outcomes/` (every host's state of every binding: the
//! events of every host's outcome to every host would grow with the square of the host count), so
//! the API, the UI and the metrics ask for them when people ask: `P/outcomes/NAME/` for one
//! binding (a key per host), `P/outcomes/` for all (a key per host and binding; at most one such
//! read a second, concurrent callers share it). The garbage collection of gone hosts reads them
//! too (`gc.rs`). This host's own outcomes are in the mirror as it writes them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::keys::Kind;
use super::sync::read_range;
use super::{lock, Shared};
use crate::HostOutcome;

/// The least time between two reads of every binding's outcomes.
const READ_ALL_GAP: Duration = Duration::from_secs(1);

/// Reads the outcomes of binding `name` (or of every binding) from etcd into the mirror. `force`:
/// even within [`READ_ALL_GAP`] of the last read of all. Not connected: the mirror keeps what it
/// holds (`Err` says why).
pub(crate) async fn read_outcomes(
    shared: &Arc<Shared>,
    name: Option<&str>,
    force: bool,
) -> Result<(), String> {
    // One read of all at a time; a caller that waited for another's takes its answer.
    let mut last = match name {
        None => Some(shared.fleet_read.lock().await),
        Some(_) => None,
    };
    if let Some(Some(at)) = last.as_deref() {
        if !force && at.elapsed() < READ_ALL_GAP {
            return Ok(());
        }
    }
    let client = lock(&shared.conn)
        .client
        .clone()
        .ok_or_else(|| "not connected".to_string())?;
    let keys = &shared.keys;
    let start = match name {
        Some(n) => keys.outcomes_of(n),
        None => format!("{}outcomes/", keys.prefix),
    };
    let end = super::sync::range_end(start.as_bytes());
    let mut read: HashMap<String, BTreeMap<String, HostOutcome>> = HashMap::new();
    read_range(shared, &client, start.into_bytes(), &end, 0, |kv| {
        let Some(Kind::Outcome { binding, host }) = keys.parse(kv.key()) else {
            return;
        };
        if let Ok(mut o) = serde_json::from_slice::<HostOutcome>(kv.value()) {
            o.host = host.clone();
            read.entry(binding).or_default().insert(host, o);
        }
    })
    .await?;
    if let Some(n) = name {
        read.retain(|b, _| b == n);
        read.entry(n.to_string()).or_default();
    }
    lock(&shared.mirror).set_outcomes(name, read);
    if let Some(l) = last.as_deref_mut() {
        *l = Some(Instant::now());
    }
    Ok(())
}
