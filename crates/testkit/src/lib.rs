//! The test stack of Tributary, used by the daemon's and crates' tests, the fakes, the module tests
//! (`module/t`, through its `ngx_harness` re-exports) and the benches:
//! - [`Nginx`] ([`Options`]): a real nginx with the combined-upstreams module loaded, as
//!   production runs it (`master_process on`, 2 workers), an `http {}` body with `{Pn}` port
//!   placeholders, reloads by `SIGHUP` that wait for the new workers, a valgrind-style wrapper,
//!   and a check of the error log on stop (`[alert]`, `[crit]`, `[emerg]`, a worker "exited on
//!   signal") unless the case declared the line ([`Options::expect_log`]);
//! - [`TestNginx`] ([`TestNginxBuilder`]): the daemon's fixture (described below): an nginx with
//!   backends, an `upstreams/` include folder for the applier, and optionally the module's API;
//!   its error log is checked when it is dropped (`[error]` too; [`TestNginx::expect_log`]);
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
//! Used as a dev-dependency only. Nothing here is mocked: [`TestNginx`] runs
//! `nginx -p DIR -c DIR/conf/nginx.conf -e stderr` as a child process (`daemon off`, master + one
//! worker, or several with [`TestNginxBuilder::workers`]) and stops it when dropped, also when the
//! test panics.
//!
//! Layout of the prefix `DIR`:
//! ```text
//! DIR/conf/nginx.conf        generated main config (see below)
//! DIR/conf/upstreams/        where tributary-apply writes `<name>.conf` (created empty)
//! DIR/logs/error.log         nginx's error log (level notice: reloads are visible)
//! DIR/logs/nginx.pid         pid file
//! DIR/logs/stderr.log        the master's stderr
//! ```
//! The main config has, at `http` level: `include upstreams/*.conf;` (unless disabled with
//! [`TestNginxBuilder::without_upstreams_glob`]), the caller's snippets, one `server` per backend
//! (`return 200 "<name>"`), and the main server on [`TestNginx::port`] with
//! - `GET /` → `200 tributary-testkit`
//! - `GET /u/<upstream>/...` → `proxy_pass http://<upstream>` (an upstream that does not exist gives 502).
//!
//! A missing nginx binary makes the fixture panic with a clear message; tests never skip silently.
//!
//! [`TestNginx`] gives `test_cmd()` / `reload_cmd()` for `CommandNginx` (`nginx -t` runs under
//! `unshare -n` where allowed, so an unresolvable host name in a test never sends a DNS query off the
//! machine), and `wait_for_body` / `wait_settled`, which wait out the old worker after a reload so
//! later requests see the new configuration. It is stopped by `SIGTERM` to the master (what
//! `nginx -s stop` sends), so a broken `nginx.conf` cannot block the shutdown.
#![forbid(unsafe_code)]

mod builder;
mod cases;
pub mod client;
mod errlog;
mod http;
mod nginx;
mod plugin;
mod ports;
pub mod procfs;
mod programs;
mod ready;
mod runner;
mod runner_conf;
mod tmpfs;
mod wrk;

pub use builder::TestNginxBuilder;
pub use cases::{
    check, check_eq, config_test, config_test_with, expect_emerg, expect_ok, run_tests, CaseResult,
    ConfigTest,
};
pub use client::{KeepAlive, Response};
pub use errlog::{lines_with_markers, unexpected_log_lines, BAD_LOG_MARKERS, FIXTURE_LOG_MARKERS};
pub use http::http_get;
pub use libtest_mimic::{Completion, Failed, Trial};
pub use nginx::{TestNginx, FIXTURE_EXPECTED};
pub use plugin::PluginPackage;
pub use ports::{dead_port, free_port, free_ports, free_tcp_udp_port};
pub(crate) use programs::running_as_root;
pub use programs::{
    combined_upstreams_module, network_isolation_available, nginx_binary, try_nginx_binary,
    MODULE_ENV,
};
pub use ready::{listening, wait_ready, NotReady};
pub use runner::Nginx;
pub use runner_conf::{
    fill, module_path, nginx_bin, workspace_root, Options, DEFAULT_WORKERS, NGINX_ENV, PORTS,
};
pub use tmpfs::TmpfsMount;
pub use wrk::{Wrk, WrkReport};

use std::time::Duration;

/// How long [`TestNginx`] waits for nginx to listen after starting it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
