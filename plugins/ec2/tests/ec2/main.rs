//! The ec2 plugin's integration tests, one binary (one link): the plugin in process and under the
//! real host (`ec2`), and end to end through `tributary serve` to nginx (`e2e`).

mod e2e;
mod ec2;

use tributary_testkit::{this_plugin, PluginPackage};

const PLUGIN: PluginPackage = this_plugin!("tributary-plugin-ec2");
