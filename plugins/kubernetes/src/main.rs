//! `tributary-plugin-kubernetes`: serves the `kubernetes` plugin on stdin/stdout.

fn main() -> std::process::ExitCode {
    tributary_plugin_sdk::run(tributary_plugin_kubernetes::Kubernetes::new(
        tributary_plugin_kubernetes::DEFAULT_TIMEOUT,
    ))
}
