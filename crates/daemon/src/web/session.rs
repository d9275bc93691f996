//! Web UI access control: one login password (argon2id hash), server-side sessions in memory,
//! CSRF tokens.
//!
//! - **Password.** `$TRIBUTARY_UI_PASSWORD` when set (its hash replaces the stored one when it
//!   differs), else the stored hash `<data dir>/ui-password.hash` (mode 0600), else a random
//!   password is created at first start: its hash is stored and the password itself is written
//!   once to `<data dir>/ui-initial-password` (mode 0600) — the log names the file, never the
//!   password. Only the argon2id hash (PHC string) is kept.
//! - **Sessions.** A random 256-bit id in the `tributary_session` cookie (`HttpOnly`,
//!   `SameSite=Strict`, `Path=/`), valid for [`SESSION_IDLE`] after its last use; logout ends it.
//! - **CSRF.** Every session has a random token; every form carries it in a hidden `csrf` field and
//!   every POST checks it. The login form uses a double-submit token (cookie + field).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use argon2::password_hash::SaltString;
use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};

/// Environment variable holding the UI password (optional).
pub const PASSWORD_ENV: &str = "TRIBUTARY_UI_PASSWORD";
/// Session cookie name.
pub const SESSION_COOKIE: &str = "tributary_session";
/// Login CSRF cookie name.
pub const LOGIN_COOKIE: &str = "tributary_login";
/// A session ends after this long without a request.
pub const SESSION_IDLE: Duration = Duration::from_secs(12 * 3600);
/// Most sessions kept at once (the oldest go first).
pub const MAX_SESSIONS: usize = 256;
/// Shortest password accepted from the environment.
pub const MIN_PASSWORD_LEN: usize = 8;

/// `<data dir>/ui-password.hash`.
pub fn hash_path(data_dir: &Path) -> PathBuf {
    data_dir.join("ui-password.hash")
}

/// `<data dir>/ui-initial-password`.
pub fn initial_password_path(data_dir: &Path) -> PathBuf {
    data_dir.join("ui-initial-password")
}

/// `n` random bytes from the kernel, as lowercase hex.
pub fn random_hex(n: usize) -> anyhow::Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two strings in time independent of where they differ.
pub fn equal(a: &str, b: &str) -> bool {
    crate::token::equal(a, b)
}

fn hash_password(password: &str) -> anyhow::Result<String> {
    let mut salt = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut salt))
        .context("reading /dev/urandom for a salt")?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| anyhow::anyhow!("salt: {e}"))?;
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map_err(|e| anyhow::anyhow!("hashing the UI password: {e}"))?
        .to_string())
}

fn write_0600(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.write_all(b"\n"))
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The login password's hash.
pub struct Login {
    hash: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Login(<argon2 hash>)")
    }
}

/// How the password was found at start (for the start-up log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    Env,
    Stored,
    /// Created now; the password is in this file.
    Created(PathBuf),
}

impl Login {
    /// The login of `data_dir` (see the module docs for the order).
    pub fn load_or_create(data_dir: &Path) -> anyhow::Result<(Login, PasswordSource)> {
        let path = hash_path(data_dir);
        let stored = match std::fs::read_to_string(&path) {
            Ok(t) => {
                let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                }
                let t = t.trim().to_string();
                PasswordHash::new(&t).map_err(|_| {
                    anyhow::anyhow!(
                        "{} is not an argon2 hash: delete it to create a new password",
                        path.display()
                    )
                })?;
                Some(t)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if let Ok(pw) = std::env::var(PASSWORD_ENV) {
            if pw.chars().count() < MIN_PASSWORD_LEN {
                anyhow::bail!("{PASSWORD_ENV} must be at least {MIN_PASSWORD_LEN} characters");
            }
            if let Some(h) = stored {
                let login = Login { hash: h };
                if login.verify(&pw) {
                    return Ok((login, PasswordSource::Env));
                }
            }
            let hash = hash_password(&pw)?;
            write_0600(&path, &hash)?;
            let _ = std::fs::remove_file(initial_password_path(data_dir));
            return Ok((Login { hash }, PasswordSource::Env));
        }
        if let Some(hash) = stored {
            return Ok((Login { hash }, PasswordSource::Stored));
        }
        let pw = random_hex(12)?;
        let initial = initial_password_path(data_dir);
        write_0600(&initial, &pw)?;
        let hash = hash_password(&pw)?;
        write_0600(&path, &hash)?;
        Ok((Login { hash }, PasswordSource::Created(initial)))
    }

    /// Whether `password` is the login password.
    pub fn verify(&self, password: &str) -> bool {
        match PasswordHash::new(&self.hash) {
            Ok(h) => Argon2::default()
                .verify_password(password.as_bytes(), &h)
                .is_ok(),
            Err(_) => false,
        }
    }
}

/// One logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    pub csrf: String,
    last_used: Instant,
}

