//! The resolver protocol of the fleet store (`docs/fleet.md`, "Resolving once for the fleet"):
//! taking and handing over a binding's claim, publishing the set resolved under it (guarded by
//! the claim's holder *and* lease, and by the revision of the binding it was resolved from), and
//! a host stepping out of a binding it cannot resolve (its marker `P/unable-by-host/HOST/NAME`,
//! `keys.rs`). A refusal of etcd names the key it was about (`write_to`, `refusal.rs`).

use etcd_client::{Compare, CompareOp, PutOptions, TxnOp};

use super::auth::{self, Ctx, Meta};
use super::mirror::{self, Update};
use super::write::{Guarded, Written};
use super::{lock, EtcdStore};
use crate::sqlite::same_targets;
use crate::{StoreError, TargetSet};

impl EtcdStore {
    /// This session's lease, also while the session moves to another member (the lease is the
    /// cluster's, not the member's).
    fn session_lease(&self) -> Result<i64, StoreError> {
        let c = lock(&self.shared.conn);
        self.writable(&c)?;
        c.lease
            .ok_or_else(|| self.unavailable("no session with etcd"))
    }

    /// Deletes this host's claim of `name` when it still holds it under `lease`.
    async fn release(&self, name: &str, lease: i64) -> Result<(), StoreError> {
        let me = &self.shared.opts.host_id;
        let key = self.shared.keys.resolver(name);
        let what = format!("the resolver claim {key}");
        let w = self
            .write_to(
                Guarded {
                    compares: vec![
                        Compare::value(key.clone(), CompareOp::Equal, me.as_bytes()),
                        Compare::lease(key.clone(), CompareOp::Equal, lease),
                    ],
                    ops: vec![TxnOp::delete(key, None)],
                },
                &what,
            )
            .await?;
        if let Written::Applied(rev) = w {
            self.apply_own(vec![Update::Resolver {
                name: name.to_string(),
                rev,
                holder: None,
            }])
            .await?;
        }
        Ok(())
    }

    pub(crate) async fn claim(&self, name: &str) -> Result<bool, StoreError> {
        let me = &self.shared.opts.host_id;
        let lease = self.session_lease()?;
        let key = self.shared.keys.resolver(name);
        let decision =
            lock(&self.shared.mirror).claim_decision(name, me, lease, self.shared.opts.lease_ttl);
        match decision {
            mirror::Claim::Mine => Ok(true),
            mirror::Claim::Other => Ok(false),
            mirror::Claim::Release => {
                // A better-placed host is live, or this one cannot resolve the binding: hand it
                // over (the other hosts claim on the event).
                self.release(name, lease).await?;
                Ok(false)
            }
            mirror::Claim::Take => {
                let what = format!("the resolver claim {key}");
                let w = self
                    .write_to(
                        Guarded {
                            compares: vec![Compare::create_revision(
                                key.clone(),
                                CompareOp::Equal,
                                0,
                            )],
                            ops: vec![TxnOp::put(
                                key,
                                me.as_bytes(),
                                Some(PutOptions::new().with_lease(lease)),
                            )],
                        },
                        &what,
                    )
                    .await?;
                let Written::Applied(rev) = w else {
                    return Ok(false);
                };
                self.apply_own(vec![Update::Resolver {
                    name: name.to_string(),
                    rev,
                    holder: Some((me.clone(), lease)),
                }])
                .await?;
                Ok(true)
            }
        }
    }

