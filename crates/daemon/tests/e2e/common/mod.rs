//! Shared harness of the daemon's end-to-end tests: the daemon runner of `tributary-fakes` (the
//! one every plugin's tests use) with the real `tributary` binary, the real `static` plugin
//! process (and, on request, the plugin host's misbehaving `tributary-testplug`) and a real nginx
//! (testkit). Every process is stopped on drop.
#![allow(dead_code)]

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tributary_fakes::daemon as fakes;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_testkit::Nginx;

pub mod fleet;
pub mod live;

#[allow(unused_imports)] // each test binary uses some of them
pub use tributary_fakes::daemon::{assert_fails, assert_ok, http};

/// The `tributary` binary under test.
pub fn tributary_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tributary"))
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// `<root>/plugins` holding only the `static` plugin: its real manifest from
/// `plugins/static/plugin.json`, with `executable` pointing at the built binary.
pub fn static_plugins_dir(root: &Path) -> PathBuf {
    fakes::plugins_dir(
        root,
        &workspace_root().join("plugins/static"),
        &fakes::sibling_bin(&tributary_bin(), "tributary-plugin-static"),
    )
}

/// The `serve` arguments of one fleet host: `--store etcd` on every member of `cluster`, keys
/// under `prefix`, secrets sealed with the key file `key`, host id `host`, presence lease of
/// `lease_ttl_secs` seconds.
pub fn fleet_args(
    cluster: &EtcdCluster,
    prefix: &str,
    key: &Path,
    host: &str,
    lease_ttl_secs: u64,
) -> Vec<String> {
    vec![
        "--store".into(),
        "etcd".into(),
        "--etcd-endpoints".into(),
        cluster.endpoints().join(","),
        "--etcd-prefix".into(),
        prefix.into(),
        "--secrets-key".into(),
        key.display().to_string(),
        "--host-id".into(),
        host.into(),
        "--etcd-lease-ttl-secs".into(),
        lease_ttl_secs.to_string(),
    ]
}

/// A running `tributary serve` ([`fakes::Daemon`]) with the `static` plugin. It derefs to the
/// runner (`port`, `data_dir`, `plugins_dir`, `log`, `cli`, `token`, `log_text`, `spawn`, `stop`,
/// ...); `api`, `cli_json` and `wait_for` keep this harness's shapes.
pub struct Daemon(fakes::Daemon);

impl Daemon {
    /// Starts a daemon managing `nginx`'s conf dir with the runner's fast defaults
    /// ([`fakes::FAST`]).
    pub fn start(root: &Path, nginx: &Nginx) -> Daemon {
        Daemon(fakes::Daemon::start(
            &tributary_bin(),
            root,
            &static_plugins_dir(root),
            nginx,
        ))
    }

    /// Starts a daemon with extra `serve` arguments (none: the daemon's defaults); the pseudo
    /// argument `--with-testplug` adds the misbehaving test plugin as `testplug` (provider `t`).
    pub fn start_with(root: &Path, nginx: &Nginx, extra: &[&str]) -> Daemon {
        let plugins = static_plugins_dir(root);
        if extra.contains(&"--with-testplug") {
            let testplug = fakes::sibling_bin(&tributary_bin(), "tributary-testplug");
            fakes::add_testplug(&plugins, &testplug);
        }
        let extra: Vec<&str> = extra
            .iter()
            .copied()
            .filter(|a| *a != "--with-testplug")
            .collect();
        Daemon(fakes::Daemon::start_with(
            &tributary_bin(),
            root,
            &plugins,
            nginx,
            &extra,
        ))
    }

    /// An authenticated API call with the body sent as is; the answer parsed as JSON (`Null`
    /// when it is not).
    pub fn api(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        self.0.api_raw(method, path, body)
    }

    /// `tributary ARGS --json`: (success, parsed stdout).
    pub fn cli_json(&self, args: &[&str]) -> (bool, Value) {
        let (ok, v, _) = self.0.cli_json(args);
        (ok, v)
    }

    /// Polls `GET /api/v1/bindings/{name}` until `pred` holds (at most 30 s); returns the detail.
    pub fn wait_for(&self, name: &str, pred: impl FnMut(&Value) -> bool) -> Value {
        self.0.wait_for(name, tributary_fakes::wait::WAIT, pred)
    }
}

impl Deref for Daemon {
    type Target = fakes::Daemon;

    fn deref(&self) -> &fakes::Daemon {
        &self.0
    }
}

impl DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut fakes::Daemon {
        &mut self.0
    }
}
