//! The mirror's checks of what it applies (`auth.rs`, docs/fleet.md "Integrity"): a binding value
//! or target set whose MAC fails (or is missing where the fleet requires one) is not applied:
//! the mirror keeps what it had, logs the key and what failed, and queues a report for this
//! host's outcome of the binding (`refusals`, taken by the session).

use super::super::auth::{self, Checked, Ctx, Meta, Refusal};
use super::super::keys::{self, Keys, Undecodable};
use super::super::SecretKeys;
use super::Mirror;
use crate::{StoredBinding, TargetSet};

impl Mirror {
    /// The etcd create revision and version of `key` as last seen (`Meta::default()`: absent).
    pub fn meta_of(&self, key: &str) -> Meta {
        self.meta.get(key).copied().unwrap_or_default()
    }

    /// Whether the held target set of `name` must be published over even when unchanged (its
    /// newest value was refused, or has no MAC).
    pub fn must_republish(&self, name: &str) -> bool {
        self.republish.contains(name)
    }

    /// The id of the key that sealed the newest value of `name` (read without opening it).
    pub fn sealed_with(&self, name: &str) -> Option<&str> {
        self.needs.get(name).map(|n| n.key_id.as_str())
    }

    /// Whether this host is the one rendezvous prefers for `name` (among the able live hosts).
    pub fn is_preferred(&self, name: &str, me: &str) -> bool {
        self.preferred(name, me).0 == me
    }

    /// A fleet that has nothing yet (no binding, no target set, no integrity key) and whose
    /// live hosts all verify MACs: it can require integrity from the start.
    pub fn fresh_fleet(&self, keys: &Keys, me: &str) -> bool {
        let data = [keys.binding(""), keys.targets("")];
        !self.integrity_key
            && !self
                .revs
                .keys()
                .any(|k| data.iter().any(|d| k.starts_with(d.as_str())))
            && self.file.is_empty()
            && self
                .hosts
                .iter()
                .all(|(h, (beat, _))| h == me || beat.can.as_ref().is_some_and(|c| c.auth))
    }

    /// Records a refused value of `name` at `key`.
    fn refuse(&mut self, key: &str, name: &str, why: &Refusal) {
        tracing::error!(key = %key, binding = %name, error = %why, "value from etcd refused: not applied; this host keeps what it had");
        self.refused_total += 1;
        if !name.is_empty() {
            self.refusals.push((
                name.to_string(),
                format!("refused {key}: {why}; this host keeps serving what it had"),
            ));
        }
    }

    /// The binding stored at `key` as `value`, checked; `None` when it is not applied (refused,
    /// or it cannot be opened here: the file keeps the version it had, this host stops
    /// resolving the binding).
    pub(super) fn binding_value(
        &mut self,
        key: &str,
        name: &str,
        value: &[u8],
        meta: Meta,
        keys: &Keys,
        secrets: &SecretKeys,
    ) -> Option<StoredBinding> {
        match keys::decode_binding(name, value, secrets, &keys.prefix, meta, self.require) {
            Ok(d) => {
                self.unreadable.remove(name);
                if d.v2 {
                    self.v1_configs.remove(name);
                } else {
                    self.v1_configs.insert(name.to_string());
                }
                let again = secrets.is_retired(&d.key_id)
                    || d.checked == Checked::Missing
                    || (self.require && !d.v2);
                if again {
                    self.rewrite.insert(name.to_string());
                } else {
                    self.rewrite.remove(name);
                }
                Some(d.sb)
            }
            Err(Undecodable::Refused(r)) => {
                self.unreadable.insert(name.to_string());
                self.rewrite.remove(name);
                self.refuse(key, name, &r);
                None
            }
            // Kept as it was: a binding this host cannot read is not removed (its servers
            // stay), and the log says why. This host no longer resolves it (`claim_decision`).
            Err(Undecodable::Store(e)) => {
                self.unreadable.insert(name.to_string());
                self.rewrite.remove(name);
                tracing::error!(binding = %name, error = %e, "binding from etcd not applied; this host stops resolving it");
                None
            }
        }
    }

    /// Applies the target set of `name` at `key` (`None`: removed) once checked; `false` when it
    /// was refused (nothing changed: no event).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn targets_value(
        &mut self,
        key: &str,
        name: &str,
        rev: i64,
        value: Option<Vec<u8>>,
        meta: Meta,
        keys: &Keys,
        secrets: &SecretKeys,
    ) -> bool {
        let Some(v) = value else {
            self.meta.remove(key);
            self.republish.remove(name);
            self.targets.remove(name);
            return true;
        };
        self.meta.insert(key.to_string(), meta);
        let ctx = Ctx {
            prefix: &keys.prefix,
            kind: "targets",
            name,
            meta,
        };
        match auth::check(secrets, &ctx, &v, self.require) {
            Ok((body, checked)) => {
                if checked == Checked::Missing {
                    self.republish.insert(name.to_string());
                } else {
                    self.republish.remove(name);
                }
                match serde_json::from_slice::<TargetSet>(&body) {
                    Ok(mut set) => {
                        set.generation = rev;
                        self.targets.insert(name.to_string(), set);
                    }
                    Err(_) => {
                        self.targets.remove(name);
                    }
                }
                true
            }
            Err(r) => {
                // The resolver publishes over it at its next run, even with the same targets.
                self.republish.insert(name.to_string());
                self.refuse(key, name, &r);
                false
            }
        }
    }

    /// The fleet's "integrity required" key: once seen with a valid MAC, this host requires a
    /// MAC on every value (and remembers it: a deletion does not undo it).
    pub(super) fn integrity_value(
        &mut self,
        key: &str,
        value: Option<Vec<u8>>,
        meta: Meta,
        keys: &Keys,
        secrets: &SecretKeys,
    ) {
        self.integrity_key = false;
        let Some(v) = value else {
            if self.require {
                tracing::warn!(key = %key, "the fleet's integrity key was deleted; this host keeps requiring a MAC on every value");
            }
            return;
        };
        let ctx = Ctx {
            prefix: &keys.prefix,
            kind: "integrity",
            name: "",
            meta,
        };
        match auth::check(secrets, &ctx, &v, true) {
            Ok(_) => {
                if !self.require {
                    tracing::info!(key = %key, "this fleet requires a MAC on every value: values without one are refused from now on");
                    self.newly_required = true;
                    // Their configs are sealed `v2` from now on (by the host rendezvous prefers).
                    let v1: Vec<String> = self.v1_configs.iter().cloned().collect();
                    self.rewrite.extend(v1);
                }
                self.require = true;
                self.integrity_key = true;
            }
            Err(r) => self.refuse(key, "", &r),
        }
    }
}
