//! The daemon's integration tests, one binary (`--test e2e`) with one module per concern (as
//! ripgrep does): linking one test executable instead of one per file is what keeps
//! `cargo build --tests` short. nextest still runs every test in its own process; a test's name
//! is `<module>::<test>` (e.g. `live::...`). `common` is the shared harness (daemon runner,
//! fleet and live-API helpers); a module that needs a helper of its own keeps it beside itself
//! (`rolling/load.rs`).

mod common;

mod abuse;
mod browser_ui;
mod daemon;
mod drain;
mod failures;
mod fleet;
mod fleet_bulk;
mod fleet_claims;
mod fleet_cluster;
mod fleet_engine;
mod fleet_integrity;
mod fleet_ops;
mod fleet_outage;
mod fleet_restore;
mod isolation;
mod jitter;
mod live;
mod live_state;
mod regions;
mod reload;
mod resolve_cli;
mod rolling;
mod server_stats;
mod web;
