//! The `tributary` command line (reference: `docs/cli.md`).
//!
//! - `serve`: the daemon (engine + JSON API).
//! - `binding add|list|show|rm|refresh`: clients of a running daemon's API.
//! - `fleet hosts|forget-host`: the fleet as a whole, through the same API (`fleet.rs`).
//! - `plugin list|check`: read a plugins directory / run the conformance checker.
//! - `resolve`: a dry run that calls a plugin once and touches nothing.
//!
//! One file per concern: `serve.rs` the daemon's start-up, `binding.rs` the API client commands
//! (with `print.rs` their text output), `config.rs` the `--config KEY=VALUE|@FILE|-` values of
//! `binding add` and `resolve`, `plugin.rs` and `resolve.rs`.
//!
//! `mod.rs` holds `Cli`, `Cmd` and `main`; `client.rs` is the API client, hyper-util's pooled
//! HTTP/1.1 `Client` (the one `reqwest` runs on) without TLS.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod binding;
mod config;
mod fleet;
mod plugin;
mod print;
mod resolve;
mod serve;

/// Default API address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9180";
/// Default data folder (relative to the working directory).
pub const DEFAULT_DATA_DIR: &str = ".tributary";

#[derive(Debug, Parser)]
#[command(
    name = "tributary",
    version,
    about = "Dynamic upstreams for nginx: bind an upstream to a discovered service"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the daemon: the engine and the JSON API.
    Serve(Box<serve::ServeArgs>),
    /// Manage bindings of a running daemon (through its API).
    Binding {
        #[command(flatten)]
        api: binding::ApiArgs,
        #[command(subcommand)]
        cmd: binding::BindingCmd,
    },
    /// The fleet (etcd store) as a whole, through a running daemon's API: its hosts, and
    /// forgetting a host that is gone.
    Fleet {
        #[command(flatten)]
        api: binding::ApiArgs,
        #[command(subcommand)]
        cmd: fleet::FleetCmd,
    },
    /// Inspect plugins.
    Plugin {
        #[command(subcommand)]
        cmd: plugin::PluginCmd,
    },
    /// Dry run: call a plugin once, print what would be written; touches nothing.
    Resolve(resolve::ResolveArgs),
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    use clap::CommandFactory;
    let cli = match crate::settings::expand_args(std::env::args_os().collect(), &Cli::command()) {
        Ok(args) => Cli::parse_from(args),
        Err(e) => {
            eprintln!("tributary: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tributary: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.cmd {
            Cmd::Serve(a) => serve::run(*a).await.map(|_| ExitCode::SUCCESS),
            Cmd::Binding { api, cmd } => binding::run(api, cmd).await,
            Cmd::Fleet { api, cmd } => fleet::run(api, cmd).await,
            Cmd::Plugin { cmd } => plugin::run(cmd).await,
            Cmd::Resolve(a) => Ok(resolve::run(a).await),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tributary: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn env_path(flag: Option<PathBuf>, var: &str, default: &str) -> PathBuf {
    flag.or_else(|| std::env::var_os(var).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(default))
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
