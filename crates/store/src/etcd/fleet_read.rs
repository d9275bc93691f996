//! The hosts' outcomes read on demand (`BindingStore::refresh_fleet`; `docs/fleet.md`, "What a
//! host watches"): a host does not watch `P/outcomes-by-host/` (every host's state of every
//! binding: the events of every host's outcome to every host would grow with the square of the
//! host count), so the API, the UI and the metrics ask for them when people ask: for one binding
//! a key per host (`P/outcomes-by-host/HOST/NAME`, one transaction of gets), for all
//! `P/outcomes-by-host/` (a key per host and binding; at most one such read a second, concurrent
//! callers share it), each with the old layout's keys (`P/outcomes/NAME/HOST`, daemons of before;
//! `keys.rs`). The garbage collection of gone hosts reads them too (`gc.rs`). This host's own
//! outcomes are in the mirror as it writes them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use tokio::time::timeout;

use super::keys::{Keys, Kind};
use super::sync::read_range;
use super::{lock, Shared};
use crate::HostOutcome;

/// The least time between two reads of every binding's outcomes.
const READ_ALL_GAP: Duration = Duration::from_secs(1);

/// Reads the outcomes of binding `name` (or of every binding) from etcd into the mirror. `force`:
/// even within [`READ_ALL_GAP`] of the last read of all. Not connected: the mirror keeps what it
/// holds (`Err` says why).
///
/// Outcomes are keyed host first (`keys.rs`): one binding's are one key per host, read in one
/// transaction of gets (of every host known: live, or with an outcome in the last read of all;
/// before the first read of all, a read of all is made instead, so gone hosts are known), with
/// the old layout's range of that binding. The old layout is read first: the new one's key of
/// the same binding and host wins.
pub(crate) async fn read_outcomes(
    shared: &Arc<Shared>,
    name: Option<&str>,
    force: bool,
) -> Result<(), String> {
    if let Some(n) = name {
        if shared.fleet_read.lock().await.is_some() {
            return read_one(shared, n).await;
        }
    }
    read_all(shared, force).await
}

fn client(shared: &Shared) -> Result<Client, String> {
    lock(&shared.conn)
        .client
        .clone()
        .ok_or_else(|| "not connected".to_string())
}

/// Adds the outcome `kv` holds (of either layout) to `read`: a later one replaces an earlier one
/// of the same binding and host.
fn collect(keys: &Keys, kv: &KeyValue, read: &mut HashMap<String, BTreeMap<String, HostOutcome>>) {
    let Some(Kind::Outcome { binding, host, .. }) = keys.parse(kv.key()) else {
        return;
    };
    if let Ok(mut o) = serde_json::from_slice::<HostOutcome>(kv.value()) {
        o.host = host.clone();
        read.entry(binding).or_default().insert(host, o);
    }
}

/// Every binding's outcomes: the old layout's range, then the new one's.
async fn read_all(shared: &Arc<Shared>, force: bool) -> Result<(), String> {
    // One read of all at a time; a caller that waited for another's takes its answer.
    let mut last = shared.fleet_read.lock().await;
    if let Some(at) = *last {
        if !force && at.elapsed() < READ_ALL_GAP {
            return Ok(());
        }
    }
    let client = client(shared)?;
    let keys = &shared.keys;
    let [old, _] = keys.old_layout();
    let mut read = HashMap::new();
    for start in [old, keys.all_outcomes()] {
        let end = super::sync::range_end(start.as_bytes());
        read_range(shared, &client, start.into_bytes(), &end, 0, |kv| {
            collect(keys, kv, &mut read)
        })
        .await?;
    }
    lock(&shared.mirror).set_outcomes(None, read);
    *last = Some(Instant::now());
    Ok(())
}

/// Binding `name`'s outcomes: its old-layout range and one get per known host, in transactions
/// of at most [`super::TXN_CHUNK`] operations.
async fn read_one(shared: &Arc<Shared>, name: &str) -> Result<(), String> {
    let mut client = client(shared)?;
    let keys = &shared.keys;
    let me = &shared.opts.host_id;
    let hosts: Vec<String> = lock(&shared.mirror)
        .members(me)
        .into_iter()
        .map(|m| m.host)
        .collect();
    let mut ops = vec![TxnOp::get(
        keys.old_outcomes_of(name),
        Some(GetOptions::new().with_prefix()),
    )];
    ops.extend(
        hosts
            .iter()
            .map(|h| TxnOp::get(keys.outcome(name, h), None)),
    );
    let mut read = HashMap::new();
    for chunk in ops.chunks(super::TXN_CHUNK) {
        let txn = Txn::new().and_then(chunk.to_vec());
        let r = match timeout(shared.opts.op_timeout, client.txn(txn)).await {
            Err(_) => {
                return Err(format!(
                    "read outcomes: no answer within {:?}",
                    shared.opts.op_timeout
                ))
            }
            Ok(r) => r.map_err(|e| format!("read outcomes: {e}"))?,
        };
        for op in r.op_responses() {
            if let TxnOpResponse::Get(g) = op {
                g.kvs().iter().for_each(|kv| collect(keys, kv, &mut read));
            }
        }
    }
    read.retain(|b, _| b == name);
    read.entry(name.to_string()).or_default();
    lock(&shared.mirror).set_outcomes(Some(name), read);
    Ok(())
}
