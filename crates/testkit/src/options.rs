//! How [`Nginx`](crate::Nginx) is started: [`Options`] (process model, main-context lines,
//! expected log lines, ports, a wrapper such as valgrind, time limits), the `nginx.conf` written
//! around an `http {}` body with its placeholders filled ([`fill`]), the nginx command line, and
//! where the nginx binary and the module `.so` are found. The fixture's
//! [`NginxBuilder`](crate::NginxBuilder) ends in [`Options`] too (its `http {}` body rendered from
//! backends and snippets), so both start, reload and stop the same way.
//!
//! Configurations are the *inside* of `http {}`; `{P0}` … `{P9}` are replaced by free ports,
//! `{DEAD}` by a port where nothing listens, and `{PREFIX}` by the prefix directory. Environment
//! overrides: `COMBINED_UPSTREAMS_MODULE` ([`MODULE_ENV`]: the module `.so`, default the release
//! build in the target dir, built by `cargo build --release -p ngx-combined-upstreams`) and
//! `NGINX_BIN` ([`NGINX_ENV`]: default [`nginx_binary`]'s lookup). A missing `.so` or nginx binary
//! makes the start fail with a message saying so.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{combined_upstreams_module, free_ports, try_nginx_binary, Failed, Nginx, MODULE_ENV};

/// Environment variable that overrides the nginx binary of [`Nginx`] and [`config_test`](crate::config_test).
pub const NGINX_ENV: &str = "NGINX_BIN";
/// Number of `{Pn}` placeholders available in a configuration.
pub const PORTS: usize = 10;

/// Path of the module `.so`: `$COMBINED_UPSTREAMS_MODULE`, else the release build output (see
/// [`combined_upstreams_module`], which also checks that it exists).
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os(MODULE_ENV) {
        return PathBuf::from(p);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("release/libngx_http_combined_upstreams_module.so")
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The nginx binary: `$NGINX_BIN`, else [`try_nginx_binary`]'s (`$TRIBUTARY_NGINX`, `PATH`,
/// `/usr/sbin/nginx`), else `/usr/sbin/nginx` (whose absence [`check_prerequisites`] reports).
pub fn nginx_bin() -> PathBuf {
    std::env::var_os(NGINX_ENV).map_or_else(
        || try_nginx_binary().unwrap_or_else(|_| PathBuf::from("/usr/sbin/nginx")),
        PathBuf::from,
    )
}

/// The module `.so` (when loaded) and the nginx binary exist; the error says how to get the
/// missing one.
pub(crate) fn check_prerequisites(module: bool) -> Result<(), String> {
    if module {
        combined_upstreams_module()?;
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

/// A temporary prefix (`conf/`, `conf/upstreams/`, `logs/`, `tmp/`), removed on drop. Mode 0755 (not the 0700 of a
/// private temp dir): nginx's workers run as another user (`nobody`) when the master runs as
/// root, and read and write in the prefix.
pub(crate) fn temp_prefix(name: &str) -> Result<tempfile::TempDir, String> {
    let dir = tempfile::Builder::new()
        .prefix(name)
        .permissions(fs::Permissions::from_mode(0o755))
        .tempdir()
        .map_err(|e| format!("create a temporary prefix: {e}"))?;
    for sub in ["conf/upstreams", "logs", "tmp"] {
        fs::create_dir_all(dir.path().join(sub))
            .map_err(|e| format!("create {}: {e}", dir.path().display()))?;
    }
    Ok(dir)
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

/// Default number of worker processes.
pub const DEFAULT_WORKERS: usize = 2;

/// How nginx is started: process model, extra main-context lines, expected bad log lines, ports,
/// a wrapper command (valgrind) and time limits. `Options::new()` is production-like:
/// `master_process on`, [`DEFAULT_WORKERS`] workers, the module loaded.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) main_extra: String,
    pub(crate) master: bool,
    pub(crate) workers: usize,
    pub(crate) expected: Vec<String>,
    pub(crate) ports: Option<Vec<u16>>,
    pub(crate) wrapper: Vec<String>,
    pub(crate) start_timeout: Duration,
    pub(crate) stop_timeout: Duration,
    /// `load_module` of the combined-upstreams module (off for the fixture without its API).
    pub(crate) module: bool,
    /// The level of `error_log` (`info`; the fixture's `notice`).
    pub(crate) log_level: &'static str,
    /// Files written (relative to `conf/`) before nginx starts.
    pub(crate) files: Vec<(PathBuf, Vec<u8>)>,
    /// Drop checks the error log (off: [`crate::NginxBuilder::own_log_check`]).
    pub(crate) check_log: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            main_extra: String::new(),
            master: true,
            workers: DEFAULT_WORKERS,
            expected: Vec::new(),
            ports: None,
            wrapper: Vec::new(),
            start_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(10),
            module: true,
            log_level: "info",
            files: Vec::new(),
            check_log: true,
        }
    }
}

impl Options {
    /// `master_process on`, [`DEFAULT_WORKERS`] workers, no extra lines.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds main-context lines (e.g. `load_module ...;`, `env NAME;`). Not `master_process` or
    /// `worker_processes`: use [`Options::workers`] / [`Options::single_process`].
    pub fn main(mut self, lines: &str) -> Self {
        self.main_extra.push_str(lines);
        self.main_extra.push('\n');
        self
    }

    /// Number of worker processes (with the master process).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// `master_process off`: one process that serves requests itself. Only for cases that need
    /// it; the call site says why.
    pub fn single_process(mut self) -> Self {
        self.master = false;
        self.workers = 1;
        self
    }

    /// Declares that error-log lines containing `needle` are expected (they do not fail the case
    /// even when they are `[error]`, `[alert]`, `[crit]`, `[emerg]` or "exited on signal"). Name
    /// the message, not only its level (`"no live upstreams"`, not `"[error]"`).
    pub fn expect_log(mut self, needle: &str) -> Self {
        self.expected.push(needle.to_string());
        self
    }

    /// Uses these ports for `{P0}`…`{P9}` (several instances can then share one port table). No
    /// retry when one is taken.
    pub fn ports(mut self, ports: &[u16]) -> Self {
        self.ports = Some(ports.to_vec());
        self
    }

    /// Runs nginx under a wrapper command, e.g. `["valgrind", "--log-file=..."]`.
    pub fn wrapper(mut self, argv: &[&str]) -> Self {
        self.wrapper = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Time limits for startup (listening and workers up) and for the master to exit after
    /// `SIGQUIT` (also used for a reload's new workers). Defaults 10 s and 10 s.
    pub fn timeouts(mut self, start: Duration, stop: Duration) -> Self {
        self.start_timeout = start;
        self.stop_timeout = stop;
        self
    }

    /// Starts nginx with this `http {}` body and waits until every port written as
    /// `listen 127.0.0.1:{Pn}` (one space after `listen`) accepts connections and, with the master
    /// process, every worker runs. Without [`Options::ports`], a start that fails (a port taken
    /// meanwhile) is retried twice with new ports.
    pub fn start(&self, http: &str) -> Result<Nginx, Failed> {
        check_prerequisites(self.module)?;
        if let Some(ports) = &self.ports {
            return Nginx::launch(self.clone(), http, ports.clone(), None)
                .map_err(|e| e.into_message().into());
        }
        // Any failure is retried: a port of the case's own (a backend it listens on) may have
        // collided with one picked here, which nginx reports in other words than a taken port.
        let mut last_err = String::new();
        for _ in 0..3 {
            match Nginx::launch(self.clone(), http, free_ports(PORTS), None) {
                Ok(n) => return Ok(n),
                Err(e) => last_err = e.into_message(),
            }
        }
        Err(last_err.into())
    }
}

/// The whole `nginx.conf` around an `http {}` body.
pub(crate) fn full_config(opts: &Options, http: &str, prefix: &Path) -> String {
    let load = if opts.module {
        format!("load_module {};\n", module_path().display())
    } else {
        String::new()
    };
    let p = prefix.display();
    let master = if opts.master { "on" } else { "off" };
    format!(
        "{load}\
         daemon off;\n\
         master_process {master};\n\
         worker_processes {workers};\n\
         error_log {p}/logs/error.log {level};\n\
         pid {p}/logs/nginx.pid;\n\
         {main_extra}\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
         access_log off;\n\
         client_body_temp_path {p}/tmp/body;\n\
         proxy_temp_path {p}/tmp/proxy;\n\
         fastcgi_temp_path {p}/tmp/fastcgi;\n\
         uwsgi_temp_path {p}/tmp/uwsgi;\n\
         scgi_temp_path {p}/tmp/scgi;\n\
         {http}\n\
         }}\n",
        workers = opts.workers,
        level = opts.log_level,
        main_extra = opts.main_extra,
    )
}

