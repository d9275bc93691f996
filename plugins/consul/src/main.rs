//! `tributary-plugin-consul`: serves the `consul` plugin on stdin/stdout.

fn main() -> std::process::ExitCode {
    tributary_plugin_sdk::run(tributary_plugin_consul::Consul::from_env())
}
