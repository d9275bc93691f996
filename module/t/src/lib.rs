//! Test harness for the combined-upstreams module: runs Debian's `/usr/sbin/nginx` with the
//! module loaded (`load_module`), on free 127.0.0.1 ports, in its own temporary prefix, and talks
//! HTTP/1.1 to it over plain `std::net::TcpStream` ([`http_request`], [`KeepAlive`]).
//!
//! - [`config_test`] / [`expect_emerg`]: `nginx -t` on a configuration, the latter checking that
//!   it fails with an expected `[emerg]` text.
//! - [`Nginx::start`]: a running nginx like production runs it (`master_process on`, 2 workers;
//!   [`Options`] for other process models, expected alerts, a valgrind wrapper) that stays up for
//!   the whole case; [`Nginx::reload`] reloads it with a new configuration. Stopped with `SIGQUIT`
//!   and a bounded wait ([`Nginx::stop`], or on `Drop`, also when the case panics); a case fails
//!   on an unexpected `[alert]`/`[crit]`/`[emerg]` or a worker that "exited on signal".
//! - [`Wrk`]: constant load from Debian's `wrk` while a case does something else (reloads).
//! - [`run_tests`]: runs `libtest_mimic` trials and ends with a `N passed, N failed` line.
//!
//! Configurations are the *inside* of `http {}`; `{P0}` … `{P9}` are replaced by free ports,
//! `{DEAD}` by a port where nothing listens, and `{PREFIX}` by the prefix directory. Environment
//! overrides: `COMBINED_UPSTREAMS_MODULE` (path of the module `.so`, default
//! `target/release/libngx_http_combined_upstreams_module.so`, built by `cargo build --release -p
//! ngx-combined-upstreams`) and `NGINX_BIN` (default `/usr/sbin/nginx`). A missing `.so` or nginx
//! binary makes every case fail with a message saying so.

mod http;
mod load;
mod nginx;
pub mod procfs;

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use http::{http_get, http_request, http_request_unix, KeepAlive, Response};
pub use libtest_mimic::{Completion, Failed, Trial};
pub use load::{Wrk, WrkReport};
pub use nginx::{unexpected_log_lines, Nginx, Options, BAD_LOG_MARKERS, DEFAULT_WORKERS};

/// Environment variable that overrides where the module `.so` is looked up.
pub const MODULE_ENV: &str = "COMBINED_UPSTREAMS_MODULE";
/// Environment variable that overrides the nginx binary.
pub const NGINX_ENV: &str = "NGINX_BIN";
/// Number of `{Pn}` placeholders available in a configuration.
pub const PORTS: usize = 10;

/// Result type of a test case.
pub type CaseResult = Result<(), Failed>;

/// Path of the module `.so`: `$COMBINED_UPSTREAMS_MODULE`, else the release build output.
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os(MODULE_ENV) {
        return PathBuf::from(p);
    }
    workspace_root().join("target/release/libngx_http_combined_upstreams_module.so")
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The nginx binary: `$NGINX_BIN`, else Debian's `/usr/sbin/nginx`.
pub fn nginx_bin() -> PathBuf {
    std::env::var_os(NGINX_ENV).map_or_else(|| PathBuf::from("/usr/sbin/nginx"), PathBuf::from)
}

pub(crate) fn check_prerequisites() -> Result<(), String> {
    let so = module_path();
    if !so.is_file() {
        return Err(format!(
            "module not found at {} (build it with `cargo build --release -p \
             ngx-combined-upstreams`, or set {MODULE_ENV})",
            so.display()
        ));
    }
    let bin = nginx_bin();
    if !bin.is_file() {
        return Err(format!(
            "nginx not found at {} (install Debian's nginx: scripts/setup.sh, or set {NGINX_ENV})",
            bin.display()
        ));
    }
    Ok(())
}

/// A temporary directory removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<Self, String> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "cu-nginx-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        for sub in ["conf", "logs", "tmp"] {
            fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `n` distinct free TCP ports on 127.0.0.1 (all listeners are held until every port is picked).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .filter_map(|_| TcpListener::bind("127.0.0.1:0").ok())
        .collect();
    listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.port())
        .collect()
}

/// A loopback port where nothing listens (a dead server), outside Linux's ephemeral range
/// (32768–60999) from which [`free_ports`] and other tests' `bind(0)` take their ports, so no
/// concurrently running test can bring it to life.
pub fn dead_port() -> u16 {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let seed = std::process::id() as usize * 7919
        + COUNTER.fetch_add(1, Ordering::Relaxed) * 104_729
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize);
    let mut port = 20_000 + (seed % 12_000) as u16;
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        port = 20_000 + (port - 20_000 + 1) % 12_000;
    }
    port
}

