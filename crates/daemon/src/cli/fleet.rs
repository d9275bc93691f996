//! `tributary fleet hosts|forget-host`: clients of a running daemon's API for the fleet as a
//! whole (`docs/fleet.md`, "What to watch" and "Forgetting a host").

use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;
use hyper::Method;

use super::binding::{client, finish, ApiArgs};
use super::print_json;
use crate::client::Client;
use crate::view::{FleetHosts, ForgetHostResponse};

#[derive(Debug, Subcommand)]
pub(super) enum FleetCmd {
    /// Every host of the fleet: alive or not, resolver claims held, bindings it is behind; and
    /// the bindings whose set is older than 3 intervals.
    Hosts,
    /// Remove what a host that is gone left in the store (its outcomes and markers), so that it
    /// leaves every host's fleet view. Refused while the host is alive.
    ForgetHost {
        /// The host's id (its --host-id).
        host: String,
        /// Also when its heartbeat is alive: its session lease is revoked first (its claims go
        /// to the other hosts at once). A daemon that is in fact running comes back with a new
        /// session: stop it first.
        #[arg(long)]
        force: bool,
    },
}

pub(super) async fn run(api: ApiArgs, cmd: FleetCmd) -> anyhow::Result<ExitCode> {
    let c = client(&api)?;
    let result = run_inner(&c, api.json, cmd).await;
    finish(&api, result)
}

/// Host ids go into URL paths: refused when they hold a character that would need escaping.
fn host_segment(host: &str) -> anyhow::Result<&str> {
    if host.is_empty()
        || host.len() > 253
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@'))
    {
        bail!("{host:?} is not a host id this command can send (letters, digits, _ - . : @)");
    }
    Ok(host)
}

async fn run_inner(c: &Client, json: bool, cmd: FleetCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        FleetCmd::Hosts => {
            let v: FleetHosts = c
                .call::<(), _>(Method::GET, "/api/v1/fleet/hosts", None)
                .await?;
            if json {
                print_json(&v)?;
                return Ok(ExitCode::SUCCESS);
            }
            println!("store {}, this host {}", v.store, v.host_id);
            for h in &v.hosts {
                println!(
                    "{:<24} {:<8} resolves {:>5}  behind on {:>5}{}",
                    h.host,
                    if h.alive { "alive" } else { "gone" },
                    h.resolves,
                    h.behind_bindings,
                    if h.behind.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", h.behind.join(", "))
                    }
                );
            }
            let old: Vec<String> = v
                .bindings
                .iter()
                .filter(|b| {
                    b.set_age_seconds
                        .is_some_and(|a| a > 3.0 * b.interval_secs as f64)
                })
                .map(|b| {
                    format!(
                        "{} ({:.0} s, resolver {})",
                        b.name,
                        b.set_age_seconds.unwrap_or(0.0),
                        b.resolver.as_deref().unwrap_or("none")
                    )
                })
                .collect();
            if !old.is_empty() {
                println!(
                    "not resolved for 3 intervals as far as this host knows: {}",
                    old.join(", ")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        FleetCmd::ForgetHost { host, force } => {
            let path = format!(
                "/api/v1/fleet/hosts/{}{}",
                host_segment(&host)?,
                if force { "?force=true" } else { "" }
            );
            let r: ForgetHostResponse = c.call::<(), _>(Method::DELETE, &path, None).await?;
            if json {
                print_json(&r)?;
            } else {
                println!(
                    "forgot host {}: {} keys deleted{}",
                    r.host,
                    r.keys_deleted,
                    if r.session_ended {
                        "; its live session was ended (--force)"
                    } else {
                        ""
                    }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
