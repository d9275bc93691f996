//! The AEAD that keeps binding configs secret in etcd: XChaCha20-Poly1305 under 32-byte keys read
//! from key files (`--secrets-key FILE`, repeatable: the first key encrypts, every key decrypts).
//!
//! A ciphertext is `v1:<key id>:<base64 of 24-byte nonce ‖ ciphertext ‖ tag>`; the key id is the
//! first 8 hex digits of SHA-256("tributary-secrets-key" ‖ key), so a host knows which of its keys
//! to use and rotation works (docs/fleet.md). The binding's name is the associated data: a
//! ciphertext moved to another binding's key does not decrypt. Nonces are random (24 bytes: no
//! collision worry at any realistic count of writes). A `v2:` ciphertext has the prefix, kind,
//! name and version of the binding value as associated data (`auth.rs`): moved to another prefix
//! or spliced into another version of the binding, it does not decrypt either.
//!
//! Each key also gives a MAC subkey (HKDF-SHA256, `hkdf`), so values every host applies (binding
//! values, target sets) are authenticated with the shared key (`auth.rs`, docs/fleet.md
//! "Integrity"). A key may be *retired*: it still opens and verifies, it never seals, and the
//! values it sealed are re-sealed with the active key (`reseal.rs`).

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::StoreError;

/// Key length in bytes.
pub const KEY_LEN: usize = 32;

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
    /// The MAC subkey: HKDF-SHA256(salt `tributary`, the key, info `tributary etcd value mac v1`).
    mac: [u8; 32],
    /// Opens and verifies, never seals; what it sealed is re-sealed (`--retired-secrets-key`).
    retired: bool,
}

/// The MAC subkey of a secrets key.
fn mac_subkey(key: &[u8]) -> [u8; 32] {
    let mut okm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(b"tributary"), key)
        .expand(b"tributary etcd value mac v1", &mut okm)
        .expect("32 bytes is a valid HKDF-SHA256 length");
    okm
}

/// The hosts' shared secrets keys. `Debug` prints key ids only.
pub struct SecretKeys {
    keys: Vec<Key>,
}

impl fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| &k.id))
            .finish()
    }
}

