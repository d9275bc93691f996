//! Runs Tributary discovery plugins.
//!
//! [`PluginHost::load`] reads a plugins directory (one folder per plugin, each with a `plugin.json`),
//! reports bad manifests and keeps the rest. Each plugin's executable is started once, lazily, on the
//! first call, and kept running; JSON-RPC 2.0 messages travel as one JSON object per line on its
//! stdin/stdout. Requests may be concurrent and are matched by `id`; each waits at most
//! [`HostOptions::timeout`]. A plugin that exits fails the requests in flight ([`ResolveError::Crashed`])
//! and is started again on a later call, after a back-off that doubles with each consecutive crash.
//! Lines over [`HostOptions::max_line`] and lines that are not JSON fail only the request they answer
//! (found by a tolerant scan for the `id`, or the single request in flight), never the others.
//! Stderr is the plugin's log: kept as the last [`HostOptions::stderr_lines`] lines, with every config
//! value ever sent to the plugin redacted before it is stored.
//!
//! Every config value is secret: no `Display` of this crate contains one (plugin error messages are
//! redacted), and nothing here logs them.
//!
//! [`check::check_plugin`] is the conformance checker behind `tributary plugin check DIR`.
//!
//! The vocabulary is here and in `error`; the steps each have a module:
//! - `load`: reading the plugins directory into [`PluginHost`] (manifests, executables, the
//!   environment each plugin will get);
//! - `host`: dispatch, [`PluginHost::resolve`] sending one call and reading its answer;
//! - `supervise`: the per-plugin slot and its process's life (start after the back-off, kill after
//!   too many timeouts, shutdown);
//! - `conn`: one running process (stdin writer, stdout reader matching answers to calls, stderr log);
//! - `lines`, `redact`: bounded line reading, the tolerant `id` scan, config redaction.
//!
//! Each process starts with a clean environment (`PATH`, `LANG`, `TZ`, a private `HOME` under
//! [`HostOptions::home_root`], plus the manifest's `environment` list); at most
//! [`HostOptions::max_concurrent`] calls are in flight per plugin (a semaphore; waiting is not
//! timed); a process is killed after `max_timeouts` timeouts in a row or when a request line could
//! not be written whole (`conn.rs` `Sending`). `conn` runs one reader task per process with a pending
//! map of oneshots; lines are bounded to 4 MiB. `src/bin/tributary-testplug.rs` is a plugin that
//! misbehaves on purpose for the tests.

pub mod check;
mod conn;
mod error;
mod host;
mod lines;
mod load;
mod redact;
mod supervise;

use std::path::PathBuf;
use std::time::Duration;

pub use error::{LoadError, ResolveError};
pub use host::PluginHost;
pub use load::{executable_path, PluginInfo};
pub use redact::{Redactor, MIN_SECRET_LEN, REDACTED};

/// Name of the manifest file in a plugin's folder.
pub const MANIFEST_FILE: &str = "plugin.json";

/// Tunables of the host. `Default` gives the production values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostOptions {
    /// How long one `discovery.resolve` may take (default 30 s).
    pub timeout: Duration,
    /// Longest accepted stdout line in bytes, without the `\n` (default 4 MiB).
    pub max_line: usize,
    /// How many stderr lines are kept per plugin (default 200). Each line is cut at 4 KiB.
    pub stderr_lines: usize,
    /// Wait before restarting a plugin after its first crash (default 1 s); doubles per consecutive
    /// crash, reset by a successful answer.
    pub restart_backoff: Duration,
    /// Cap of the restart back-off (default 60 s).
    pub restart_backoff_max: Duration,
    /// How long [`PluginHost::shutdown`] lets a plugin exit after closing its stdin before killing
    /// it (default 2 s).
    pub shutdown_grace: Duration,
    /// After this many calls in a row without an answer in time (default 3), the process is killed
    /// and restarted after the restart back-off. Any answer resets the count.
    pub max_timeouts: u32,
    /// Calls in flight to one plugin at most (default 16); further calls wait for a free place
    /// before their timeout starts. At least 1.
    pub max_concurrent: usize,
    /// Folder holding each plugin's private `HOME` (`<home_root>/<plugin name>`, mode 0700,
    /// created when missing). `None`: a temporary folder the host removes when dropped.
    pub home_root: Option<PathBuf>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_line: 4 * 1024 * 1024,
            stderr_lines: 200,
            restart_backoff: Duration::from_secs(1),
            restart_backoff_max: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(2),
            max_timeouts: 3,
            max_concurrent: 16,
            home_root: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_send_sync() {
        fn is<T: Send + Sync>() {}
        is::<PluginHost>();
        is::<ResolveError>();
    }
}
