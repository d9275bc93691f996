//! Writing binding values again, on a task of its own (not in the session loop), at most
//! [`PER_SECOND`] writes a second, each guarded by the revision it replaces (a concurrent change
//! wins and needs nothing more):
//!
//! - a value sealed with a key this host was told is **retired** (`--retired-secrets-key`): any
//!   host holding the retirement re-seals it with its active key. Nothing else triggers a
//!   re-seal: hosts that hold the same keys in different orders never re-seal each other's
//!   writes (before, each re-sealed what the other had just written, without end);
//! - a value **without a MAC** (written by a daemon of before), or with a `v1` config once the
//!   fleet requires integrity: the host rendezvous prefers for the binding writes it again with
//!   a MAC (and a `v2` config when required). That is the upgrade of a fleet's values
//!   (docs/fleet.md, "Integrity").
//!
//! A value written again is the same binding at the same version: no host reschedules it.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, TxnOp};

use super::auth::Meta;
use super::mirror::Update;
use super::write::{Guarded, Written};
use super::{lock, EtcdStore, Shared};
use crate::StoredBinding;

/// Writes per second at most, per host.
pub const PER_SECOND: u64 = 10;

/// One value to write again.
struct Job {
    name: String,
    sb: StoredBinding,
    rev: i64,
    meta: Meta,
    why: String,
}

/// The next value this host should write again, taken off the mirror's list. A value another
/// host (the preferred one) is to write stays on the list: looked at again later, in case that
/// host never does (a daemon of before, or gone).
fn next(shared: &Shared) -> Option<Job> {
    let me = &shared.opts.host_id;
    let mut m = lock(&shared.mirror);
    let names: Vec<String> = m.rewrite.iter().cloned().collect();
    for name in names {
        let key = shared.keys.binding(&name);
        let rev = m.rev_of(&key);
        // Only the newest value, when it is the one the mirror holds decoded.
        let held = match m.file.get_binding(&name) {
            Ok(Some(sb)) if m.decoded_rev(&name) == Some(rev) => Some(sb),
            _ => None,
        };
        let Some(sb) = held else {
            m.rewrite.remove(&name);
            continue;
        };
        let why = match m.sealed_with(&name) {
            Some(id) if shared.secrets.is_retired(id) => {
                format!("its config is sealed with the retired key {id}")
            }
            _ if m.is_preferred(&name, me) => {
                "it has no MAC, or a v1 config where the fleet requires integrity".to_string()
            }
            // Another host (the preferred one) writes it.
            _ => continue,
        };
        m.rewrite.remove(&name);
        return Some(Job {
            meta: m.meta_of(&key),
            name,
            sb,
            rev,
            why,
        });
    }
    None
}

/// How often the list is looked at without a change (a write that failed, a value another
/// host was to write).
const SWEEP: Duration = Duration::from_secs(5);

/// The task: woken by the session after it applied changes (`Shared::reseal`), and every
/// [`SWEEP`].
pub async fn run(shared: Arc<Shared>) {
    let store = EtcdStore::handle(shared.clone());
    let gap = Duration::from_millis(1000 / PER_SECOND);
    loop {
        tokio::select! {
            _ = shared.reseal.notified() => {}
            _ = tokio::time::sleep(SWEEP) => {}
        }
        while let Some(job) = next(&shared) {
            let key = shared.keys.binding(&job.name);
            let meta = job.meta.next();
            let v2 = lock(&shared.mirror).require;
            let value = store.binding_value(&job.sb, meta, v2);
            let w = store
                .write(Guarded {
                    compares: vec![Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        job.rev,
                    )],
                    ops: vec![TxnOp::put(key, value, None)],
                })
                .await;
            match w {
                Ok(Written::Applied(rev)) => {
                    tracing::info!(binding = %job.name, key = %shared.secrets.active_id(), why = %job.why, "binding value written again (sealed with the active secrets key, with a MAC)");
                    let _ = store
                        .apply_own(vec![Update::Binding {
                            name: job.name,
                            rev,
                            value: Some(job.sb),
                            meta,
                        }])
                        .await;
                }
                // Changed meanwhile: the new value is checked when it arrives.
                Ok(Written::Refused(_)) => {}
                Err(e) => {
                    tracing::warn!(binding = %job.name, error = %e, "writing a binding value again failed; tried again later");
                    lock(&shared.mirror).rewrite.insert(job.name);
                    break;
                }
            }
            tokio::time::sleep(gap).await;
        }
    }
}
