//! The apply transaction over `<conf dir>/upstreams/`.
//!
//! On-disk protocol (all names start with `.` and never end in `.conf`, so `include upstreams/*.conf;`
//! never sees them):
//! - `.tributary.lock` — `flock`ed for the Applier's lifetime; holds the owner's pid for messages.
//! - `.<name>.conf.prev` / `.<name>.conf.none` — the journal of a change in flight: the previous
//!   bytes (with the file's permissions), or "there was no file". `.prev` is a hard link to the
//!   file as it was (the new bytes go to a new file renamed over it, so the old one is never
//!   written again), else a copy written atomically and fsynced; either is durable (folder
//!   fsynced) *before* `<name>.conf` changes. Undoing a change renames `.prev` back over the file (no new
//!   write, so it works on a full disk) or removes the new file; `.none` is removed only once that is
//!   durable (folder fsynced). A journal found at open means a crash between write and the end of
//!   the transaction: [`Applier::open`] tests nginx and restores every journaled file when the test
//!   fails.
//! - `.<name>.conf.tmp-<pid>-<n>` — temp files of atomic writes, recognised by that whole suffix;
//!   left-overs are removed at open.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tributary_core::UpstreamName;

use crate::fsutil::read_optional;
use crate::nginx::Nginx;

mod outcome;
mod push;
mod recovery;
mod stage;
mod steps;

use outcome::io_err;
pub use outcome::{
    ApplyError, ApplyOptions, Change, ChangeOutcome, RecoveryReport, ReloadCause, ReloadError,
    RemoveOutcome, StepTimes,
};
pub use push::{Push, UndoError};
use stage::{Pending, Unrestored, JOURNAL_NONE, JOURNAL_PREV};

/// Name of the lock file inside `upstreams/`.
pub const LOCK_FILE: &str = ".tributary.lock";

/// The outcome recorded so far per upstream of a batch.
type Outcomes = HashMap<UpstreamName, ChangeOutcome>;

/// The serialised apply transaction over one `upstreams/` folder. Holds the lock file while alive.
pub struct Applier {
    upstreams: PathBuf,
    nginx: Box<dyn Nginx>,
    opts: ApplyOptions,
    _lock: File,
    last_reload: Option<Instant>,
    recovery: RecoveryReport,
    /// The bytes nginx has confirmed live per upstream (`None`: confirmed without a file). An
    /// upstream missing here is unknown: its next change is applied even if the bytes on disk
    /// are equal.
    live: HashMap<UpstreamName, Option<Vec<u8>>>,
    /// Upstreams whose live bytes passed the test command run by this Applier (or came from such
    /// bytes by a push the caller had not tested, [`Self::apply_live_batch`]); files found at open
    /// are not in it.
    tested: HashSet<UpstreamName>,
    /// Changes whose restore failed; their journals are on disk. Retried before each operation.
    unrestored: Vec<Pending>,
    /// The step times of the last batch.
    steps: StepTimes,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("upstreams", &self.upstreams)
            .field("opts", &self.opts)
            .field("last_reload", &self.last_reload)
            .finish_non_exhaustive()
    }
}

