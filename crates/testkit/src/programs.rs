//! The programs the fixtures run: nginx, the combined-upstreams module, `unshare -n`.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Finds the nginx binary: `$TRIBUTARY_NGINX`, else `nginx` on `PATH`, else `/usr/sbin/nginx`.
///
/// # Panics
/// When none exists, with a message telling how to install it.
pub fn nginx_binary() -> PathBuf {
    try_nginx_binary().unwrap_or_else(|e| panic!("{e}"))
}

/// Whether `unshare -n` works here (a new network namespace needs root or CAP_SYS_ADMIN).
/// Checked once per process.
pub fn network_isolation_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("unshare")
            .args(["-n", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Like [`nginx_binary`], returning the error text instead of panicking.
pub fn try_nginx_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TRIBUTARY_NGINX") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("TRIBUTARY_NGINX={} is not a file", p.display()))
        };
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("nginx"))
                .collect()
        })
        .unwrap_or_default();
    candidates.push(PathBuf::from("/usr/sbin/nginx"));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "nginx binary not found (looked in $TRIBUTARY_NGINX, PATH, /usr/sbin/nginx): \
         install Debian's nginx package (scripts/setup.sh does it)"
            .to_string()
    })
}

pub(crate) fn running_as_root() -> bool {
    // /proc/self is owned by the effective uid of the process reading it.
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Environment variable that overrides where the combined-upstreams module `.so` is looked up
/// (the same one `module/t` reads).
pub const MODULE_ENV: &str = "COMBINED_UPSTREAMS_MODULE";

/// The combined-upstreams module `.so`: `$COMBINED_UPSTREAMS_MODULE`, else the release build in
/// the target dir (`$CARGO_TARGET_DIR`, else `<workspace>/target`), as `module/t` finds it. Built
/// by `cargo build --release -p ngx-combined-upstreams` (`scripts/test.sh` does).
pub fn combined_upstreams_module() -> Result<PathBuf, String> {
    let path = match std::env::var_os(MODULE_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
            .join("release/libngx_http_combined_upstreams_module.so"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the combined-upstreams module is not at {} (build it with `cargo build --release -p \
             ngx-combined-upstreams`, or set {MODULE_ENV})",
            path.display()
        ))
    }
}