/// Replaces `{P0}`…`{P9}`, `{DEAD}` and `{PREFIX}` in a configuration template.
pub fn fill(template: &str, ports: &[u16], dead: u16, prefix: &Path) -> String {
    let mut s = template
        .replace("{PREFIX}", &prefix.display().to_string())
        .replace("{DEAD}", &dead.to_string());
    for (i, p) in ports.iter().enumerate() {
        s = s.replace(&format!("{{P{i}}}"), &p.to_string());
    }
    s
}

/// Outcome of `nginx -t`: whether it succeeded, and its stderr.
#[derive(Debug)]
pub struct ConfigTest {
    /// `nginx -t` exited 0.
    pub ok: bool,
    /// Everything nginx printed on stderr.
    pub stderr: String,
}

/// Runs `nginx -t` on an `http {}` body (placeholders filled with free ports).
pub fn config_test(http: &str) -> Result<ConfigTest, String> {
    config_test_with("", http)
}

/// [`config_test`] with extra main-context lines (e.g. `env NAME;`).
pub fn config_test_with(main_extra: &str, http: &str) -> Result<ConfigTest, String> {
    check_prerequisites()?;
    let dir = TempDir::new()?;
    let ports = free_ports(PORTS);
    let opts = Options::new().main(main_extra);
    let conf = nginx::write_config(&dir.0, &opts, http, &ports, dead_port())?;
    let out = nginx::nginx_command(&dir.0, &conf, &[])
        .arg("-t")
        .output()
        .map_err(|e| format!("run {}: {e}", nginx_bin().display()))?;
    Ok(ConfigTest {
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Checks that `nginx -t` rejects the configuration with an `[emerg]` line containing `expected`.
pub fn expect_emerg(http: &str, expected: &str) -> CaseResult {
    let t = config_test(http)?;
    if t.ok {
        return Err(
            format!("nginx -t accepted the configuration; expected [emerg] {expected:?}").into(),
        );
    }
    let hit = t
        .stderr
        .lines()
        .any(|l| l.contains("[emerg]") && l.contains(expected));
    if !hit {
        return Err(format!(
            "expected [emerg] containing {expected:?}, nginx said:\n{}",
            t.stderr
        )
        .into());
    }
    Ok(())
}

/// Checks that `nginx -t` accepts the configuration; returns its stderr (warnings).
pub fn expect_ok(http: &str) -> Result<String, Failed> {
    let t = config_test(http)?;
    if !t.ok {
        return Err(format!("nginx -t failed:\n{}", t.stderr).into());
    }
    Ok(t.stderr)
}

/// Checks a condition inside a case; the message names what was expected.
pub fn check(cond: bool, msg: impl FnOnce() -> String) -> CaseResult {
    if cond {
        Ok(())
    } else {
        Err(msg().into())
    }
}

/// Checks equality inside a case.
pub fn check_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> CaseResult {
    check(got == want, || {
        format!("{what}: got {got:?}, want {want:?}")
    })
}

/// Runs the trials like the standard test harness (so `cargo nextest` can list and run each
/// one), then prints `N passed, N failed` and exits with the harness's code.
pub fn run_tests(trials: Vec<Trial>) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let listing = args.list;
    let conclusion = libtest_mimic::run(&args, trials);
    if !listing {
        println!(
            "{} passed, {} failed",
            conclusion.num_passed, conclusion.num_failed
        );
    }
    conclusion.exit()
}

/// One `nginx -t` failure case: configuration and expected `[emerg]` text.
pub fn emerg_trial(name: &str, http: &'static str, expected: &'static str) -> Trial {
    Trial::test(name, move || expect_emerg(http, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_replaces_ports_and_prefix() {
        let s = fill(
            "listen 127.0.0.1:{P0}; x {P1} {PREFIX}/a {DEAD}",
            &[8080, 9090],
            7,
            Path::new("/t"),
        );
        assert_eq!(s, "listen 127.0.0.1:8080; x 9090 /t/a 7");
    }

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(PORTS);
        let mut q = p.clone();
        q.sort_unstable();
        q.dedup();
        assert_eq!(p.len(), PORTS);
        assert_eq!(q.len(), PORTS);
    }
}