/// Writes `conf/nginx.conf` into `dir` with the placeholders of both parts filled.
pub(crate) fn write_config(
    dir: &Path,
    opts: &Options,
    http: &str,
    ports: &[u16],
    dead: u16,
) -> Result<PathBuf, String> {
    let conf = dir.join("conf/nginx.conf");
    let mut filled = opts.clone();
    filled.main_extra = fill(&opts.main_extra, ports, dead, dir);
    let http = fill(http, ports, dead, dir);
    fs::write(&conf, full_config(&filled, &http, dir))
        .map_err(|e| format!("write {}: {e}", conf.display()))?;
    Ok(conf)
}

/// `nginx -p DIR -e DIR/logs/error.log -c CONF` (under the wrapper, if any) with stdin closed.
pub(crate) fn nginx_command(dir: &Path, conf: &Path, wrapper: &[String]) -> Command {
    let mut c = match wrapper.split_first() {
        Some((prog, args)) => {
            let mut c = Command::new(prog);
            c.args(args).arg(nginx_bin());
            c
        }
        None => Command::new(nginx_bin()),
    };
    c.arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("logs/error.log"))
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null());
    c
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
    fn default_config_runs_master_and_two_workers() {
        let c = full_config(&Options::new(), "", Path::new("/p"));
        assert!(
            c.contains("master_process on;\nworker_processes 2;\n"),
            "{c}"
        );
        let c = full_config(&Options::new().single_process(), "", Path::new("/p"));
        assert!(
            c.contains("master_process off;\nworker_processes 1;\n"),
            "{c}"
        );
        let c = full_config(
            &Options::new().workers(4).main("env X;"),
            "",
            Path::new("/p"),
        );
        assert!(
            c.contains("worker_processes 4;") && c.contains("env X;"),
            "{c}"
        );
    }
}
