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
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use tributary_core::UpstreamName;

use crate::fsutil::{
    link_replace, read_optional, remove_if_exists, remove_temps, rename_temps, sync_dir,
    write_many, write_temps, Item,
};
use crate::live::ReloadConfirm;
use crate::nginx::Nginx;

mod push;
mod recovery;

pub use push::Push;

/// Name of the lock file inside `upstreams/`.
pub const LOCK_FILE: &str = ".tributary.lock";
const JOURNAL_PREV: &str = ".conf.prev";
const JOURNAL_NONE: &str = ".conf.none";

/// Options of an [`Applier`].
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
    /// says both.
    ReloadFailed { error: String },
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

/// What [`Applier::remove`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RemoveOutcome {
    /// The file is gone, nginx passed the test without it and the reload is confirmed.
    Removed,
    /// There was no file.
    NotFound,
    /// nginx fails without the file (an `include` still names it): the file is kept.
    Refused { nginx_error: String },
    /// Removed and tested, but the reload failed: the file is back.
    ReloadFailed { error: String },
    /// The removal failed (`cause`) and the file could not be put back (`error`); the journal is
    /// kept for the next attempt and the next start.
    RestoreFailed { cause: String, error: String },
}

impl RemoveOutcome {
    /// The message for the person when removal was refused.
    pub const REFUSED_HINT: &'static str = "remove the include line first";
}

/// Errors of [`Applier::open`], [`Applier::remove`] and [`crate::conf_dir_from_nginx_v`].
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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ApplyError + '_ {
    move |source| ApplyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What [`Applier::open`] found and did about changes interrupted by a crash.
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

/// One change in flight.
#[derive(Debug, Clone)]
struct Pending {
    name: UpstreamName,
    previous: Option<Vec<u8>>,
    new: Option<Vec<u8>>,
}

/// What [`Applier::stage`] runs once the journals of its changes exist (the live path pushes
/// there, [`push`]).
type Journaled<'a> = dyn FnMut(&[Pending]) + 'a;

/// Restores that failed: upstream name → why.
type Unrestored = Vec<(UpstreamName, String)>;

