//! One plugin, the built binary, under the real plugin host: what the plugins' host-level tests
//! share.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tributary_plugin_host::check::{CheckReport, Outcome};
use tributary_plugin_host::{HostOptions, PluginHost, ResolveError};
use tributary_plugin_sdk::{ConfigMap, ResolveParams, ResolveResult};

use crate::daemon::plugin_folder;

/// `discovery.resolve` params from a JSON config object.
pub fn params(provider: &str, config: Value, service: &str) -> ResolveParams {
    ResolveParams {
        provider: provider.into(),
        config: serde_json::from_value::<ConfigMap>(config).expect("config is a JSON object"),
        service: service.into(),
    }
}

/// A plugins directory (a temp dir, removed on drop) holding the plugin whose source folder is
/// `plugin_src` with `executable` set to the built `bin` (see [`plugin_folder`]), loaded into a
/// [`PluginHost`] with default options. The process starts on the first call.
pub struct HostedPlugin {
    pub host: PluginHost,
    /// The plugin's name (from its manifest).
    pub name: String,
    /// The code of the manifest's first provider, used by [`HostedPlugin::resolve`].
    pub provider: String,
    folder: PathBuf,
    tmp: tempfile::TempDir,
}

impl HostedPlugin {
    /// Loads the plugin, with `conformance` written as its `conformance.json` when given.
    pub fn load(plugin_src: &Path, bin: &Path, conformance: Option<&Value>) -> HostedPlugin {
        let tmp = tempfile::tempdir().unwrap();
        let folder = plugin_folder(tmp.path(), plugin_src, bin, conformance);
        let (host, errors) = PluginHost::load(tmp.path(), HostOptions::default());
        assert!(errors.is_empty(), "{errors:?}");
        let info = host
            .plugins()
            .into_iter()
            .next()
            .expect("one plugin loaded");
        let provider = info
            .manifest
            .providers()
            .first()
            .map(|p| p.code.clone())
            .unwrap_or_default();
        HostedPlugin {
            host,
            name: info.name,
            provider,
            folder,
            tmp,
        }
    }

    /// The plugin folder (for the conformance checker).
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// The plugins directory holding [`HostedPlugin::folder`].
    pub fn plugins_dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Resolves `service` with provider [`HostedPlugin::provider`] and `config` through the host.
    pub async fn resolve(
        &self,
        config: Value,
        service: &str,
    ) -> Result<ResolveResult, ResolveError> {
        self.host
            .resolve(&self.name, params(&self.provider, config, service))
            .await
    }

    /// The plugin's stderr as the host kept it (redacted), as one debug-formatted text.
    pub fn stderr(&self) -> String {
        format!("{:?}", self.host.stderr_tail(&self.name))
    }

    /// Stops the plugin process.
    pub async fn shutdown(&self) {
        self.host.shutdown().await;
    }
}

/// The checked-in plugins directory (`plugins/`, the parent of `plugin_src`) under the real host,
/// asserting that `plugin_src`'s folder loaded: its manifest names `run.sh`, the launcher that
/// starts the binary cargo built into the target directory.
pub fn checked_in(plugin_src: &Path) -> PluginHost {
    let plugins = plugin_src.parent().expect("plugins/");
    let (host, errors) = PluginHost::load(plugins, HostOptions::default());
    assert!(!errors.iter().any(|e| e.dir() == plugin_src), "{errors:?}");
    host
}

/// Asserts the conformance `report` passed and that every check it skipped was skipped for a
/// reason containing one of `may_skip` (empty: nothing skipped).
pub fn assert_conforms(report: &CheckReport, may_skip: &[&str]) {
    assert!(report.passed(), "{report}");
    for c in &report.checks {
        if let Outcome::Skip(why) = &c.outcome {
            assert!(
                may_skip.iter().any(|m| why.contains(m)),
                "a check was skipped: {report}"
            );
        }
    }
}
