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
//! - **Login rate limit.** [`LoginLimiter`]: after [`LOGIN_MAX_FAILURES`] wrong passwords in a row
//!   from one client address (IPv6: one /64), that address gets 429 with `Retry-After` for
//!   [`LOGIN_LOCKOUT`], doubling with each wrong password after a lock-out up to
//!   [`LOGIN_LOCKOUT_MAX`]; a right password clears it. Failures older than [`LOGIN_FAILURE_WINDOW`]
//!   are forgotten.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use argon2::password_hash::SaltString;
use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};
use tributary_store::lock;

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

/// Wrong passwords in a row from one address before it is locked out.
pub const LOGIN_MAX_FAILURES: u32 = 5;
/// First lock-out.
pub const LOGIN_LOCKOUT: Duration = Duration::from_secs(60);
/// Longest lock-out.
pub const LOGIN_LOCKOUT_MAX: Duration = Duration::from_secs(15 * 60);
/// An address whose last wrong password is older than this starts afresh.
pub const LOGIN_FAILURE_WINDOW: Duration = Duration::from_secs(15 * 60);
/// Addresses remembered at most (the stalest go first).
pub const LOGIN_TRACKED_MAX: usize = 10_000;

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
    /// Starts a session; returns its id (the cookie value).
    pub fn create(&self) -> anyhow::Result<String> {
        let id = random_hex(32)?;
        let csrf = random_hex(32)?;
        let mut map = lock(&self.map);
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
        let mut map = lock(&self.map);
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
        lock(&self.map).remove(id);
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

/// Failed logins of one client address.
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

/// Per-address login rate limit (see the module docs). Memory is bounded by
/// [`LOGIN_TRACKED_MAX`] addresses.
#[derive(Debug, Default)]
pub struct LoginLimiter {
    by_addr: Mutex<HashMap<std::net::IpAddr, Failures>>,
}

/// The key of a client address: IPv4 as is, IPv6 by its /64 (one host usually owns a /64).
fn limit_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                std::net::IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl LoginLimiter {
    /// `Err(retry_after)` while `ip` is locked out; check before verifying a password.
    pub fn check(&self, ip: std::net::IpAddr, now: Instant) -> Result<(), Duration> {
        match lock(&self.by_addr)
            .get(&limit_key(ip))
            .and_then(|f| f.locked_until)
        {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    /// A wrong password from `ip`. Returns the lock-out it starts, if any.
    pub fn failed(&self, ip: std::net::IpAddr, now: Instant) -> Option<Duration> {
        let mut map = lock(&self.by_addr);
        if map.len() >= LOGIN_TRACKED_MAX && !map.contains_key(&limit_key(ip)) {
            map.retain(|_, f| now.saturating_duration_since(f.last) < LOGIN_FAILURE_WINDOW);
            if map.len() >= LOGIN_TRACKED_MAX {
                if let Some(stalest) = map.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| *k) {
                    map.remove(&stalest);
                }
            }
        }
        let f = map.entry(limit_key(ip)).or_insert(Failures {
            count: 0,
            last: now,
            locked_until: None,
        });
        if now.saturating_duration_since(f.last) >= LOGIN_FAILURE_WINDOW {
            *f = Failures {
                count: 0,
                last: now,
                locked_until: None,
            };
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
        if f.count < LOGIN_MAX_FAILURES {
            return None;
        }
        let doublings = (f.count - LOGIN_MAX_FAILURES).min(16);
        let lockout = LOGIN_LOCKOUT
            .saturating_mul(1u32 << doublings)
            .min(LOGIN_LOCKOUT_MAX);
        f.locked_until = Some(now + lockout);
        Some(lockout)
    }

    /// A right password from `ip`: its failures are forgotten.
    pub fn succeeded(&self, ip: std::net::IpAddr) {
        lock(&self.by_addr).remove(&limit_key(ip));
    }
}

/// `Retry-After` seconds for a wait (rounded up, at least 1).
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
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

    #[test]
    fn five_wrong_passwords_lock_an_address_out_doubling_up_to_the_cap() {
        let l = LoginLimiter::default();
        let a: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let b: std::net::IpAddr = "192.0.2.8".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..4 {
            assert_eq!(l.failed(a, t0), None, "failure {i}");
            assert!(l.check(a, t0).is_ok());
        }
        assert_eq!(l.failed(a, t0), Some(LOGIN_LOCKOUT));
        assert_eq!(l.check(a, t0), Err(LOGIN_LOCKOUT));
        assert_eq!(retry_after_secs(LOGIN_LOCKOUT), 60);
        assert!(l.check(b, t0).is_ok(), "another address is not affected");
        // After the lock-out, one more wrong password locks out twice as long.
        let t1 = t0 + LOGIN_LOCKOUT;
        assert!(l.check(a, t1).is_ok());
        assert_eq!(l.failed(a, t1), Some(LOGIN_LOCKOUT * 2));
        let mut t = t1;
        for _ in 0..10 {
            t += LOGIN_LOCKOUT_MAX;
            // Each wrong password lands within the window of the previous one.
            t -= Duration::from_secs(1);
            let got = l.failed(a, t).unwrap();
            assert!(got <= LOGIN_LOCKOUT_MAX);
        }
        assert_eq!(l.check(a, t), Err(LOGIN_LOCKOUT_MAX));
        // A right password clears the address.
        l.succeeded(a);
        assert!(l.check(a, t).is_ok());
        assert_eq!(l.failed(a, t), None);
    }

    #[test]
    fn old_failures_are_forgotten_and_ipv6_counts_per_64() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        let a: std::net::IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let a2: std::net::IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..4 {
            l.failed(a, t0);
        }
        // The same /64 counts together.
        assert_eq!(l.failed(a2, t0), Some(LOGIN_LOCKOUT));
        let other: std::net::IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(l.check(other, t0).is_ok());
        // Four failures, then a quiet window: the count starts again.
        let v4: std::net::IpAddr = "198.51.100.1".parse().unwrap();
        for _ in 0..4 {
            l.failed(v4, t0);
        }
        let later = t0 + LOGIN_FAILURE_WINDOW;
        assert_eq!(l.failed(v4, later), None);
    }

    #[test]
    fn the_limiter_remembers_a_bounded_number_of_addresses() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        for i in 0..(LOGIN_TRACKED_MAX as u32 + 50) {
            let ip = std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            l.failed(ip, t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(lock(&l.by_addr).len() <= LOGIN_TRACKED_MAX);
    }
}
