//! A binding's stored value (`P/bindings/NAME`): everything plain but its config map, sealed as
//! one ciphertext, and a MAC (`auth.rs`); what resolving it takes, read without opening it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::auth::{self, Checked, Ctx, Meta, Refusal};
use super::keys::{provider_pair, Need};
use super::SecretKeys;
use crate::{BindingRecord, StoreError, StoredBinding};

/// The stored form of a binding: everything plain but `config`, which is one ciphertext of the
/// whole config map (keys included).
#[derive(Serialize, Deserialize)]
struct BindingValue {
    plugin: String,
    provider: String,
    service: String,
    interval_secs: u64,
    directives: Vec<String>,
    config: String,
    created_at_ms: i64,
    updated_at_ms: i64,
    /// Live settings; absent in values written before them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    probe: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    drain_secs: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What resolving the binding stored as `value` takes; `None` for a value that is not a binding
/// of this format (every host is then as able as any other).
pub fn need_of(value: &[u8]) -> Option<Need> {
    let v: BindingValue = serde_json::from_slice(value).ok()?;
    Some(Need {
        provider: provider_pair(&v.plugin, &v.provider),
        key_id: SecretKeys::key_id_of(&v.config)?.to_string(),
    })
}

/// How a binding value is written: where (its MAC's context) and with which config format.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    pub prefix: &'a str,
    /// The key's state once this value is put (`Meta::next` of the one it replaces).
    pub meta: Meta,
    /// Seal the config as `v2` (associated data: prefix, kind, name, version); `false` while the
    /// fleet may still have daemons of before (they open `v1` only).
    pub v2: bool,
}

pub fn encode_binding(sb: &StoredBinding, secrets: &SecretKeys, w: Write<'_>) -> Vec<u8> {
    let b = &sb.binding;
    let config = serde_json::to_vec(&b.config).unwrap_or_else(|_| b"{}".to_vec());
    let sealed = if w.v2 {
        secrets.seal_v2(
            &auth::config_aad(w.prefix, &b.name, sb.updated_at_ms),
            &config,
        )
    } else {
        secrets.seal(&b.name, &config)
    };
    let v = BindingValue {
        plugin: b.plugin.clone(),
        provider: b.provider.clone(),
        service: b.service.clone(),
        interval_secs: b.interval_secs,
        directives: b.directives.clone(),
        config: sealed,
        created_at_ms: sb.created_at_ms,
        updated_at_ms: sb.updated_at_ms,
        probe: b.probe.clone(),
        drain_secs: b.drain_secs,
    };
    let body = serde_json::to_vec(&v).unwrap_or_default();
    auth::sign(
        secrets,
        &Ctx {
            prefix: w.prefix,
            kind: "bindings",
            name: &b.name,
            meta: w.meta,
        },
        body,
    )
}

/// A binding value read back.
#[derive(Debug)]
pub struct Decoded {
    pub sb: StoredBinding,
    /// The id of the key that sealed its config.
    pub key_id: String,
    /// Whether it had a MAC.
    pub checked: Checked,
    /// Its config is sealed as `v2`.
    pub v2: bool,
}

/// Why a binding value was not decoded.
#[derive(Debug)]
pub enum Undecodable {
    /// Its MAC failed (or is missing where required): refused and reported.
    Refused(Refusal),
    /// It cannot be opened here (a key this host lacks, a corrupt value).
    Store(StoreError),
}

