//! The core crate's integration tests, one binary (`--test e2e`) with one module per concern:
//! linking one test executable instead of one per file is what keeps `cargo build --tests`
//! short. nextest still runs every test in its own process; a test's name is
//! `<module>::<test>` (e.g. `render::...`). The render fixtures stay in `tests/render/`.

mod bad_input;
mod binding;
mod draft;
mod injection;
mod live_settings;
mod render;
mod schedule;
mod upstream_file;