/// How long the steps of the last [`Applier::apply_batch`] / [`Applier::apply_live_batch`] took
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

    /// The live path (issue 11): like [`Self::apply_batch`], but a change is made live by `push`
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
    ) -> Vec<(UpstreamName, ChangeOutcome, Option<String>)> {
        self.apply_changes(changes, Some((push, test)))
    }

    /// The one body of [`Self::apply_batch`] (`push` = `None`: every tested change goes by reload)
    /// and [`Self::apply_live_batch`].
    fn apply_changes(
        &mut self,
        changes: &[Change],
        push: Option<(&mut dyn Push, bool)>,
    ) -> Vec<(UpstreamName, ChangeOutcome, Option<String>)> {
        let started = Instant::now();
        self.steps = StepTimes::default();
        let mut order: Vec<UpstreamName> = Vec::new();
        let mut latest: HashMap<&UpstreamName, &Change> = HashMap::new();
        for c in changes {
            if latest.insert(&c.name, c).is_none() {
                order.push(c.name.clone());
            }
        }
        let mut outcomes: HashMap<UpstreamName, ChangeOutcome> = HashMap::new();
        let mut why_reload: HashMap<UpstreamName, String> = HashMap::new();
        let stuck = self.retry_restores();
        let mut pending = Vec::new();
        for name in &order {
            let change = latest[name];
            if let Some(error) = stuck.iter().find(|(n, _)| n == name).map(|(_, e)| e) {
                outcomes.insert(
                    name.clone(),
                    ChangeOutcome::RestoreFailed {
                        cause: "an earlier failed change of this file is not undone yet".into(),
                        error: error.clone(),
                    },
                );
                continue;
            }
            match read_optional(&self.path_of(name)) {
                Err(e) => {
                    outcomes.insert(
                        name.clone(),
                        ChangeOutcome::WriteFailed {
                            error: e.to_string(),
                        },
                    );
                }
                Ok(Some(current)) if current == change.bytes && self.is_live(name, &current) => {
                    outcomes.insert(name.clone(), ChangeOutcome::Unchanged);
                }
                Ok(previous) => pending.push(Pending {
                    name: name.clone(),
                    previous,
                    new: Some(change.bytes.clone()),
                }),
            }
        }
        let (mut push, test) = match push {
            Some((push, test)) => (Some(push), test),
            None => (None, true),
        };
        let accepted: Vec<(Pending, Option<Result<(), String>>)> = match push.as_deref_mut() {
            Some(push) => {
                let test = test || pending.iter().any(|p| !self.tested(&p.name));
                self.push_then_test(pending, &latest, push, test, &mut outcomes)
            }
            None => self
                .stage_and_isolate(pending, &mut outcomes, true)
                .into_iter()
                .map(|p| (p, None))
                .collect(),
        };
        self.steps.ready = started.elapsed();
        let mut reload = Vec::new();
        let mut done = Vec::new();
        for (p, pushed) in accepted {
            let result = match (pushed, push.as_deref_mut()) {
                (Some(result), _) => result,
                // Tested on its own after the batch failed: its file is in place, so the push
                // can be confirmed right away.
                (None, Some(push)) => push
                    .push(latest[&p.name])
                    .and_then(|()| push.confirm(latest[&p.name])),
                (None, None) => {
                    reload.push(p);
                    continue;
                }
            };
            match result {
                Ok(()) => {
                    outcomes.insert(p.name.clone(), ChangeOutcome::Applied { reloaded: false });
                    done.push(p);
                }
                Err(why) => {
                    why_reload.insert(p.name.clone(), why);
                    reload.push(p);
                }
            }
        }
        if !done.is_empty() {
            self.settle(&done);
            for p in &done {
                self.note_live(&p.name, p.new.clone());
            }
        }
        if !reload.is_empty() {
            match self.reload_or_undo(&reload) {
                Ok(()) => {
                    for p in &reload {
                        outcomes.insert(p.name.clone(), ChangeOutcome::Applied { reloaded: true });
                    }
                }
                Err((error, unrestored)) => {
                    for p in &reload {
                        let o = match unrestored.iter().find(|(n, _)| n == &p.name) {
                            Some((_, e)) => ChangeOutcome::RestoreFailed {
                                cause: error.clone(),
                                error: e.clone(),
                            },
                            None => ChangeOutcome::ReloadFailed {
                                error: error.clone(),
                            },
                        };
                        outcomes.insert(p.name.clone(), o);
                    }
                }
            }
        }
        order
            .into_iter()
            .map(|n| {
                let o = outcomes.remove(&n).unwrap_or(ChangeOutcome::WriteFailed {
                    error: "internal: no outcome recorded".into(),
                });
                let why = why_reload.remove(&n);
                (n, o, why)
            })
            .collect()
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
            Err((error, unrestored)) => Ok(match unrestored.into_iter().next() {
                Some((_, e)) => RemoveOutcome::RestoreFailed {
                    cause: error,
                    error: e,
                },
                None => RemoveOutcome::ReloadFailed { error },
            }),
        }
    }

    // ---- transaction steps -------------------------------------------------------------

    /// Stages `pending`, tests, and when the test fails finds the bad ones by bisection.
    /// Returns the changes left staged (tested good); failures go to `outcomes`.
    fn stage_and_isolate(
        &mut self,
        pending: Vec<Pending>,
        outcomes: &mut HashMap<UpstreamName, ChangeOutcome>,
        check_baseline: bool,
    ) -> Vec<Pending> {
        if pending.is_empty() {
            return pending;
        }
        let staged = self.stage_recording(pending, outcomes, &mut |_| {});
        if staged.is_empty() {
            return staged;
        }
        match self.timed_test() {
            Ok(()) => staged,
            Err(err) => self.isolate(staged, err, outcomes, check_baseline),
        }
    }

    /// After `staged` failed the test with `err`: restores them and finds the bad ones by
    /// bisection (a single change is the culprit). Returns the changes left staged (tested good).
    fn isolate(
        &mut self,
        staged: Vec<Pending>,
        err: crate::CommandError,
        outcomes: &mut HashMap<UpstreamName, ChangeOutcome>,
        check_baseline: bool,
    ) -> Vec<Pending> {
        let failed = |nginx_error: String| ChangeOutcome::TestFailed { nginx_error };
        let staged = match self.unstage(&staged) {
            Ok(()) => staged,
            Err(unrestored) => {
                // A file that could not be put back leaves the bisection: its bytes failed the test.
                let (stuck, rest): (Vec<Pending>, Vec<Pending>) = staged
                    .into_iter()
                    .partition(|p| unrestored.iter().any(|(n, _)| n == &p.name));
                for p in stuck {
                    let error = unrestored
                        .iter()
                        .find(|(n, _)| n == &p.name)
                        .map(|(_, e)| e.clone())
                        .unwrap_or_default();
                    outcomes.insert(
                        p.name,
                        ChangeOutcome::RestoreFailed {
                            cause: err.output().to_string(),
                            error,
                        },
                    );
                }
                rest
            }
        };
        if staged.is_empty() {
            return staged;
        }
        if staged.len() == 1 {
            for p in staged {
                outcomes.insert(p.name, failed(err.output().to_string()));
            }
            return Vec::new();
        }
        // Does nginx pass without any of them? If not, the fault is not in this batch. (Deeper
        // levels need not ask: what is staged there has passed a test already.)
        if let Err(base) = if check_baseline {
            self.timed_test()
        } else {
            Ok(())
        } {
            let msg = format!(
                "{}\n(nginx -t fails even without this change)",
                base.output()
            );
            for p in staged {
                outcomes.insert(p.name, failed(msg.clone()));
            }
            return Vec::new();
        }
        let mut staged = staged;
        let right = staged.split_off(staged.len() / 2);
        let mut accepted = self.stage_and_isolate(staged, outcomes, false);
        accepted.extend(self.stage_and_isolate(right, outcomes, false));
        accepted
    }

    /// The test command, its time added to [`StepTimes::test`].
    fn timed_test(&mut self) -> Result<(), crate::CommandError> {
        let t0 = Instant::now();
        let r = self.nginx.test();
        self.steps.test += t0.elapsed();
        self.steps.tests += 1;
        r
    }

    /// Like [`Self::stage`], recording write (and restore) failures as outcomes.
    fn stage_recording(
        &mut self,
        pending: Vec<Pending>,
        outcomes: &mut HashMap<UpstreamName, ChangeOutcome>,
        journaled: &mut Journaled<'_>,
    ) -> Vec<Pending> {
        let mut remaining = pending;
        loop {
            match self.stage(remaining, journaled) {
                Ok(staged) => return staged,
                Err((rest, e, unrestored)) => {
                    // `stage` undid everything it could; the failing one is first.
                    let mut rest = rest;
                    let bad = rest.remove(0);
                    outcomes.insert(
                        bad.name,
                        ChangeOutcome::WriteFailed {
                            error: e.to_string(),
                        },
                    );
                    for (name, error) in &unrestored {
                        outcomes.insert(
                            name.clone(),
                            ChangeOutcome::RestoreFailed {
                                cause: format!("writing the batch failed: {e}"),
                                error: error.clone(),
                            },
                        );
                    }
                    rest.retain(|p| !unrestored.iter().any(|(n, _)| n == &p.name));
                    remaining = rest;
                }
            }
        }
    }

    /// Writes journals then new contents; `journaled` runs once the journals exist, before any
    /// new byte is written (its time is not counted as the write's). On an IO error everything in
    /// `pending` is put back as it was and the list is returned with the failing change first,
    /// plus the restores that failed.
    #[allow(clippy::type_complexity)]
    fn stage(
        &mut self,
        pending: Vec<Pending>,
        journaled: &mut Journaled<'_>,
    ) -> Result<Vec<Pending>, (Vec<Pending>, io::Error, Unrestored)> {
        let t0 = Instant::now();
        let mut hook = Duration::ZERO;
        let dir = self.upstreams.clone();
        let result = (|| -> Result<(), (usize, io::Error)> {
            // 1. journals: the previous bytes, or an empty ".none" marker. Durable before step 2.
            // The previous bytes are the file itself, so the journal is a hard link to it: no copy
            // to write and fsync, one disk flush less per change (the copy where linking fails).
            let mut journals: Vec<Item<'_>> = Vec::with_capacity(pending.len());
            let mut journal_index: Vec<usize> = Vec::with_capacity(pending.len());
            for (i, p) in pending.iter().enumerate() {
                let (prev, none) = self.journal_paths(&p.name);
                let (stale, entry) = match &p.previous {
                    Some(bytes) => (
                        none,
                        Item {
                            name: file_name(&prev),
                            bytes: bytes.as_slice(),
                            mode_of: p.name.file_name(),
                        },
                    ),
                    None => (prev, Item::new(file_name(&none), &b""[..])),
                };
                remove_if_exists(&stale).map_err(|e| (i, e))?;
                if p.previous.is_some()
                    && link_replace(&dir, &p.name.file_name(), &entry.name).is_ok()
                {
                    continue;
                }
                journals.push(entry);
                journal_index.push(i);
            }
            write_many(&dir, &journals).map_err(|(k, e)| (journal_index[k], e))?;
            let t_hook = Instant::now();
            journaled(&pending);
            hook += t_hook.elapsed();
            // 2. the new contents in durable temp files, while the folder is synced for the
            // journals' names: both must be on disk before any file changes (a journal before its
            // file, a file's bytes before its name points to them), not one before the other, so
            // the two fsyncs run at once (ext4 serves both with one journal commit).
            let mut writes: Vec<Item<'_>> = Vec::new();
            let mut write_index: Vec<usize> = Vec::new();
            for (i, p) in pending.iter().enumerate() {
                if let Some(bytes) = &p.new {
                    writes.push(Item::new(p.name.file_name(), bytes.as_slice()));
                    write_index.push(i);
                }
            }
            let (temps, journaled) = std::thread::scope(|s| {
                let journaled = s.spawn(|| sync_dir(&dir));
                let temps = write_temps(&dir, &writes);
                let journaled = journaled
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("the fsync thread panicked")));
                (temps, journaled)
            });
            let temps = temps.map_err(|(k, e)| (write_index[k], e))?;
            if let Err(e) = journaled {
                remove_temps(&temps);
                return Err((0, e));
            }
            // 3. the renames and removals. The folder is not synced here: nginx -t and the push or
            // reload read the files, not the disk; the folder is synced before any journal goes
            // ([`Self::settle`]), so a crash before that finds the journal and undoes the change.
            for (i, p) in pending.iter().enumerate() {
                if p.new.is_none() {
                    if let Err(e) = remove_if_exists(&self.path_of(&p.name)) {
                        remove_temps(&temps);
                        return Err((i, e));
                    }
                }
            }
            rename_temps(&dir, &writes, &temps).map_err(|(k, e)| (write_index[k], e))
        })();
        self.steps.write += t0.elapsed().saturating_sub(hook);
        match result {
            Ok(()) => Ok(pending),
            Err((failing, e)) => {
                let unrestored = self.unstage(&pending).err().unwrap_or_default();
                let mut pending = pending;
                let bad = pending.remove(failing);
                pending.insert(0, bad);
                Err((pending, e, unrestored))
            }
        }
    }

    /// Puts the previous contents back: renames each `.prev` journal over its file (nothing new
    /// is written, so this works on a full disk) or removes a file that was new, fsyncs the
    /// folder, and only then removes the `.none` journals. A change whose journal is missing
    /// counts as restored only if the file holds the previous bytes. Failures keep their journals,
    /// are remembered for [`Self::retry_restores`] and are returned.
    fn unstage(&mut self, staged: &[Pending]) -> Result<(), Unrestored> {
        let mut failed: Unrestored = Vec::new();
        for p in staged {
            let path = self.path_of(&p.name);
            let (prev, _) = self.journal_paths(&p.name);
            let result = match &p.previous {
                Some(bytes) => match fs::rename(&prev, &path) {
                    Ok(()) => Ok(()),
                    // No journal: the file was never replaced (journals are written first) or
                    // was put back already. Trust that only if the file says so.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => match read_optional(&path) {
                        Ok(Some(b)) if b == *bytes => Ok(()),
                        _ => Err(format!(
                            "the journal {} is missing and {} does not hold the previous bytes",
                            prev.display(),
                            path.display()
                        )),
                    },
                    Err(e) => Err(format!(
                        "renaming {} back to {}: {e}",
                        prev.display(),
                        path.display()
                    )),
                },
                None => remove_if_exists(&path)
                    .map_err(|e| format!("removing the new file {}: {e}", path.display())),
            };
            if let Err(e) = result {
                failed.push((p.name.clone(), e));
            }
        }
        if let Err(e) = sync_dir(&self.upstreams) {
            // Nothing above is known to be durable: keep every journal.
            let why = format!("fsync of {}: {e}", self.upstreams.display());
            failed = staged
                .iter()
                .map(|p| (p.name.clone(), why.clone()))
                .collect();
        }
        let restored: Vec<&Pending> = staged
            .iter()
            .filter(|p| !failed.iter().any(|(n, _)| n == &p.name))
            .collect();
        self.drop_journals(restored.iter().copied());
        self.unrestored
            .retain(|u| !staged.iter().any(|p| p.name == u.name));
        for p in staged {
            if failed.iter().any(|(n, _)| n == &p.name) {
                self.unrestored.push(p.clone());
                self.forget_live(&p.name);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    /// Tries again to put back the files of earlier failed restores; returns those still failing.
    fn retry_restores(&mut self) -> Unrestored {
        if self.unrestored.is_empty() {
            return Vec::new();
        }
        let list = std::mem::take(&mut self.unrestored);
        self.unstage(&list).err().unwrap_or_default()
    }

    /// Makes the renames of applied changes durable (their folder is not synced when they are
    /// written, see [`Self::stage`]), then drops their journals. When the fsync fails the journals
    /// stay: recovery at the next open finds them, tests what is on disk and makes it live.
    fn settle<'a>(&self, done: impl IntoIterator<Item = &'a Pending>) {
        if sync_dir(&self.upstreams).is_ok() {
            self.drop_journals(done);
        }
    }

    /// Removes the journals of finished changes (best effort: a journal left behind is handled by
    /// recovery at the next open).
    fn drop_journals<'a>(&self, done: impl IntoIterator<Item = &'a Pending>) {
        for p in done {
            let (prev, none) = self.journal_paths(&p.name);
            let _ = remove_if_exists(&prev);
            let _ = remove_if_exists(&none);
        }
        let _ = sync_dir(&self.upstreams);
    }

    fn journal_paths(&self, name: &UpstreamName) -> (PathBuf, PathBuf) {
        (
            self.upstreams.join(format!(".{name}{JOURNAL_PREV}")),
            self.upstreams.join(format!(".{name}{JOURNAL_NONE}")),
        )
    }

    /// Waits for the reload gap, reloads and waits for the reload to be confirmed live.
    fn reload_confirmed(&mut self) -> Result<(), String> {
        if let Some(last) = self.last_reload {
            let since = last.elapsed();
            if since < self.opts.min_reload_gap {
                thread::sleep(self.opts.min_reload_gap - since);
            }
        }
        let confirm = self.opts.confirm.clone();
        let before = match &confirm {
            Some(c) => Some(c.before().map_err(|e| e.to_string())?),
            None => None,
        };
        let result = self.nginx.reload();
        self.last_reload = Some(Instant::now());
        result.map_err(|e| e.to_string())?;
        if let (Some(c), Some(b)) = (&confirm, &before) {
            c.wait(b).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Reloads (confirmed); on success drops the journals and notes the new bytes as live. On
    /// failure restores the staged changes, tests again, and returns the text to record plus the
    /// restores that failed.
    fn reload_or_undo(&mut self, staged: &[Pending]) -> Result<(), (String, Unrestored)> {
        match self.reload_confirmed() {
            Ok(()) => {
                self.settle(staged);
                for p in staged {
                    self.note_live(&p.name, p.new.clone());
                }
                Ok(())
            }
            Err(e) => {
                // What nginx serves now is not known for sure (a reload may still land late).
                for p in staged {
                    self.forget_live(&p.name);
                }
                let restore = self.unstage(staged);
                let retest = match (&restore, self.nginx.test()) {
                    (Ok(()), Ok(())) => "previous files restored; nginx -t passes".to_string(),
                    (Ok(()), Err(t)) => format!(
                        "previous files restored; nginx -t still fails:\n{}",
                        t.output()
                    ),
                    (Err(u), _) => {
                        format!("restoring the previous files failed: {}", join_errors(u))
                    }
                };
                Err((format!("{e}\n{retest}"), restore.err().unwrap_or_default()))
            }
        }
    }
}

fn join_errors(list: &[(UpstreamName, String)]) -> String {
    list.iter()
        .map(|(n, e)| format!("{n}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