    pub(crate) async fn publish(&self, name: &str, set: &TargetSet) -> Result<(), StoreError> {
        let me = &self.shared.opts.host_id;
        let lease = self.session_lease()?;
        let k = &self.shared.keys;
        // The revision of the binding version the set was resolved from: the one the mirror
        // holds decoded, when the set names that version. A set resolved from another version
        // (the binding changed meanwhile, or this host could not open its newest value) is
        // refused here; one whose binding changed since in etcd is refused by etcd.
        // The set is MAC'd for the targets key's next state, and the put is guarded by the state
        // it replaces (`auth.rs`): an older set put back later does not verify.
        let (binding_rev, held_meta) = {
            let m = lock(&self.shared.mirror);
            if !m.must_republish(name)
                && m.targets
                    .get(name)
                    .is_some_and(|old| same_targets(old, set))
            {
                return Ok(());
            }
            let held = m.file.get_binding(name)?;
            let rev = match (held, m.decoded_rev(name)) {
                (Some(sb), Some(rev)) if sb.updated_at_ms == set.binding_updated_at_ms => rev,
                _ => return Err(StoreError::Conflict(name.to_string())),
            };
            (rev, m.meta_of(&k.targets(name)))
        };
        let mut set = set.clone();
        set.resolved_by = me.clone();
        let meta = held_meta.next();
        let value = auth::sign(
            &self.shared.secrets,
            &Ctx {
                prefix: &k.prefix,
                kind: "targets",
                name,
                meta,
            },
            serde_json::to_vec(&set).unwrap_or_default(),
        );
        let key_guard = if held_meta.version == 0 {
            vec![Compare::create_revision(
                k.targets(name),
                CompareOp::Equal,
                0,
            )]
        } else {
            vec![
                Compare::create_revision(k.targets(name), CompareOp::Equal, held_meta.create_rev),
                Compare::version(k.targets(name), CompareOp::Equal, held_meta.version),
            ]
        };
        // Only the holder of the claim under this session's lease publishes (not a daemon of
        // the same host id under another lease, nor this host after its claim was lost), and
        // only while the binding is the version it resolved.
        let what = format!("the target set {}", k.targets(name));
        let w = self
            .write_to(
                Guarded {
                    compares: vec![
                        Compare::value(k.resolver(name), CompareOp::Equal, me.as_bytes()),
                        Compare::lease(k.resolver(name), CompareOp::Equal, lease),
                        Compare::mod_revision(k.binding(name), CompareOp::Equal, binding_rev),
                    ]
                    .into_iter()
                    .chain(key_guard)
                    .collect(),
                    ops: vec![TxnOp::put(k.targets(name), value, None)],
                },
                &what,
            )
            .await?;
        let Written::Applied(rev) = w else {
            return Err(StoreError::Conflict(name.to_string()));
        };
        self.apply_own(vec![Update::Targets {
            name: name.to_string(),
            rev,
            value: Some(set),
            meta,
        }])
        .await
    }

    /// Puts this host's "cannot resolve NAME" marker (under its session lease, with `why`) and
    /// gives its claim up.
    pub(crate) async fn stand_aside(&self, name: &str, why: &str) -> Result<(), StoreError> {
        let me = &self.shared.opts.host_id;
        lock(&self.shared.stood_aside).insert(name.to_string(), why.to_string());
        let lease = self.session_lease()?;
        let key = self.shared.keys.unable(name, me);
        let value = serde_json::to_vec(&serde_json::json!({ "why": why })).unwrap_or_default();
        let what = format!("this host's step-out marker {key}");
        let w = self
            .write_to(
                Guarded {
                    compares: vec![Compare::create_revision(
                        self.shared.keys.binding(name),
                        CompareOp::Greater,
                        0,
                    )],
                    ops: vec![TxnOp::put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    )],
                },
                &what,
            )
            .await?;
        if let Written::Applied(rev) = w {
            self.apply_own(vec![Update::Raw {
                key: key.into_bytes(),
                rev,
                lease,
                value: Some(value),
                meta: Meta::default(),
            }])
            .await?;
        }
        self.release(name, lease).await
    }

    /// Deletes this host's "cannot resolve NAME" marker.
    pub(crate) async fn stand_in(&self, name: &str) -> Result<(), StoreError> {
        lock(&self.shared.stood_aside).remove(name);
        let key = self.shared.keys.unable(name, &self.shared.opts.host_id);
        let what = format!("this host's step-out marker {key}");
        let w = self
            .write_to(
                Guarded {
                    compares: vec![Compare::create_revision(key.clone(), CompareOp::Greater, 0)],
                    ops: vec![TxnOp::delete(key.clone(), None)],
                },
                &what,
            )
            .await?;
        if let Written::Applied(rev) = w {
            self.apply_own(vec![Update::Raw {
                key: key.into_bytes(),
                rev,
                lease: 0,
                value: None,
                meta: Meta::default(),
            }])
            .await?;
        }
        Ok(())
    }
}
