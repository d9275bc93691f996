//! The vocabulary of the apply transaction: its options, a change, what happened to it, and the
//! errors and reports of [`Applier`](super::Applier).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tributary_core::UpstreamName;

use crate::live::{NotLive, ReloadConfirm};
use crate::CommandError;

/// Options of an [`Applier`](super::Applier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Least time between two reloads; a reload due sooner waits (default 2 s).
    pub min_reload_gap: Duration,
    /// How a reload is confirmed live (new workers, see [`crate::live`]). `None`: a reload command
    /// that exits 0 counts as live (the behaviour of `nginx -s reload` alone).
    pub confirm: Option<ReloadConfirm>,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            min_reload_gap: Duration::from_secs(2),
            confirm: None,
        }
    }
}

/// New contents for one upstream file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub name: UpstreamName,
    pub bytes: Vec<u8>,
}

/// What happened to one change of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ChangeOutcome {
    /// The file already had these bytes and nginx has confirmed them live: nothing written,
    /// tested or reloaded.
    Unchanged,
    /// Written, `nginx -t` passed and the reload is confirmed live (or, without
    /// [`ApplyOptions::confirm`], the reload command exited 0).
    Applied { reloaded: bool },
    /// `nginx -t` failed with this file: the previous bytes are back (or the file is gone if there
    /// was none). `nginx_error` is nginx's own output.
    TestFailed { nginx_error: String },
    /// The test passed but the reload failed or was rejected by the master (`error` carries
    /// nginx's `[emerg]` text): the previous bytes are back and nginx was tested again; `error`
    /// says both, `cause` which way the reload failed.
    ReloadFailed { cause: ReloadCause, error: String },
    /// The file could not be written (disk full, permissions); nothing changed.
    WriteFailed { error: String },
    /// The change failed (`cause`) and the previous file could not be put back (`error`): the
    /// journal is kept, the restore is retried before the next change and at the next start.
    RestoreFailed { cause: String, error: String },
}

impl ChangeOutcome {
    /// Whether the change is on disk and live (or was already).
    pub fn is_ok(&self) -> bool {
        matches!(
            self,
            ChangeOutcome::Unchanged | ChangeOutcome::Applied { .. }
        )
    }
}

/// Which way a reload failed (the kind of [`ReloadError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReloadCause {
    /// The reload command failed (exit status, or it could not run or timed out).
    Command,
    /// The state before the signal could not be read, so no reload was sent.
    CannotConfirm,
    /// The master logged `[emerg]` and kept the old configuration.
    Rejected,
    /// No new workers within the confirmation's timeout.
    Timeout,
    /// The master exited after the signal.
    MasterGone,
}

impl ReloadCause {
    /// The cause as a word for logs and outcomes.
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadCause::Command => "command",
            ReloadCause::CannotConfirm => "cannot_confirm",
            ReloadCause::Rejected => "rejected",
            ReloadCause::Timeout => "timeout",
            ReloadCause::MasterGone => "master_gone",
        }
    }
}

/// Why a reload did not make the files live: the command failed, or the reload was not
/// confirmed ([`NotLive`]). `Display` is the text for the outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    NotLive(#[from] NotLive),
}

impl ReloadError {
    /// Which way it failed.
    pub fn cause(&self) -> ReloadCause {
        match self {
            ReloadError::Command(_) => ReloadCause::Command,
            ReloadError::NotLive(NotLive::CannotConfirm(_)) => ReloadCause::CannotConfirm,
            ReloadError::NotLive(NotLive::Rejected { .. }) => ReloadCause::Rejected,
            ReloadError::NotLive(NotLive::Timeout { .. }) => ReloadCause::Timeout,
            ReloadError::NotLive(NotLive::MasterGone { .. }) => ReloadCause::MasterGone,
        }
    }
}

/// What [`Applier::remove`](super::Applier::remove) did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RemoveOutcome {
    /// The file is gone, nginx passed the test without it and the reload is confirmed.
    Removed,
    /// There was no file.
    NotFound,
    /// nginx fails without the file (an `include` still names it): the file is kept.
    Refused { nginx_error: String },
    /// Removed and tested, but the reload failed (`cause`): the file is back.
    ReloadFailed { cause: ReloadCause, error: String },
    /// The removal failed (`cause`) and the file could not be put back (`error`); the journal is
    /// kept for the next attempt and the next start.
    RestoreFailed { cause: String, error: String },
}

impl RemoveOutcome {
    /// The message for the person when removal was refused.
    pub const REFUSED_HINT: &'static str = "remove the include line first";
}

/// Errors of [`Applier::open`](super::Applier::open), [`Applier::remove`](super::Applier::remove) and [`crate::conf_dir_from_nginx_v`].
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path} is locked by another tributary{}: only one daemon may manage a folder",
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Locked { path: PathBuf, holder: Option<u32> },
    #[error("reading the conf dir from nginx -V: {message}")]
    NginxV { message: String },
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ApplyError + '_ {
    move |source| ApplyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What [`Applier::open`](super::Applier::open) found and did about changes interrupted by a crash.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct RecoveryReport {
    /// Upstreams whose change was in flight (written, not yet confirmed).
    pub pending: Vec<UpstreamName>,
    /// They were restored to their previous bytes / removed (after a failed `nginx -t`, or a
    /// reload that was not confirmed), durably.
    pub restored: bool,
    /// nginx's output of the failed test that caused the restore.
    pub test_error: Option<String>,
    /// nginx's output if it still fails after the restore (not caused by us).
    pub still_failing: Option<String>,
    /// The test passed and nginx was reloaded to serve the interrupted changes
    /// (`Some(Err(..))`: the reload failed or was not confirmed, and the files were restored;
    /// `None`: no reload was needed or tried).
    pub reload: Option<Result<(), String>>,
    /// The restore failed for these files (journals kept; retried before the next change).
    pub restore_error: Option<String>,
}

/// How long the steps of the last [`Applier::apply_batch`](super::Applier::apply_batch) /
/// [`Applier::apply_live_batch`](super::Applier::apply_live_batch) took
/// (for logs and the live benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTimes {
    /// Writing journals and new files up to their renames, with the fsyncs before the renames
    /// (summed over the batch's stagings; neither the live path's pushes, made between the
    /// journals and the new files, nor the folder's fsync in `settle` are in it).
    pub write: Duration,
    /// Running the test command (summed; more than one run when a failure is bisected).
    pub test: Duration,
    /// How many times the test command ran.
    pub tests: u32,
    /// From the call until the tested changes were ready for the reload (on the live path: pushed,
    /// confirmed and tested when needed).
    pub ready: Duration,
}
