//! Integrity of what every host applies (`docs/fleet.md`, "Integrity"): binding values and
//! target sets carry a MAC under the shared secrets key's MAC subkey (`crypto.rs`), over
//!
//! - the prefix, the kind of key (`bindings`, `targets`, `integrity`) and the name,
//! - the key's etcd *version* (its count of puts since it was created) and, from its second put
//!   on, its *create revision* (the writer knows both: every put is guarded by the state it
//!   replaces), so a value put back later (a replay of an older set or binding value) or copied
//!   to another key or prefix does not verify,
//! - the value itself (every clear field: `plugin`, `provider`, `service`, `directives`,
//!   `interval_secs`, the live settings, the version, and the sealed config; for a set its
//!   targets and the binding version it was resolved from).
//!
//! The MAC is the value's last JSON member, `"mac":"m1:KEYID:HEX[,m1:KEYID:HEX...]"` (one tag per
//! key the writer holds, retired ones aside, so a host that has any of them verifies): the MAC'd bytes are the value
//! without it, exactly as written (no re-encoding), and a daemon of before ignores the member.
//! A host refuses a value whose MAC does not verify and, once the fleet requires it (the
//! `integrity` key, or `--etcd-require-integrity`), a value without one.

use serde::Deserialize;

use super::crypto::MacError;
use super::SecretKeys;

/// Where a value lives, as far as its MAC is concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meta {
    /// etcd's `create_revision` of the key (0: not known, or first put).
    pub create_rev: i64,
    /// etcd's `version` of the key: 1 for its first put, +1 per put; 0 when absent.
    pub version: i64,
}

impl Meta {
    /// The key's state after one more put over this one.
    pub fn next(self) -> Meta {
        if self.version <= 0 {
            Meta {
                create_rev: 0,
                version: 1,
            }
        } else {
            Meta {
                create_rev: self.create_rev,
                version: self.version + 1,
            }
        }
    }

    /// The numbers the MAC binds: the create revision is unknown to the writer of a first put.
    fn bound(self) -> [u8; 16] {
        let create = if self.version <= 1 {
            0
        } else {
            self.create_rev
        };
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&create.to_be_bytes());
        out[8..].copy_from_slice(&self.version.to_be_bytes());
        out
    }
}

/// What a MAC covers besides the value.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub prefix: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub meta: Meta,
}

impl Ctx<'_> {
    fn parts<'b>(&'b self, bound: &'b [u8; 16], body: &'b [u8]) -> [&'b [u8]; 6] {
        [
            b"tributary-value-mac-v1",
            self.prefix.as_bytes(),
            self.kind.as_bytes(),
            self.name.as_bytes(),
            bound,
            body,
        ]
    }
}

/// The associated data of a `v2` sealed config: prefix, kind, name and the binding's version
/// (`updated_at_ms`), each length-prefixed.
pub fn config_aad(prefix: &str, name: &str, updated_at_ms: i64) -> Vec<u8> {
    let mut out = Vec::new();
    for p in [
        b"tributary-config-v2".as_slice(),
        prefix.as_bytes(),
        b"bindings",
        name.as_bytes(),
        &updated_at_ms.to_be_bytes(),
    ] {
        out.extend_from_slice(&(p.len() as u64).to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// `body` (a JSON object, as serialized) with its MAC appended as the last member.
pub fn sign(secrets: &SecretKeys, ctx: &Ctx<'_>, body: Vec<u8>) -> Vec<u8> {
    let bound = ctx.meta.bound();
    let tag = secrets.sign(&ctx.parts(&bound, &body));
    let mut out = body;
    if out.last() == Some(&b'}') {
        out.pop();
        out.extend_from_slice(format!(",\"mac\":\"{tag}\"}}").as_bytes());
    }
    out
}

/// How a value's MAC checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Verified: the value as written by a host holding the key.
    Valid,
    /// No MAC (a daemon of before, or written by hand): accepted only while the fleet does not
    /// require integrity.
    Missing,
}

/// Why a value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The MAC names a key this host lacks: it cannot tell (mid-rotation).
    KeyMissing(String),
    /// Forged, altered, moved, replayed, or unauthenticated where the fleet requires a MAC.
    Failed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::KeyMissing(id) => write!(
                f,
                "its MAC is by key(s) {id}, none of which is among this host's keys"
            ),
            Refusal::Failed(why) => f.write_str(why),
        }
    }
}

#[derive(Deserialize)]
struct MacOnly {
    #[serde(default)]
    mac: Option<String>,
}