fn key_id(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"tributary-secrets-key");
    h.update(bytes);
    h.finalize()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl SecretKeys {
    /// Keys from raw bytes (each exactly [`KEY_LEN`]); the first encrypts.
    pub fn from_bytes(keys: &[&[u8]]) -> Result<SecretKeys, StoreError> {
        SecretKeys::with_retired(keys, &[])
    }

    /// [`SecretKeys::from_bytes`] and `retired` keys: they open and verify what they sealed and
    /// signed, never seal, and the values they sealed are re-sealed with the first key.
    pub fn with_retired(keys: &[&[u8]], retired: &[&[u8]]) -> Result<SecretKeys, StoreError> {
        if keys.is_empty() {
            return Err(StoreError::Settings(
                "the etcd store needs a secrets key (--secrets-key FILE)".into(),
            ));
        }
        let mut out: Vec<Key> = Vec::new();
        let all = keys
            .iter()
            .map(|k| (k, false))
            .chain(retired.iter().map(|k| (k, true)));
        for (k, retired) in all {
            if k.len() != KEY_LEN {
                return Err(StoreError::Settings(format!(
                    "a secrets key is {KEY_LEN} bytes, this one has {}",
                    k.len()
                )));
            }
            let id = key_id(k);
            if let Some(same) = out.iter_mut().find(|o| o.id == id) {
                // The same key given as active and retired: it stays active.
                same.retired &= retired;
                continue;
            }
            out.push(Key {
                id,
                cipher: XChaCha20Poly1305::new_from_slice(k).expect("32-byte key"),
                mac: mac_subkey(k),
                retired,
            });
        }
        Ok(SecretKeys { keys: out })
    }

    /// Reads key files: each holds exactly 32 raw bytes (`head -c 32 /dev/urandom > FILE`) and is
    /// readable by its owner only (mode 0600 or 0400). The first file's key encrypts.
    pub fn load(files: &[impl AsRef<Path>]) -> Result<SecretKeys, StoreError> {
        SecretKeys::load_with_retired(files, &[] as &[&Path])
    }

    /// [`SecretKeys::load`] and retired key files (checked the same way).
    pub fn load_with_retired(
        files: &[impl AsRef<Path>],
        retired: &[impl AsRef<Path>],
    ) -> Result<SecretKeys, StoreError> {
        let raw = read_key_files(files)?;
        let old = read_key_files(retired)?;
        let refs: Vec<&[u8]> = raw.iter().map(Vec::as_slice).collect();
        let old: Vec<&[u8]> = old.iter().map(Vec::as_slice).collect();
        SecretKeys::with_retired(&refs, &old)
    }

    /// The id of the key that encrypts.
    pub fn active_id(&self) -> &str {
        &self.keys[0].id
    }

    /// The ids of every key this host has (the keys it can open), the active one first.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.id.clone()).collect()
    }

    /// Whether `id` names a key this host was told is retired.
    pub fn is_retired(&self, id: &str) -> bool {
        self.keys.iter().any(|k| k.id == id && k.retired)
    }

    /// The ids of the retired keys.
    pub fn retired_ids(&self) -> Vec<String> {
        self.keys
            .iter()
            .filter(|k| k.retired)
            .map(|k| k.id.clone())
            .collect()
    }

    /// `m1:KEYID:HEX` of HMAC-SHA256 over `parts` (each length-prefixed: no two lists of parts
    /// give the same message) under the MAC subkey of each key this host holds but retired ones,
    /// the active one first, joined by `,`: a host that has any of them verifies the value (a
    /// host that lacks the new key mid-rotation still verifies what the others write).
    pub fn sign(&self, parts: &[&[u8]]) -> String {
        self.keys
            .iter()
            .filter(|k| !k.retired)
            .map(|k| format!("m1:{}:{}", k.id, hex(&mac_of(&k.mac, parts))))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks the tags of [`SecretKeys::sign`] over `parts`: every tag under a key this host has
    /// must match (`Err(Bad)`: forged, altered, moved, replayed), and there must be one
    /// (`Err(Missing)`: none of the keys named is this host's).
    pub fn verify(&self, tags: &str, parts: &[&[u8]]) -> Result<(), MacError> {
        let mut checked = false;
        let mut missing = Vec::new();
        for tag in tags.split(',') {
            let mut it = tag.splitn(3, ':');
            if it.next() != Some("m1") {
                return Err(MacError::Bad("unknown MAC format".into()));
            }
            let id = it.next().unwrap_or_default();
            let given = it.next().unwrap_or_default();
            let Some(key) = self.keys.iter().find(|k| k.id == id) else {
                missing.push(id);
                continue;
            };
            let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&key.mac).expect("any key length");
            feed(&mut m, parts);
            let given = unhex(given).ok_or_else(|| MacError::Bad("malformed MAC".into()))?;
            m.verify_slice(&given)
                .map_err(|_| MacError::Bad(format!("MAC mismatch (key {id})")))?;
            checked = true;
        }
        if checked {
            Ok(())
        } else {
            Err(MacError::Missing(missing.join(",")))
        }
    }

    /// Encrypts `plain` with the active key, `aad` as associated data, as `v2:KEYID:BASE64`.
    pub fn seal_v2(&self, aad: &[u8], plain: &[u8]) -> String {
        self.seal_as("v2", aad, plain)
    }

    /// Encrypts `plain` for the binding `name` with the active key (`v1`: the name is the
    /// associated data).
    pub fn seal(&self, name: &str, plain: &[u8]) -> String {
        self.seal_as("v1", name.as_bytes(), plain)
    }

    fn seal_as(&self, format: &str, aad: &[u8], plain: &[u8]) -> String {
        let key = &self.keys[0];
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ct = key
            .cipher
            .encrypt(&nonce, Payload { msg: plain, aad })
            .expect("XChaCha20-Poly1305 encryption does not fail for in-memory data");
        let mut body = nonce.to_vec();
        body.extend_from_slice(&ct);
        format!("{format}:{}:{}", key.id, B64.encode(body))
    }

    /// The key id a ciphertext names, if it is one of ours in a known format.
    pub fn key_id_of(sealed: &str) -> Option<&str> {
        let mut parts = sealed.splitn(3, ':');
        matches!(parts.next()?, "v1" | "v2").then_some(())?;
        parts.next()
    }

    /// Decrypts what [`SecretKeys::seal`] made for the binding `name`.
    pub fn open(&self, name: &str, sealed: &str) -> Result<Vec<u8>, StoreError> {
        self.open_any(name, sealed, None)
    }

    /// Decrypts a `v1` ciphertext of the binding `name`, or a `v2` one whose associated data is
    /// `aad_v2` (`None`: `v2` is refused).
    pub fn open_any(
        &self,
        name: &str,
        sealed: &str,
        aad_v2: Option<&[u8]>,
    ) -> Result<Vec<u8>, StoreError> {
        let fail = |why: &str| StoreError::Decrypt {
            binding: name.to_string(),
            why: why.to_string(),
        };
        let mut parts = sealed.splitn(3, ':');
        let aad = match (parts.next(), aad_v2) {
            (Some("v1"), _) => name.as_bytes(),
            (Some("v2"), Some(aad)) => aad,
            _ => return Err(fail("unknown ciphertext format")),
        };
        let id = parts.next().ok_or_else(|| fail("no key id"))?;
        let body = parts.next().ok_or_else(|| fail("no ciphertext"))?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| StoreError::Decrypt {
                binding: name.to_string(),
                why: format!(
                    "it was encrypted with key {id}, which is not among this host's keys ({:?})",
                    self
                ),
            })?;
        let body = B64.decode(body).map_err(|_| fail("bad base64"))?;
        if body.len() < 24 + 16 {
            return Err(fail("ciphertext too short"));
        }
        let (nonce, ct) = body.split_at(24);
        key.cipher
            .decrypt(
                nonce.into(),
                Payload { msg: ct, aad },
            )
            .map_err(|_| {
                fail("authentication failed (wrong key, altered data, or a ciphertext of another binding, prefix or version)")
            })
    }
}