/// The sessions of logged-in browsers (in memory: a restart logs everyone out).
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a session; returns its id (the cookie value).
    pub fn create(&self) -> anyhow::Result<String> {
        let id = random_hex(32)?;
        let csrf = random_hex(32)?;
        let mut map = self.lock();
        map.retain(|_, s| s.last_used.elapsed() < SESSION_IDLE);
        while map.len() >= MAX_SESSIONS {
            let oldest = map
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(
            id.clone(),
            Session {
                csrf,
                last_used: Instant::now(),
            },
        );
        Ok(id)
    }

    /// The live session with this id (and marks it used).
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut map = self.lock();
        let s = map.get_mut(id)?;
        if s.last_used.elapsed() >= SESSION_IDLE {
            map.remove(id);
            return None;
        }
        s.last_used = Instant::now();
        Some(s.clone())
    }

    /// Ends a session.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, Path=/; `max_age` 0 deletes it.
pub fn set_cookie(name: &str, value: &str, max_age: Option<u64>) -> String {
    let mut s = format!("{name}={value}; HttpOnly; SameSite=Strict; Path=/");
    if let Some(a) = max_age {
        s.push_str(&format!("; Max-Age={a}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_password_is_stored_hashed_and_0600() {
        if std::env::var_os(PASSWORD_ENV).is_some() {
            panic!("unset {PASSWORD_ENV} to run this test");
        }
        let dir = tempfile::tempdir().unwrap();
        let (login, src) = Login::load_or_create(dir.path()).unwrap();
        let PasswordSource::Created(file) = src else {
            panic!("expected a created password")
        };
        let pw = std::fs::read_to_string(&file).unwrap().trim().to_string();
        assert!(pw.len() >= 16);
        assert!(login.verify(&pw));
        assert!(!login.verify("wrong password"));
        let hash = std::fs::read_to_string(hash_path(dir.path())).unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(!hash.contains(&pw));
        for p in [file, hash_path(dir.path())] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        // The second start reads the stored hash.
        let (again, src) = Login::load_or_create(dir.path()).unwrap();
        assert_eq!(src, PasswordSource::Stored);
        assert!(again.verify(&pw));
    }

    #[test]
    fn a_bad_hash_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(hash_path(dir.path()), "not a hash").unwrap();
        let err = Login::load_or_create(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not an argon2 hash"), "{err}");
    }

    #[test]
    fn sessions_and_cookies() {
        let s = Sessions::default();
        let id = s.create().unwrap();
        assert_eq!(id.len(), 64);
        let csrf = s.get(&id).unwrap().csrf;
        assert_eq!(csrf.len(), 64);
        assert!(s.get("nope").is_none());
        s.remove(&id);
        assert!(s.get(&id).is_none());

        let mut h = axum::http::HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            "a=1; tributary_session=abc; b=2".parse().unwrap(),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
        let c = set_cookie(SESSION_COOKIE, "abc", None);
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
    }
}
