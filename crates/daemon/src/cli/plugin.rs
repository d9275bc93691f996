//! `tributary plugin list|check`: read a plugins directory / run the conformance checker.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use tributary_plugin_host::{HostOptions, PluginHost};

use super::{env_path, print_json};
use crate::view::PluginList;

#[derive(Debug, Subcommand)]
pub(super) enum PluginCmd {
    /// List the plugins of a directory and their providers.
    List {
        /// Plugins directory [env: TRIBUTARY_PLUGINS_DIR; default ./plugins].
        #[arg(long)]
        plugins_dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Conformance check of one plugin folder (exit 1 when a check fails).
    Check {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

pub(super) async fn run(cmd: PluginCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginCmd::List { plugins_dir, json } => {
            let dir = env_path(plugins_dir, "TRIBUTARY_PLUGINS_DIR", "plugins");
            let (host, errors) = PluginHost::load(&dir, HostOptions::default());
            let list = PluginList {
                plugins: host
                    .plugins()
                    .into_iter()
                    .map(crate::view::PluginView::from)
                    .collect(),
                errors: errors.iter().map(|e| e.to_string()).collect(),
            };
            if json {
                print_json(&list)?;
            } else {
                for p in &list.plugins {
                    println!("{} {} — {}", p.name, p.version, p.description);
                    for pr in &p.providers {
                        let fields: Vec<String> = pr
                            .configuration
                            .fields
                            .iter()
                            .map(|f| {
                                let mut s = f.key.clone();
                                if f.required {
                                    s.push('*');
                                }
                                if f.secret {
                                    s.push_str(" (secret)");
                                }
                                s
                            })
                            .collect();
                        println!(
                            "  provider {} ({}): {}",
                            pr.code,
                            pr.name,
                            fields.join(", ")
                        );
                    }
                }
                for e in &list.errors {
                    println!("refused: {e}");
                }
                if list.plugins.is_empty() && list.errors.is_empty() {
                    println!("no plugins in {}", dir.display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCmd::Check { dir, json } => plugin_check(&dir, json).await,
    }
}

async fn plugin_check(dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let report = tributary_plugin_host::check::check_plugin(dir).await;
    if json {
        print_json(&report)?;
    } else {
        print!("{report}");
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
