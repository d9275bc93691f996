//! The test stack of Tributary, used by the daemon's and crates' tests, the fakes, the module tests
//! (`module/t`, through its `ngx_harness` re-exports) and the benches:
//! - [`Nginx`]: a real nginx as production runs it (`master_process on`, 2 workers unless asked
//!   otherwise), optionally with the combined-upstreams module, started either from
//!   [`Options`] with an `http {}` body whose `{Pn}` placeholders become free ports (the module
//!   tests), or from [`NginxBuilder`], the daemon's fixture (backends, an `upstreams/` include
//!   folder for the applier, the module's API; one worker unless asked). Reloads by `SIGHUP`
//!   ([`Nginx::reload`]) or by the commands the daemon runs ([`Nginx::reload_cmd`]), a
//!   valgrind-style wrapper ([`Options::wrapper`]); stopped with `SIGQUIT` and a bounded wait,
//!   then its error log is checked: an `[error]`, `[crit]`, `[alert]`, `[emerg]` or a worker that
//!   "exited on signal" fails the test unless it declared the line ([`Nginx::expect_log`]);
//! - [`client`]: one blocking HTTP/1.1 client (one request per connection, or a [`KeepAlive`]
//!   connection served by one worker, over TCP or a unix socket); [`http_get`] is its shortest form;
//! - ports ([`free_port`], [`free_ports`], [`free_tcp_udp_port`], [`dead_port`]), waiting for a
//!   server a test started ([`wait_ready`], [`listening`]), [`procfs`]
//!   (children, titles, memory, CPU ticks, signals by pid), [`Wrk`] (constant load from `wrk`);
//! - [`run_tests`] and the checks of `libtest-mimic` cases ([`check`], [`check_eq`],
//!   [`expect_emerg`]);
//! - the plugin package a plugin's tests check ([`this_plugin!`]: its built executable and source
//!   folder), and [`TmpfsMount`] for full-disk tests.
//!
//! Used as a dev-dependency only. Nothing here is mocked: [`Nginx`] runs
//! `nginx -p DIR -e DIR/logs/error.log -c DIR/conf/nginx.conf` as a child process (`daemon off`)
//! and stops it when dropped, also when the test panics. A missing nginx binary (or module, when
//! it is loaded) makes the start fail with a clear message; tests never skip silently.
//!
//! [`Nginx`] gives `test_cmd()` / `reload_cmd()` for `CommandNginx` (`nginx -t` runs under
//! `unshare -n` where allowed, so an unresolvable host name in a test never sends a DNS query off the
//! machine), and `wait_for_body` / `wait_settled`, which wait out the old worker after a reload so
//! later requests see the new configuration.
#![forbid(unsafe_code)]

mod builder;
mod cases;
pub mod client;
mod errlog;
mod http;
mod nginx;
mod nginx_ops;
mod options;
mod plugin;
mod ports;
pub mod procfs;
mod programs;
mod ready;
mod tmpfs;
mod wrk;

pub use builder::{NginxBuilder, FIXTURE_EXPECTED};
pub use cases::{
    check, check_eq, config_test, config_test_with, expect_emerg, expect_ok, run_tests, CaseResult,
    ConfigTest,
};
pub use client::{KeepAlive, Response};
pub use errlog::{lines_with_markers, unexpected_log_lines, LOG_MARKERS};
pub use http::http_get;
pub use libtest_mimic::{Completion, Failed, Trial};
pub use nginx::Nginx;
pub use options::{
    fill, module_path, nginx_bin, workspace_root, Options, DEFAULT_WORKERS, NGINX_ENV, PORTS,
};
pub use plugin::PluginPackage;
pub use ports::{dead_port, free_port, free_ports, free_tcp_udp_port};
pub(crate) use programs::running_as_root;
pub use programs::{
    combined_upstreams_module, network_isolation_available, nginx_binary, try_nginx_binary,
    MODULE_ENV,
};
pub use ready::{listening, wait_ready, NotReady};
pub use tmpfs::TmpfsMount;
pub use wrk::{Wrk, WrkReport};