/// The binding `name` from its stored value at `meta` under `prefix`, checked (`require`: a
/// value without a MAC is refused).
pub fn decode_binding(
    name: &str,
    value: &[u8],
    secrets: &SecretKeys,
    prefix: &str,
    meta: Meta,
    require: bool,
) -> Result<Decoded, Undecodable> {
    let corrupt = || {
        Undecodable::Store(StoreError::Corrupt {
            binding: name.to_string(),
            what: "etcd value",
        })
    };
    let ctx = Ctx {
        prefix,
        kind: "bindings",
        name,
        meta,
    };
    let (body, checked) = auth::check(secrets, &ctx, value, require).map_err(|r| match r {
        Refusal::KeyMissing(id) => Undecodable::Store(StoreError::Decrypt {
            binding: name.to_string(),
            why: format!(
                "its MAC is by key {id}, which is not among this host's keys ({secrets:?})"
            ),
        }),
        r => Undecodable::Refused(r),
    })?;
    let v: BindingValue = serde_json::from_slice(&body).map_err(|_| corrupt())?;
    let aad = auth::config_aad(prefix, name, v.updated_at_ms);
    let plain = secrets
        .open_any(name, &v.config, Some(&aad))
        .map_err(|e| match e {
            // A v2 config that does not open under this value's prefix, name and version was
            // moved or replayed (its key is here): refused like a failed MAC.
            StoreError::Decrypt { why, .. }
                if v.config.starts_with("v2:")
                    && SecretKeys::key_id_of(&v.config)
                        .is_some_and(|id| secrets.ids().iter().any(|k| k == id)) =>
            {
                Undecodable::Refused(Refusal::Failed(format!(
                    "its sealed config does not open here: {why}"
                )))
            }
            e => Undecodable::Store(e),
        })?;
    let config: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&plain).map_err(|_| corrupt())?;
    let key_id = SecretKeys::key_id_of(&v.config)
        .unwrap_or_default()
        .to_string();
    let v2 = v.config.starts_with("v2:");
    Ok(Decoded {
        sb: StoredBinding {
            binding: BindingRecord {
                name: name.to_string(),
                plugin: v.plugin,
                provider: v.provider,
                config,
                service: v.service,
                interval_secs: v.interval_secs,
                directives: v.directives,
                probe: v.probe,
                drain_secs: v.drain_secs,
            },
            created_at_ms: v.created_at_ms,
            updated_at_ms: v.updated_at_ms,
        },
        key_id,
        checked,
        v2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M1: Meta = Meta {
        create_rev: 0,
        version: 1,
    };
    const W: Write<'static> = Write {
        prefix: "/t/",
        meta: M1,
        v2: false,
    };
    use crate::etcd::keys::{Can, HostBeat};

    #[test]
    fn what_a_binding_needs_is_read_without_its_key_and_checked_against_a_heartbeat() {
        let old = SecretKeys::from_bytes(&[&[1u8; 32]]).unwrap();
        let new = SecretKeys::from_bytes(&[&[2u8; 32], &[1u8; 32]]).unwrap();
        let sb = StoredBinding {
            binding: BindingRecord {
                name: "api".into(),
                plugin: "consul".into(),
                provider: "c".into(),
                config: BTreeMap::new(),
                service: "web".into(),
                interval_secs: 30,
                directives: vec![],
                drain_secs: 0,
                probe: None,
            },
            created_at_ms: 1,
            updated_at_ms: 2,
        };
        // Sealed with the new key: a host with the old key only cannot open it, but reads what
        // it needs.
        let v = encode_binding(&sb, &new, W);
        assert!(decode_binding("api", &v, &old, "/t/", M1, false).is_err());
        let need = need_of(&v).unwrap();
        assert_eq!(need.provider, "consul/c");
        assert_eq!(need.key_id, new.active_id());
        let can = |providers: Option<&[&str]>, keys: &SecretKeys| Can {
            providers: providers.map(|p| p.iter().map(|s| s.to_string()).collect()),
            keys: keys.ids(),
            auth: true,
        };
        assert!(can(Some(&["consul/c"]), &new).covers(&need));
        assert!(can(None, &new).covers(&need));
        assert!(!can(Some(&["consul/c"]), &old).covers(&need), "key missing");
        assert!(!can(Some(&["dns/a"]), &new).covers(&need), "plugin missing");
        assert!(!can(Some(&[]), &new).covers(&need), "empty plugins dir");
        // A heartbeat of before (no `can`) still parses.
        let beat: HostBeat = serde_json::from_str(r#"{"started_ms":5}"#).unwrap();
        assert!(beat.can.is_none());
        assert_eq!(need_of(b"not json"), None);
    }

    #[test]
    fn a_binding_value_holds_no_config_in_clear() {
        let secrets = SecretKeys::from_bytes(&[&[9u8; 32]]).unwrap();
        let sb = StoredBinding {
            binding: BindingRecord {
                name: "api".into(),
                plugin: "consul".into(),
                provider: "consul".into(),
                config: BTreeMap::from([("acl_token".to_string(), serde_json::json!("s3cr3t"))]),
                service: "web".into(),
                interval_secs: 30,
                directives: vec![],
                drain_secs: 0,
                probe: None,
            },
            created_at_ms: 1,
            updated_at_ms: 2,
        };
        let v = encode_binding(&sb, &secrets, W);
        let text = String::from_utf8(v.clone()).unwrap();
        assert!(
            !text.contains("s3cr3t") && !text.contains("acl_token"),
            "{text}"
        );
        let d = decode_binding("api", &v, &secrets, "/t/", M1, true).unwrap();
        assert_eq!(d.sb, sb);
        assert_eq!(d.key_id, secrets.active_id());
        assert_eq!(d.checked, Checked::Valid);
        // Under another prefix, or at another etcd version: refused.
        assert!(matches!(
            decode_binding("api", &v, &secrets, "/u/", M1, false),
            Err(Undecodable::Refused(_))
        ));
        let m2 = Meta {
            create_rev: 5,
            version: 2,
        };
        assert!(matches!(
            decode_binding("api", &v, &secrets, "/t/", m2, false),
            Err(Undecodable::Refused(_))
        ));
    }

    #[test]
    fn a_v2_config_spliced_into_another_version_or_prefix_does_not_open() {
        let secrets = SecretKeys::from_bytes(&[&[9u8; 32]]).unwrap();
        let sb = |v: i64, token: &str| StoredBinding {
            binding: BindingRecord {
                name: "api".into(),
                plugin: "consul".into(),
                provider: "consul".into(),
                config: BTreeMap::from([("acl_token".to_string(), serde_json::json!(token))]),
                service: "web".into(),
                interval_secs: 30,
                directives: vec![],
                drain_secs: 0,
                probe: None,
            },
            created_at_ms: 1,
            updated_at_ms: v,
        };
        let w = Write { v2: true, ..W };
        let old = encode_binding(&sb(2, "old"), &secrets, w);
        let new = encode_binding(&sb(3, "new"), &secrets, w);
        let config_of = |v: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(v).unwrap()["config"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(config_of(&new).starts_with("v2:"));
        // The old ciphertext in the new version's value (no MAC: a fleet of before): refused.
        let mut spliced: serde_json::Value = serde_json::from_slice(&new).unwrap();
        spliced["config"] = config_of(&old).into();
        spliced.as_object_mut().unwrap().remove("mac");
        let spliced = serde_json::to_vec(&spliced).unwrap();
        let e = decode_binding("api", &spliced, &secrets, "/t/", M1, false).unwrap_err();
        assert!(matches!(e, Undecodable::Refused(_)), "{e:?}");
        // Its own value opens; under another prefix (MAC stripped) it does not.
        let mut plain: serde_json::Value = serde_json::from_slice(&new).unwrap();
        plain.as_object_mut().unwrap().remove("mac");
        let plain = serde_json::to_vec(&plain).unwrap();
        assert!(decode_binding("api", &plain, &secrets, "/t/", M1, false).is_ok());
        assert!(decode_binding("api", &plain, &secrets, "/u/", M1, false).is_err());
    }
}
