//! The plugin host's integration tests, one binary (one link), all against the real
//! `tributary-testplug` process: calls, failures and the checker (`host`), and what isolates a
//! plugin from the daemon and back (`isolation`).

mod host;
mod isolation;
