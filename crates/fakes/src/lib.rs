//! Test support for every discovery plugin (`plugins/*`): their tests and benches use it, so each
//! runs the built plugin, the host, the daemon and nginx the same way.
//!
//! Registries:
//! - [`consul::FakeConsul`]: a fake of Consul's `/v1/health/service/<name>` and
//!   `/v1/catalog/services`, written from Consul's public API docs (it is not Consul).
//! - [`kube::FakeKube`]: a fake Kubernetes API server answering EndpointSlice lists over HTTPS
//!   with a test CA and a bearer token, written from the Kubernetes API reference.
//! - [`moto::Moto`]: the real `moto_server` from PyPI (in `target/venv`), with IAM auth on.
//! - [`dnsmasq::Dnsmasq`]: the real `dnsmasq` (Debian) answering records given on its command line.
//! - [`etcd::Etcd`]: the real etcd (Debian's `etcd-server`), with a small v3 JSON API client.
//! - [`tls::TestCa`]: a CA and a server certificate generated at test time.
//!
//! The plugin under test:
//! - [`daemon::plugin_folder`]: a plugin folder with the real manifest pointing at the built binary;
//!   [`daemon::assert_cli_check_passes`]: `tributary plugin check`.
//! - [`host::HostedPlugin`]: that plugin under the real plugin host.
//! - [`daemon::Daemon`]: the real `tributary serve` for end-to-end tests with a real nginx (also
//!   the daemon's own tests and scale bench; [`daemon::add_testplug`] adds the plugin host's
//!   misbehaving test plugin); [`wait`]: polling, and what nginx serves for an upstream.
//! - [`bench`](mod@bench): the resolve benchmark (through the host, and in-process when the
//!   plugin has a library, in the same run).
//!
//! Every server listens on 127.0.0.1 only, on a free port, and stops when dropped.
//!
//! `crates/daemon/tests/e2e/common/mod.rs` wraps the daemon runner (a dev-dependency: fakes does not
//! depend on the daemon). The registries' fakes run on `http.rs` (a stoppable/resumable hyper server
//! on its own runtime), Kubernetes' certificates come from `tls.rs` (rcgen). [`daemon::Daemon`] takes
//! extra `serve` arguments and restarts on the same data dir. Fleet: `etcd_cluster.rs` runs a real
//! n-member etcd cluster on loopback (SIGKILL and restart one member or all, dump a prefix with each
//! key's version), `fleet_store/` is an in-memory multi-host `BindingStore` for the engine's in-
//! process fleet tests, and `counting_plugin.rs` writes a shell plugin that counts its calls (the
//! fleet tests and the fleet benchmark).
#![forbid(unsafe_code)]

pub mod bench;
pub mod consul;
pub mod counting_plugin;
pub mod daemon;
pub mod dnsmasq;
pub mod etcd;
pub mod etcd_cluster;
pub mod fleet_store;
pub mod host;
pub mod http;
pub mod kube;
pub mod moto;
pub mod tls;
pub mod wait;

/// The program `name`: the first on `PATH`, else `fallback` (its usual Debian path). Panics with
/// `install_hint` when neither exists: a missing tool fails the test, it never skips it.
pub fn find_program(name: &str, fallback: &str, install_hint: &str) -> std::path::PathBuf {
    let mut candidates: Vec<std::path::PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
        .unwrap_or_default();
    candidates.push(fallback.into());
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found (PATH, {fallback}): {install_hint}"))
}