/// Why a MAC did not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MacError {
    /// It names a key this host does not have (mid-rotation): the value cannot be checked here.
    Missing(String),
    /// Forged, altered, moved or replayed.
    Bad(String),
}

fn feed(m: &mut Hmac<Sha256>, parts: &[&[u8]]) {
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
}

fn mac_of(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    feed(&mut m, parts);
    m.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Reads key files: 32 bytes each, readable by the owner only.
fn read_key_files(files: &[impl AsRef<Path>]) -> Result<Vec<Vec<u8>>, StoreError> {
    let mut raw = Vec::new();
    for f in files {
        let f = f.as_ref();
        let meta = std::fs::metadata(f)
            .map_err(|e| StoreError::Settings(format!("secrets key file {}: {e}", f.display())))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(StoreError::Settings(format!(
                "secrets key file {} has mode {mode:04o}: it must be readable by its owner only (chmod 600)",
                f.display()
            )));
        }
        let bytes = std::fs::read(f)
            .map_err(|e| StoreError::Settings(format!("secrets key file {}: {e}", f.display())))?;
        if bytes.len() != KEY_LEN {
            return Err(StoreError::Settings(format!(
                "secrets key file {} holds {} bytes; it must hold exactly {KEY_LEN} random bytes (head -c {KEY_LEN} /dev/urandom > FILE)",
                f.display(),
                bytes.len()
            )));
        }
        raw.push(bytes);
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_binding_bound() {
        let k = SecretKeys::from_bytes(&[&[7u8; 32]]).unwrap();
        let s = k.seal("api", b"{\"token\":\"hunter2\"}");
        assert!(!s.contains("hunter2"));
        assert_eq!(SecretKeys::key_id_of(&s), Some(k.active_id()));
        assert_eq!(k.open("api", &s).unwrap(), b"{\"token\":\"hunter2\"}");
        // Another binding's name as associated data: refused.
        assert!(matches!(k.open("web", &s), Err(StoreError::Decrypt { .. })));
        // Two seals of the same text differ (random nonces).
        assert_ne!(s, k.seal("api", b"{\"token\":\"hunter2\"}"));
    }

    #[test]
    fn rotation_old_key_decrypts_new_key_encrypts() {
        let old = SecretKeys::from_bytes(&[&[1u8; 32]]).unwrap();
        let sealed_old = old.seal("api", b"x");
        let both = SecretKeys::from_bytes(&[&[2u8; 32], &[1u8; 32]]).unwrap();
        assert_eq!(both.open("api", &sealed_old).unwrap(), b"x");
        let sealed_new = both.seal("api", b"y");
        assert_ne!(
            SecretKeys::key_id_of(&sealed_new),
            SecretKeys::key_id_of(&sealed_old)
        );
        // A host with the old key only cannot read the new ciphertext, and says which key.
        let e = old.open("api", &sealed_new).unwrap_err().to_string();
        assert!(
            e.contains(SecretKeys::key_id_of(&sealed_new).unwrap()),
            "{e}"
        );
    }

    #[test]
    fn a_value_is_signed_under_every_key_but_retired_ones() {
        let parts: &[&[u8]] = &[b"a", b"b"];
        let both = SecretKeys::from_bytes(&[&[2u8; 32], &[1u8; 32]]).unwrap();
        let tags = both.sign(parts);
        assert_eq!(tags.split(',').count(), 2, "{tags}");
        // A host with the old key only, or the new one only, verifies.
        for one in [[1u8; 32], [2u8; 32]] {
            let k = SecretKeys::from_bytes(&[&one]).unwrap();
            assert_eq!(k.verify(&tags, parts), Ok(()));
            assert!(matches!(
                k.verify(&tags, &[b"a", b"c"]),
                Err(MacError::Bad(_))
            ));
        }
        // A tag that fails under a key this host has is refused even when another matches.
        let forged = SecretKeys::from_bytes(&[&[1u8; 32]]).unwrap().sign(&[b"x"]);
        let mixed = format!("{},{forged}", tags.split(',').next().unwrap());
        assert!(matches!(both.verify(&mixed, parts), Err(MacError::Bad(_))));
        // None of this host's keys: missing.
        let other = SecretKeys::from_bytes(&[&[3u8; 32]]).unwrap();
        assert!(matches!(
            other.verify(&tags, parts),
            Err(MacError::Missing(_))
        ));
        // A retired key verifies but does not sign.
        let retiring = SecretKeys::with_retired(&[&[2u8; 32]], &[&[1u8; 32]]).unwrap();
        assert_eq!(retiring.sign(parts).split(',').count(), 1);
        assert_eq!(retiring.verify(&tags, parts), Ok(()));
        assert!(retiring.is_retired(&SecretKeys::from_bytes(&[&[1u8; 32]]).unwrap().ids()[0]));
    }

    #[test]
    fn key_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, [0u8; 16]).unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = SecretKeys::load(&[&short]).unwrap_err().to_string();
        assert!(e.contains("holds 16 bytes"), "{e}");
        let open = dir.path().join("open");
        std::fs::write(&open, [0u8; 32]).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SecretKeys::load(&[&open]).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        let e = SecretKeys::load(&[dir.path().join("missing")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(SecretKeys::load(&[&open]).is_ok());
    }
}
