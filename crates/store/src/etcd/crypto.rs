//! The AEAD that keeps binding configs secret in etcd: XChaCha20-Poly1305 under 32-byte keys read
//! from key files (`--secrets-key FILE`, repeatable: the first key encrypts, every key decrypts).
//!
//! A ciphertext is `v1:<key id>:<base64 of 24-byte nonce ‖ ciphertext ‖ tag>`; the key id is the
//! first 8 hex digits of SHA-256("tributary-secrets-key" ‖ key), so a host knows which of its keys
//! to use and rotation works (docs/fleet.md). The binding's name is the associated data: a
//! ciphertext moved to another binding's key does not decrypt. Nonces are random (24 bytes: no
//! collision worry at any realistic count of writes).

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use sha2::{Digest, Sha256};

use crate::StoreError;

/// Key length in bytes.
pub const KEY_LEN: usize = 32;

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
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
        if keys.is_empty() {
            return Err(StoreError::Settings(
                "the etcd store needs a secrets key (--secrets-key FILE)".into(),
            ));
        }
        let mut out = Vec::new();
        for k in keys {
            if k.len() != KEY_LEN {
                return Err(StoreError::Settings(format!(
                    "a secrets key is {KEY_LEN} bytes, this one has {}",
                    k.len()
                )));
            }
            out.push(Key {
                id: key_id(k),
                cipher: XChaCha20Poly1305::new_from_slice(k).expect("32-byte key"),
            });
        }
        Ok(SecretKeys { keys: out })
    }

    /// Reads key files: each holds exactly 32 raw bytes (`head -c 32 /dev/urandom > FILE`) and is
    /// readable by its owner only (mode 0600 or 0400). The first file's key encrypts.
    pub fn load(files: &[impl AsRef<Path>]) -> Result<SecretKeys, StoreError> {
        let mut raw = Vec::new();
        for f in files {
            let f = f.as_ref();
            let meta = std::fs::metadata(f).map_err(|e| {
                StoreError::Settings(format!("secrets key file {}: {e}", f.display()))
            })?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(StoreError::Settings(format!(
                    "secrets key file {} has mode {mode:04o}: it must be readable by its owner only (chmod 600)",
                    f.display()
                )));
            }
            let bytes = std::fs::read(f).map_err(|e| {
                StoreError::Settings(format!("secrets key file {}: {e}", f.display()))
            })?;
            if bytes.len() != KEY_LEN {
                return Err(StoreError::Settings(format!(
                    "secrets key file {} holds {} bytes; it must hold exactly {KEY_LEN} random bytes (head -c {KEY_LEN} /dev/urandom > FILE)",
                    f.display(),
                    bytes.len()
                )));
            }
            raw.push(bytes);
        }
        let refs: Vec<&[u8]> = raw.iter().map(Vec::as_slice).collect();
        SecretKeys::from_bytes(&refs)
    }

    /// The id of the key that encrypts.
    pub fn active_id(&self) -> &str {
        &self.keys[0].id
    }

    /// The ids of every key this host has (the keys it can open), the active one first.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.id.clone()).collect()
    }

    /// Encrypts `plain` for the binding `name` with the active key.
    pub fn seal(&self, name: &str, plain: &[u8]) -> String {
        let key = &self.keys[0];
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let ct = key
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: name.as_bytes(),
                },
            )
            .expect("XChaCha20-Poly1305 encryption does not fail for in-memory data");
        let mut body = nonce.to_vec();
        body.extend_from_slice(&ct);
        format!("v1:{}:{}", key.id, B64.encode(body))
    }

    /// The key id a ciphertext names, if it is one of ours in a known format.
    pub fn key_id_of(sealed: &str) -> Option<&str> {
        let mut parts = sealed.splitn(3, ':');
        (parts.next()? == "v1").then_some(())?;
        parts.next()
    }

    /// Decrypts what [`SecretKeys::seal`] made for the binding `name`.
    pub fn open(&self, name: &str, sealed: &str) -> Result<Vec<u8>, StoreError> {
        let fail = |why: &str| StoreError::Decrypt {
            binding: name.to_string(),
            why: why.to_string(),
        };
        let mut parts = sealed.splitn(3, ':');
        if parts.next() != Some("v1") {
            return Err(fail("unknown ciphertext format"));
        }
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
                Payload {
                    msg: ct,
                    aad: name.as_bytes(),
                },
            )
            .map_err(|_| fail("authentication failed (wrong key or altered data)"))
    }
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
