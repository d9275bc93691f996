//! The discovery plugin a plugin package's tests check: its built executable and its source folder
//! (`plugin.json`, `conformance.json`), from the package's own build, so that no test file writes
//! its own `bin()` and `source_dir()`.

use std::path::Path;

/// A plugin package under test. Made by [`this_plugin!`](crate::this_plugin) in the package's test
/// files, usually as a `const`:
///
/// ```ignore
/// const PLUGIN: tributary_testkit::PluginPackage = tributary_testkit::this_plugin!("tributary-plugin-file");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginPackage {
    bin: &'static str,
    source_dir: &'static str,
}

impl PluginPackage {
    /// Use [`this_plugin!`](crate::this_plugin), which fills both from the test's build.
    #[doc(hidden)]
    pub const fn new(bin: &'static str, source_dir: &'static str) -> Self {
        Self { bin, source_dir }
    }

    /// The plugin's executable as cargo built it for this test run.
    pub fn bin(&self) -> &'static Path {
        Path::new(self.bin)
    }

    /// The plugin's source folder (the package root: `plugin.json`, `conformance.json`).
    pub fn source_dir(&self) -> &'static Path {
        Path::new(self.source_dir)
    }
}

/// The [`PluginPackage`] of the package whose test this is; `$exe` names its binary target
/// (`"tributary-plugin-file"`). Works only in that package's integration tests, where cargo
/// sets `CARGO_BIN_EXE_<name>`.
#[macro_export]
macro_rules! this_plugin {
    ($exe:literal) => {
        $crate::PluginPackage::new(
            env!(concat!("CARGO_BIN_EXE_", $exe)),
            env!("CARGO_MANIFEST_DIR"),
        )
    };
}
