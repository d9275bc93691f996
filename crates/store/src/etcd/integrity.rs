//! The session's part in the fleet's integrity (`auth.rs`, docs/fleet.md "Integrity"): the
//! values the mirror refused become this host's outcome of their bindings, and the fleet's
//! integrity key is put when this host requires it or the fleet is new; the file where a host
//! remembers the prefixes that require integrity (a deletion of the key does not undo it).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::auth::{self, Ctx, Meta};
use super::mirror::Update;
use super::session::bounded;
use super::{lock, Shared};
use crate::now_ms;

/// The values the mirror refused become this host's outcome of their bindings (`failed`, with
/// what failed), so every fleet view shows them; and a fleet seen requiring integrity is
/// remembered on disk.
pub(crate) fn report_refusals(shared: &Arc<Shared>) {
    let me = &shared.opts.host_id;
    let (refusals, newly_required, held) = {
        let mut m = lock(&shared.mirror);
        let refusals = std::mem::take(&mut m.refusals);
        let held: Vec<_> = refusals
            .iter()
            .map(|(name, _)| {
                (
                    m.outcome_of(name, me),
                    m.targets.get(name).map_or(0, |t| t.generation),
                )
            })
            .collect();
        (refusals, std::mem::take(&mut m.newly_required), held)
    };
    if newly_required {
        remember(&shared.integrity_file, &shared.keys.prefix);
    }
    if refusals.is_empty() {
        return;
    }
    {
        let mut pending = lock(&shared.pending);
        for ((name, message), (mine, generation)) in refusals.into_iter().zip(held) {
            let (generation, servers) = mine.map_or((generation, 0), |o| (o.generation, o.servers));
            pending.insert(
                name,
                crate::HostOutcome {
                    host: me.clone(),
                    state: crate::HostState::Failed,
                    at_ms: now_ms(),
                    generation,
                    servers,
                    message: Some(super::bounded_message(message, super::MAX_OUTCOME_MESSAGE)),
                },
            );
        }
    }
    shared.flush.notify_one();
}

/// Puts the fleet's integrity key (every host then refuses values without a MAC) when this host
/// was started with `--etcd-require-integrity`, or the fleet is new (nothing in it yet, every
/// live host verifies MACs). Created once: guarded by its absence. The key as etcd holds it
/// after the transaction (this host's put, or the one another host made first) is applied to the
/// mirror at once, not only when the watch brings it: the session calls this before it counts as
/// connected, so no write of this host is made meanwhile without knowing that the fleet requires
/// integrity (such a write was sealed `v1` and then written again, `reseal.rs`).
pub(crate) async fn require_integrity(
    shared: &Arc<Shared>,
    client: &mut Client,
) -> Result<(), String> {
    let o = &shared.opts;
    let (present, fresh) = {
        let m = lock(&shared.mirror);
        (m.integrity_key, m.fresh_fleet(&shared.keys, &o.host_id))
    };
    if present || !(o.require_integrity || fresh) {
        return Ok(());
    }
    let key = shared.keys.integrity();
    let body = serde_json::to_vec(&serde_json::json!({
        "require": true,
        "by": o.host_id,
        "at_ms": now_ms(),
    }))
    .unwrap_or_default();
    let value = auth::sign(
        &shared.secrets,
        &Ctx {
            prefix: &shared.keys.prefix,
            kind: "integrity",
            name: "",
            meta: Meta::default().next(),
        },
        body,
    );
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), value.clone(), None)])
        .or_else([TxnOp::get(key.clone(), None)]);
    let r = bounded(shared, "integrity key", client.txn(txn)).await?;
    let update = if r.succeeded() {
        tracing::info!(store = %shared.location, new_fleet = fresh, "this fleet now requires a MAC on every value (the integrity key is put)");
        let rev = r.header().map_or(0, |h| h.revision());
        Some(Update::Raw {
            key: key.into_bytes(),
            rev,
            lease: 0,
            value: Some(value),
            meta: Meta {
                create_rev: rev,
                version: 1,
            },
        })
    } else {
        // Another host put it first: the one etcd holds.
        r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| Update::Raw {
                key: kv.key().to_vec(),
                rev: kv.mod_revision(),
                lease: kv.lease(),
                value: Some(kv.value().to_vec()),
                meta: Meta {
                    create_rev: kv.create_revision(),
                    version: kv.version(),
                },
            }),
            _ => None,
        })
    };
    if let Some(u) = update {
        // Not a binding: in memory only, no SQLite write (`mirror_file.rs`).
        super::mirror::apply(shared, vec![u], None);
        report_refusals(shared);
    }
    Ok(())
}

/// Where a host remembers the prefixes that require integrity: next to its mirror.
pub(crate) fn integrity_file(mirror: &Path) -> PathBuf {
    let mut name = mirror.file_name().unwrap_or_default().to_os_string();
    name.push(".integrity");
    mirror.with_file_name(name)
}

/// Whether `file` lists `prefix` (one a line).
pub(crate) fn remembers(file: &Path, prefix: &str) -> bool {
    std::fs::read_to_string(file).is_ok_and(|t| t.lines().any(|l| l == prefix))
}

/// Adds `prefix` to `file`.
pub(crate) fn remember(file: &Path, prefix: &str) {
    if remembers(file, prefix) {
        return;
    }
    let mut text = std::fs::read_to_string(file).unwrap_or_default();
    text.push_str(prefix);
    text.push('\n');
    if let Err(e) = std::fs::write(file, text) {
        tracing::warn!(file = %file.display(), error = %e, "could not remember that this fleet requires integrity");
    }
}
