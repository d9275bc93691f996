//! This host's outcomes in etcd (`PREFIX/outcomes-by-host/HOST/NAME`): written by the session task
//! in batches, each guarded by its bindings still existing; a batch etcd refuses is split and a
//! refused outcome dropped, so a refusal never ends the session (`docs/fleet.md`). Before each
//! flush, this host's keys of removed bindings are deleted (`own_keys.rs`).

use std::sync::Arc;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tokio::time::timeout;

use super::mirror::Update;
use super::{lock, Shared};

/// The longest message of a published host outcome (nginx's message of a refused change can be
/// long: the whole outcome must stay well under etcd's request size limit, 1.5 MiB by default,
/// with 100 outcomes in one transaction).
pub const MAX_OUTCOME_MESSAGE: usize = 2048;

/// `m` cut to at most `max` bytes (at a character boundary), saying so.
pub(crate) fn bounded_message(mut m: String, max: usize) -> String {
    const CUT: &str = " [cut]";
    if m.len() <= max {
        return m;
    }
    let mut end = max.saturating_sub(CUT.len());
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    m.truncate(end);
    m.push_str(CUT);
    m
}

/// Writes this host's pending outcomes, in transactions of 100, each guarded by its bindings
/// still existing, so a binding removed meanwhile gets no outcome key. A transaction refused (by
/// the member: permission, too large, an answer and not a lost member; or by its guard) is split
/// in halves down to single outcomes, and a single refused outcome is dropped with a warning: a
/// refusal never ends the session (it would be refused again at every reconnection). No nested
/// transaction: etcd 3.4 does not check the permissions of the operations inside one.
pub(crate) async fn flush_pending(shared: &Arc<Shared>, client: &mut Client) -> Result<(), String> {
    super::own_keys::delete_orphans(shared, client).await?;
    let pending: Vec<(String, crate::HostOutcome)> = lock(&shared.pending)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let live: Vec<(String, crate::HostOutcome)> = {
        let m = lock(&shared.mirror);
        pending
            .into_iter()
            // A binding whose value this host refused has no record here, but its key exists:
            // its outcome says so.
            .filter(|(n, _)| m.binding_exists(n) || m.meta_of(&shared.keys.binding(n)).version > 0)
            .collect()
    };
    let mut todo: Vec<Vec<(String, crate::HostOutcome)>> = live
        .chunks(super::TXN_CHUNK)
        .rev()
        .map(<[_]>::to_vec)
        .collect();
    while let Some(chunk) = todo.pop() {
        match write_outcomes(shared, client, &chunk).await? {
            Ok(()) => {}
            Err(refusal) if chunk.len() > 1 => {
                tracing::debug!(store = %shared.location, outcomes = chunk.len(), error = %refusal, "etcd refused a batch of host outcomes; splitting it");
                let (a, b) = chunk.split_at(chunk.len() / 2);
                todo.push(b.to_vec());
                todo.push(a.to_vec());
            }
            Err(refusal) => {
                let (name, o) = &chunk[0];
                tracing::warn!(store = %shared.location, binding = %name, error = %refusal, "etcd refused this host's outcome of the binding; dropped (the fleet view shows the previous one)");
                let mut p = lock(&shared.pending);
                if p.get(name) == Some(o) {
                    p.remove(name);
                }
            }
        }
    }
    Ok(())
}

/// One transaction of outcomes. `Err`: the member did not answer (the session ends);
/// `Ok(Err(why))`: the member refused the transaction.
async fn write_outcomes(
    shared: &Arc<Shared>,
    client: &mut Client,
    chunk: &[(String, crate::HostOutcome)],
) -> Result<Result<(), String>, String> {
    let me = &shared.opts.host_id;
    let keys = &shared.keys;
    let values: Vec<Vec<u8>> = chunk
        .iter()
        .map(|(_, o)| serde_json::to_vec(o).unwrap_or_default())
        .collect();
    let compares: Vec<Compare> = chunk
        .iter()
        .map(|(n, _)| Compare::create_revision(keys.binding(n), CompareOp::Greater, 0))
        .collect();
    let ops: Vec<TxnOp> = chunk
        .iter()
        .zip(&values)
        .map(|((n, _), v)| TxnOp::put(keys.outcome(n, me), v.clone(), None))
        .collect();
    let txn = Txn::new().when(compares).and_then(ops);
    let r = match timeout(shared.opts.op_timeout, client.txn(txn)).await {
        Err(_) => {
            return Err(format!(
                "publish outcomes: no answer within {:?}",
                shared.opts.op_timeout
            ))
        }
        Ok(Err(e)) if super::write::retryable(&e) => return Err(format!("publish outcomes: {e}")),
        Ok(Err(e)) => return Ok(Err(e.to_string())),
        Ok(Ok(r)) => r,
    };
    if !r.succeeded() {
        return Ok(Err("a binding of the batch was removed meanwhile".into()));
    }
    let rev = r.header().map_or(0, |h| h.revision());
    let updates = chunk
        .iter()
        .zip(values)
        .map(|((n, _), v)| Update::Raw {
            key: keys.outcome(n, me).into_bytes(),
            rev,
            lease: 0,
            value: Some(v),
            meta: Default::default(),
        })
        .collect();
    // Our own writes: applied without events.
    let s = shared.clone();
    tokio::task::spawn_blocking(move || super::mirror::apply(&s, updates, None))
        .await
        .map_err(|e| format!("mirror thread: {e}"))?;
    let mut p = lock(&shared.pending);
    for (n, o) in chunk {
        if p.get(n) == Some(o) {
            p.remove(n);
        }
    }
    Ok(Ok(()))
}
