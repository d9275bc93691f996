//! Test harness of the combined-upstreams module: the name under which the module tests
//! (`module/t/tests`) and benches (`module/t/bench`) reach the test stack in `tributary-testkit`,
//! which holds all of it. Runs Debian's `/usr/sbin/nginx` with the module loaded (`load_module`),
//! on free 127.0.0.1 ports, in its own temporary prefix, and talks HTTP/1.1 to it
//! ([`http_request`], [`KeepAlive`]).
//!
//! - [`config_test`] / [`expect_emerg`]: `nginx -t` on a configuration, the latter checking that
//!   it fails with an expected `[emerg]` text.
//! - [`Nginx::start`]: a running nginx like production runs it (`master_process on`, 2 workers;
//!   [`Options`] for other process models, expected alerts, a valgrind wrapper) that stays up for
//!   the whole case; [`Nginx::reload`] reloads it with a new configuration. Stopped with `SIGQUIT`
//!   and a bounded wait ([`Nginx::stop`], or on `Drop`, also when the case panics); a case fails
//!   on an `[error]`/`[crit]`/`[alert]`/`[emerg]` line or a worker that "exited on signal" it did
//!   not declare ([`Options::expect_log`], [`Nginx::expect_log`]: the exact text it causes).
//! - [`Wrk`]: constant load from Debian's `wrk` while a case does something else (reloads).
//! - [`run_tests`]: runs `libtest_mimic` trials and ends with a `N passed, N failed` line.
//!
//! Configurations are the *inside* of `http {}`; `{P0}` … `{P9}` are replaced by free ports,
//! `{DEAD}` by a port where nothing listens, and `{PREFIX}` by the prefix directory. Environment
//! overrides: `COMBINED_UPSTREAMS_MODULE` (path of the module `.so`, default
//! `target/release/libngx_http_combined_upstreams_module.so`, built by `cargo build --release -p
//! ngx-combined-upstreams`) and `NGINX_BIN` (default: `nginx` on `PATH`, else `/usr/sbin/nginx`).
//! A missing `.so` or nginx binary makes every case fail with a message saying so.

pub use tributary_testkit::client::{
    http_get, http_request, http_request_unix, http_request_within, READ_TIMEOUT,
};
pub use tributary_testkit::procfs;
pub use tributary_testkit::{
    check, check_eq, config_test, config_test_with, dead_port, expect_emerg, expect_ok, fill,
    free_ports, module_path, nginx_bin, run_tests, unexpected_log_lines, workspace_root,
    CaseResult, Completion, ConfigTest, Failed, KeepAlive, Nginx, Options, Response, Trial, Wrk,
    WrkReport, DEFAULT_WORKERS, LOG_MARKERS, MODULE_ENV, NGINX_ENV, PORTS,
};
