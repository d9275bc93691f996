//! The consul plugin's integration tests, one binary (one link): the plugin in process and under the
//! real host (`consul`), and end to end through `tributary serve` to nginx (`e2e`).

mod consul;
mod e2e;

use tributary_testkit::{this_plugin, PluginPackage};

const PLUGIN: PluginPackage = this_plugin!("tributary-plugin-consul");
