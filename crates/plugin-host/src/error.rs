//! Why loading a plugin folder or calling a plugin failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tributary_protocol::{ManifestError, RpcError};

use crate::Redactor;

/// A plugin folder that was refused at load. The others stay usable.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read plugins directory {}: {source}", dir.display())]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no plugin.json in the plugin folder", dir.display())]
    NoManifest { dir: PathBuf },
    #[error("{}: cannot read plugin.json: {source}", dir.display())]
    ReadManifest {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", dir.display())]
    Manifest { dir: PathBuf, source: ManifestError },
    #[error("{}: executable {} does not exist", dir.display(), path.display())]
    MissingExecutable { dir: PathBuf, path: PathBuf },
    #[error("{}: executable {} is not an executable file", dir.display(), path.display())]
    NotExecutable { dir: PathBuf, path: PathBuf },
    #[error("{}: plugin name {name:?} is already used by {}", dir.display(), first.display())]
    DuplicateName {
        dir: PathBuf,
        name: String,
        first: PathBuf,
    },
}

impl LoadError {
    /// The folder (or plugins directory) the error is about.
    pub fn dir(&self) -> &Path {
        match self {
            LoadError::ReadDir { dir, .. }
            | LoadError::NoManifest { dir }
            | LoadError::ReadManifest { dir, .. }
            | LoadError::Manifest { dir, .. }
            | LoadError::MissingExecutable { dir, .. }
            | LoadError::NotExecutable { dir, .. }
            | LoadError::DuplicateName { dir, .. } => dir,
        }
    }
}

/// Why a `discovery.resolve` call failed. `Display` never contains a config value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    #[error("unknown plugin {0:?}")]
    UnknownPlugin(String),
    #[error("plugin {plugin:?} has no provider {provider:?}")]
    UnknownProvider { plugin: String, provider: String },
    /// The plugin answered an error; message and data are redacted.
    #[error("plugin error: {0}")]
    Plugin(RpcError),
    #[error("no answer within {}", fmt_duration(*.0))]
    Timeout(Duration),
    /// The plugin exited while the request was in flight, or is waiting for its restart back-off.
    #[error("{0}")]
    Crashed(String),
    /// The answer was not a valid response or result (not JSON, too long, no `targets` array, ...).
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The executable could not be started.
    #[error("cannot start plugin: {0}")]
    Spawn(String),
}

impl ResolveError {
    /// The JSON-RPC error code, for errors the plugin answered.
    pub fn code(&self) -> Option<i64> {
        match self {
            ResolveError::Plugin(e) => Some(e.code),
            _ => None,
        }
    }

    /// `data.field` of an error the plugin answered (the config key at fault, or `"service"`).
    pub fn field(&self) -> Option<&str> {
        match self {
            ResolveError::Plugin(e) => e.field(),
            _ => None,
        }
    }

    pub(crate) fn redacted(self, r: &Redactor) -> Self {
        match self {
            ResolveError::Plugin(mut e) => {
                e.message = r.redact(&e.message);
                if let Some(d) = e.data.as_mut() {
                    r.redact_value(d);
                }
                ResolveError::Plugin(e)
            }
            ResolveError::Crashed(m) => ResolveError::Crashed(r.redact(&m)),
            ResolveError::Malformed(m) => ResolveError::Malformed(r.redact(&m)),
            ResolveError::Spawn(m) => ResolveError::Spawn(r.redact(&m)),
            other => other,
        }
    }
}

/// A duration as the notes and errors show it: whole seconds, else milliseconds.
pub(crate) fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
