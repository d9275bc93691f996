//! `tributary-plugin-ec2`: serves the `ec2` plugin on stdin/stdout.

fn main() -> std::process::ExitCode {
    tributary_plugin_sdk::run(tributary_plugin_ec2::Ec2::new(
        tributary_plugin_ec2::DEFAULT_TIMEOUT,
    ))
}