/// Splits a stored value into its MAC'd bytes and checks the MAC. Returns the bytes to decode
/// (never the unverified rest) and whether a MAC was there.
pub fn verify<'v>(
    secrets: &SecretKeys,
    ctx: &Ctx<'_>,
    value: &'v [u8],
) -> Result<(std::borrow::Cow<'v, [u8]>, Checked), Refusal> {
    let mac = serde_json::from_slice::<MacOnly>(value)
        .map_err(|_| Refusal::Failed("not a JSON object".into()))?
        .mac;
    let Some(tag) = mac else {
        return Ok((value.into(), Checked::Missing));
    };
    let tail = format!(",\"mac\":\"{tag}\"}}");
    let Some(head) = value.strip_suffix(tail.as_bytes()) else {
        return Err(Refusal::Failed(
            "its MAC is not the value's last member as written".into(),
        ));
    };
    let mut body = head.to_vec();
    body.push(b'}');
    let bound = ctx.meta.bound();
    match secrets.verify(&tag, &ctx.parts(&bound, &body)) {
        Ok(()) => Ok((body.into(), Checked::Valid)),
        Err(MacError::Missing(id)) => Err(Refusal::KeyMissing(id)),
        Err(MacError::Bad(why)) => Err(Refusal::Failed(format!(
            "MAC verification failed: {why}; the value is not what a host holding the key wrote at {}{}/{} (etcd version {}): forged, altered, copied from another key or prefix, or an older value put back",
            ctx.prefix, ctx.kind, ctx.name, ctx.meta.version
        ))),
    }
}

/// Checks a value against the fleet's rule: a MAC present must verify; a missing one is refused
/// when `require`.
pub fn check<'v>(
    secrets: &SecretKeys,
    ctx: &Ctx<'_>,
    value: &'v [u8],
    require: bool,
) -> Result<(std::borrow::Cow<'v, [u8]>, Checked), Refusal> {
    let (body, checked) = verify(secrets, ctx, value)?;
    if require && checked == Checked::Missing {
        return Err(Refusal::Failed(
            "it has no MAC and this fleet requires one (integrity required): written by hand or by a daemon of before".into(),
        ));
    }
    Ok((body, checked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(prefix: &str, name: &str, version: i64, create_rev: i64) -> Ctx<'static> {
        Ctx {
            prefix: Box::leak(prefix.to_string().into_boxed_str()),
            kind: "targets",
            name: Box::leak(name.to_string().into_boxed_str()),
            meta: Meta {
                create_rev,
                version,
            },
        }
    }

    #[test]
    fn a_signed_value_verifies_only_where_and_as_it_was_written() {
        let k = SecretKeys::from_bytes(&[&[5u8; 32]]).unwrap();
        let body = br#"{"targets":[{"address":"10.0.0.1","port":80}],"binding_updated_at_ms":7}"#;
        let c = ctx("/p/", "api", 3, 100);
        let v = sign(&k, &c, body.to_vec());
        let (b, checked) = check(&k, &c, &v, true).unwrap();
        assert_eq!(checked, Checked::Valid);
        assert_eq!(&*b, body.as_slice());
        // Another prefix, name, version or create revision: refused.
        for other in [
            ctx("/q/", "api", 3, 100),
            ctx("/p/", "web", 3, 100),
            ctx("/p/", "api", 4, 100),
            ctx("/p/", "api", 3, 101),
        ] {
            assert!(matches!(
                check(&k, &other, &v, false),
                Err(Refusal::Failed(_))
            ));
        }
        // The first put binds no create revision (the writer cannot know it).
        let first = sign(&k, &ctx("/p/", "api", 1, 0), body.to_vec());
        assert!(check(&k, &ctx("/p/", "api", 1, 555), &first, true).is_ok());
        // One byte changed: refused.
        let mut forged = v.clone();
        let i = forged.windows(8).position(|w| w == b"10.0.0.1").unwrap();
        forged[i + 7] = b'9';
        assert!(matches!(
            check(&k, &c, &forged, false),
            Err(Refusal::Failed(_))
        ));
        // No MAC: accepted only when not required.
        assert_eq!(check(&k, &c, body, false).unwrap().1, Checked::Missing);
        assert!(check(&k, &c, body, true).is_err());
        // Another key: "missing", not "failed".
        let other = SecretKeys::from_bytes(&[&[6u8; 32]]).unwrap();
        assert!(matches!(
            check(&other, &c, &v, true),
            Err(Refusal::KeyMissing(_))
        ));
        // A MAC that is not the last member as written: refused.
        let moved = format!(
            "{{\"mac\":{:?},{}",
            serde_json::from_slice::<serde_json::Value>(&v).unwrap()["mac"]
                .as_str()
                .unwrap(),
            std::str::from_utf8(&body[1..]).unwrap()
        );
        assert!(check(&k, &c, moved.as_bytes(), false).is_err());
    }
}
