//! The API token: 32 random bytes as hex, kept in `<data dir>/token` (mode 0600).
//!
//! `serve` uses `$TRIBUTARY_TOKEN` when set, else the token file, else creates one. The CLI uses
//! `$TRIBUTARY_TOKEN` when set, else reads the token file of `--data-dir`. The token travels only
//! in the `Authorization: Bearer` header, never in a URL, and is never logged.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Environment variable that overrides the token file.
pub const TOKEN_ENV: &str = "TRIBUTARY_TOKEN";

/// `<data dir>/token`.
pub fn token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("token")
}

/// The daemon's token: env, else the file, else a new random token written to the file.
pub fn load_or_create(data_dir: &Path) -> anyhow::Result<String> {
    if let Some(t) = from_env()? {
        return Ok(t);
    }
    let path = token_path(data_dir);
    if path.exists() {
        return read_file(&path);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the API token")?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating token file {}", path.display()))?;
    f.write_all(token.as_bytes())
        .and_then(|_| f.write_all(b"\n"))
        .with_context(|| format!("writing token file {}", path.display()))?;
    Ok(token)
}

/// The CLI's token: env, else the data dir's token file.
pub fn for_client(data_dir: &Path) -> anyhow::Result<String> {
    if let Some(t) = from_env()? {
        return Ok(t);
    }
    let path = token_path(data_dir);
    read_file(&path).with_context(|| {
        format!(
            "no API token: set {TOKEN_ENV} or point --data-dir at the daemon's data folder \
             (looked for {})",
            path.display()
        )
    })
}

fn from_env() -> anyhow::Result<Option<String>> {
    match std::env::var(TOKEN_ENV) {
        Ok(t) => {
            let t = t.trim().to_string();
            check(&t).with_context(|| format!("{TOKEN_ENV} is not usable"))?;
            Ok(Some(t))
        }
        Err(_) => Ok(None),
    }
}

fn read_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("tightening mode of {}", path.display()))?;
    }
    let t = text.trim().to_string();
    check(&t).with_context(|| format!("token file {} is not usable", path.display()))?;
    Ok(t)
}

fn check(t: &str) -> anyhow::Result<()> {
    if t.len() < 16 {
        bail!("the token must be at least 16 characters");
    }
    if !t.chars().all(|c| c.is_ascii_graphic()) {
        bail!("the token must be printable ASCII without spaces");
    }
    Ok(())
}

/// Compares two tokens in time independent of where they differ.
pub fn equal(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_token_is_0600_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        // The env var would override the file; this test only runs meaningfully without it.
        if std::env::var_os(TOKEN_ENV).is_some() {
            panic!("unset {TOKEN_ENV} to run this test");
        }
        let t1 = load_or_create(dir.path()).unwrap();
        let t2 = load_or_create(dir.path()).unwrap();
        assert_eq!(t1, t2);
        assert_eq!(t1.len(), 64);
        let mode = std::fs::metadata(token_path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(for_client(dir.path()).unwrap(), t1);
    }

    #[test]
    fn equal_compares_whole_strings() {
        assert!(equal("abcdef", "abcdef"));
        assert!(!equal("abcdef", "abcdeg"));
        assert!(!equal("abc", "abcdef"));
    }
}
