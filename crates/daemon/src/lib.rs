//! `tributary`: the daemon binary's library. Glue only: the logic lives in the crates it joins.
//!
//! Data flow (one module per arrow that is ours):
//! binding (API/CLI → [`engine`]) → plugin call (`tributary-plugin-host`) → validate + render
//! (`tributary-core`) → batch apply (`tributary-apply`, on a blocking thread) → outcome →
//! `tributary-store` → [`http`] (JSON over HTTP, and the web UI) → [`cli`] (the `tributary` command,
//! an API client).
//!
//! - [`engine`]: per-binding refresh tasks on the schedule maths of `tributary-core`, a single
//!   apply task that collects changes that become ready close together into one
//!   `Applier::apply_batch`, and outcome recording. An error never empties an upstream: a failed
//!   resolution or an answer without valid targets never reaches the applier.
//! - [`http`]: everything served over HTTP (axum) on 127.0.0.1:9180 by default, in one router:
//!   the JSON API (bearer-token auth on everything but `/api/v1/health`), the `Host` check, the
//!   web UI (login, sessions, CSRF) and `/metrics`.
//! - [`live_api`]: the client of the module's live upstreams API (`--live-api`, issue 11).
//! - [`live_state`]: each upstream's live state (active, fails, health...) read from it, for
//!   display.
//! - [`client`]: the CLI's client of a running daemon (hyper-util's HTTP/1.1 `Client`, no TLS).
//! - [`dry_run`]: `tributary resolve`, one plugin call that touches nothing.
//! - [`resolution`]: a plugin answer validated and rendered, shared by refreshes, test
//!   resolutions and the dry run.
//! - [`settings`]: `serve --config-file`, the TOML file of serve's options.
//! - [`store_args`]: `serve --store sqlite|etcd` and the etcd options; opens the chosen store.
//! - [`token`]: API token creation and lookup (file mode 0600).
//! - [`utc`]: the UTC date and time text of a time in ms (CLI and UI formats).
//! - [`view`]: the JSON shapes of the API as data, shared by [`http`], [`engine`] and [`cli`].
#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod dry_run;
pub mod engine;
pub mod http;
pub mod live_api;
pub mod live_state;
pub mod resolution;
pub mod settings;
pub mod store_args;
pub mod tags;
pub mod token;
pub mod utc;
pub mod view;
