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
//! - [`live_api`]: the client of the module's live upstreams API (`--live-api`).
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
//!
//! More: `store_args` waits a bounded time for the etcd store's first sync; `settings` places the
//! file's options before the command line's, so those override it; `resolution` keeps dropped targets
//! bounded (20 + one counting line); `live_state` reads on demand (≤ 800 ms) for `binding show`, the
//! API's `live` and the binding page, through a 5 s cache (`LiveCache`) for `/metrics`, a failed read
//! shown as its reason; `view` carries the fleet view (`fleet` in every binding) and the store state
//! (`/api/v1/store`; health stays 200, `degraded`, when only the store is unreachable), and its text
//! for a person is `cli/print.rs`'s; `tags` gives kept targets back the plugin's display tags (never
//! written to a file).
//!
//! Benchmarks (`benches/`): `scale.rs` the 1,000-binding benchmark (`BENCH_APPLY=live`: the change of
//! all of them through the module's API), `live_targets.rs` decision → visible in live mode for one
//! binding of 1 to 1,000 targets, `spread.rs` the 10,000-binding RSS and refresh-spread benchmark,
//! `fleet.rs` the fleet's store layer, `soak/` the chaos soak (`scripts/soak.sh`; its own `main`:
//! `stack.rs` nginx, backends, registry, the daemon restarted after kills; `traffic.rs` and
//! `client.rs` the clients and their errors; `faults.rs` the kills and reloads; `checks.rs` settle,
//! `nginx -t`, RSS, error log; `report.rs` which fault explains which error, the table;
//! `docs/operations.md`, "Chaos soak"). `scripts/run.sh` runs it all with a local nginx and a demo
//! binding.
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