impl Applier {
    /// Creates `conf_dir/upstreams/` if needed, takes its lock file (a second Applier on the same
    /// folder fails with [`ApplyError::Locked`]) and recovers changes a crash left in flight.
    /// The files on disk after recovery are taken as live, except those recovery restored.
    pub fn open(
        conf_dir: &Path,
        nginx: Box<dyn Nginx>,
        opts: ApplyOptions,
    ) -> Result<Applier, ApplyError> {
        let upstreams = conf_dir.join("upstreams");
        fs::create_dir_all(&upstreams).map_err(io_err(&upstreams))?;
        let lock_path = upstreams.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let mut text = String::new();
                let _ = lock.read_to_string(&mut text);
                return Err(ApplyError::Locked {
                    path: lock_path,
                    holder: text.trim().parse().ok(),
                });
            }
            Err(e) => return Err(io_err(&lock_path)(e.into())),
        }
        let write_pid = |lock: &mut File| -> io::Result<()> {
            lock.set_len(0)?;
            lock.seek(SeekFrom::Start(0))?;
            writeln!(lock, "{}", std::process::id())?;
            lock.sync_all()
        };
        write_pid(&mut lock).map_err(io_err(&lock_path))?;
        let mut applier = Applier {
            upstreams,
            nginx,
            opts,
            _lock: lock,
            last_reload: None,
            recovery: RecoveryReport::default(),
            live: HashMap::new(),
            tested: HashSet::new(),
            unrestored: Vec::new(),
            steps: StepTimes::default(),
        };
        applier.recover()?;
        applier.live = applier.files_on_disk()?;
        for p in &applier.unrestored {
            applier.live.remove(&p.name);
        }
        if applier.recovery.restored {
            // nginx may run the interrupted change (a reload that landed, a set pushed live)
            // while the files are back: the next change of these upstreams reloads.
            for name in &applier.recovery.pending {
                applier.live.remove(name);
            }
        }
        Ok(applier)
    }

    /// The folder the files live in: `<conf dir>/upstreams`.
    pub fn upstreams_dir(&self) -> &Path {
        &self.upstreams
    }

    /// The path of an upstream's file.
    pub fn path_of(&self, name: &UpstreamName) -> PathBuf {
        self.upstreams.join(name.file_name())
    }

    /// What crash recovery found at open.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The bytes on disk for `name`, `None` when there is no file (or it cannot be read).
    pub fn read_current(&self, name: &UpstreamName) -> Option<Vec<u8>> {
        read_optional(&self.path_of(name)).ok().flatten()
    }

    /// Whether nginx has confirmed `bytes` live for `name` (the last confirmed reload with this
    /// upstream in it, or the file found at open).
    pub fn is_live(&self, name: &UpstreamName, bytes: &[u8]) -> bool {
        matches!(self.live.get(name), Some(Some(b)) if b == bytes)
    }

    /// The bytes nginx has confirmed live for `name` (`None`: unknown, or confirmed without a file).
    pub fn live_bytes(&self, name: &UpstreamName) -> Option<&[u8]> {
        self.live.get(name).and_then(|b| b.as_deref())
    }

    /// Whether the bytes live for `name` passed the test command run by this Applier (see
    /// [`Self::apply_live_batch`]'s `test`).
    pub fn tested(&self, name: &UpstreamName) -> bool {
        self.tested.contains(name)
    }

    /// Forgets what nginx runs for `name`: its next change is applied even if the bytes on disk
    /// are equal, and counts as untested.
    fn forget_live(&mut self, name: &UpstreamName) {
        self.live.remove(name);
        self.tested.remove(name);
    }

    /// Notes `bytes` as live for `name`, tested (every caller has a passed test behind it).
    fn note_live(&mut self, name: &UpstreamName, bytes: Option<Vec<u8>>) {
        self.live.insert(name.clone(), bytes);
        self.tested.insert(name.clone());
    }

    /// How long the steps of the last batch took.
    pub fn last_steps(&self) -> StepTimes {
        self.steps
    }

    /// Applies a batch: files whose bytes are on disk and confirmed live are left alone; the
    /// others are written atomically, tested together with one `nginx -t` and, if it passes,
    /// made live with one confirmed reload. When the test fails, the culprits are found by testing
    /// halves of the batch (bisection), restored and reported with nginx's message; the others are
    /// applied with one reload.
    ///
    /// Returns one outcome per distinct name, in the order names first appear; when a name
    /// appears twice, its last change is used.
    pub fn apply_batch(&mut self, changes: &[Change]) -> Vec<(UpstreamName, ChangeOutcome)> {
        self.apply_changes(changes, None)
            .into_iter()
            .map(|(n, o, _)| (n, o))
            .collect()
    }

    /// The live path: like [`Self::apply_batch`], but a change is made live by `push`
    /// (the module's API: PUT the set, GET it back and compare) instead of a reload. The push runs
    /// once the files are written, before `nginx -t` tests them, and stands only if the test
    /// passes; when it fails,
    /// the pushes are undone and the batch goes the way of [`Self::apply_batch`] (restored,
    /// culprits found by bisection, the good ones pushed after their test). Changes `push` refuses
    /// (`Err(why)`) fall back together to one confirmed reload (or are restored if it fails).
    /// Returns per distinct name its outcome and, for changes that took the reload path, why live
    /// failed (`None`: made live by `push`, or not applied at all). The journal is removed only
    /// once the test passed (or was not needed) and `push` confirmed the change, or the reload did.
    ///
    /// `test: false` is the caller's word that these changes cannot fail the test — nothing but
    /// values the caller has checked by nginx's rules differ from the live bytes (the daemon: the
    /// servers' addresses and weights). The test is then skipped when every change's live bytes
    /// passed a test of this Applier ([`Self::tested`]), else it runs as with `test: true`.
    pub fn apply_live_batch(
        &mut self,
        changes: &[Change],
        push: &mut dyn Push,
        test: bool,
    ) -> Vec<(
        UpstreamName,
        ChangeOutcome,
        Option<tributary_core::NeedsReload>,
    )> {
        self.apply_changes(changes, Some((push, test)))
    }

    /// Removes `name`'s file, but only if nginx still passes the test without it; then reloads.
    pub fn remove(&mut self, name: &UpstreamName) -> Result<RemoveOutcome, ApplyError> {
        if let Some((_, error)) = self.retry_restores().into_iter().find(|(n, _)| n == name) {
            return Ok(RemoveOutcome::RestoreFailed {
                cause: "an earlier failed change of this file is not undone yet".into(),
                error,
            });
        }
        let path = self.path_of(name);
        let Some(previous) = read_optional(&path).map_err(io_err(&path))? else {
            self.live.insert(name.clone(), None);
            self.tested.remove(name);
            return Ok(RemoveOutcome::NotFound);
        };
        let pending = vec![Pending {
            name: name.clone(),
            previous: Some(previous),
            new: None,
        }];
        let staged = match self.stage(pending, &mut |_| {}) {
            Ok(staged) => staged,
            Err((_, e, unrestored)) => {
                return match unrestored.into_iter().next() {
                    Some((_, error)) => Ok(RemoveOutcome::RestoreFailed {
                        cause: format!("removing {}: {e}", path.display()),
                        error,
                    }),
                    None => Err(io_err(&path)(e)),
                }
            }
        };
        if let Err(e) = self.nginx.test() {
            if let Err(unrestored) = self.unstage(&staged) {
                return Ok(RemoveOutcome::RestoreFailed {
                    cause: e.output().to_string(),
                    error: join_errors(&unrestored),
                });
            }
            // Is the file really the reason? If nginx fails with it too, the fault is elsewhere.
            let nginx_error = match self.nginx.test() {
                Ok(()) => format!("{}\n({})", e.output(), RemoveOutcome::REFUSED_HINT),
                Err(_) => format!(
                    "{}\n(nginx -t fails with and without the file; fix the configuration first)",
                    e.output()
                ),
            };
            return Ok(RemoveOutcome::Refused { nginx_error });
        }
        match self.reload_or_undo(&staged) {
            Ok(()) => Ok(RemoveOutcome::Removed),
            Err((cause, error, unrestored)) => Ok(match unrestored.into_iter().next() {
                Some((_, e)) => RemoveOutcome::RestoreFailed {
                    cause: error,
                    error: e,
                },
                None => RemoveOutcome::ReloadFailed { cause, error },
            }),
        }
    }
}

fn join_errors(list: &[(UpstreamName, String)]) -> String {
    list.iter()
        .map(|(n, e)| format!("{n}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}
