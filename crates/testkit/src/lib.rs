//! Test fixtures for Tributary: a real nginx (Debian's package) on a free loopback port with its own
//! temporary prefix, tiny backends served by the same nginx, free ports ([`free_port`],
//! [`free_tcp_udp_port`]), a minimal HTTP client, and the plugin package a plugin's tests check
//! ([`this_plugin!`]: its built executable and source folder).
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
//! DIR/conf/stop.conf         minimal config used only to signal the master on drop
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
//! later requests see the new configuration. It is stopped through a stop-only config so a broken
//! `nginx.conf` cannot block the shutdown.
#![forbid(unsafe_code)]

mod builder;
mod http;
mod nginx;
mod plugin;
mod ports;
mod programs;
mod tmpfs;

pub use builder::TestNginxBuilder;
pub use http::http_get;
pub use nginx::TestNginx;
pub use plugin::PluginPackage;
pub use ports::{free_port, free_tcp_udp_port};
pub(crate) use programs::running_as_root;
pub use programs::{
    combined_upstreams_module, network_isolation_available, nginx_binary, try_nginx_binary,
    MODULE_ENV,
};
pub use tmpfs::TmpfsMount;

use std::time::Duration;

/// How long [`TestNginx`] waits for nginx to listen after starting it.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
