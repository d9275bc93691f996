//! The apply transaction over `<conf dir>/upstreams/`.
//!
//! On-disk protocol (all names start with `.` and never end in `.conf`, so `include upstreams/*.conf;`
//! never sees them):
//! - `.tributary.lock` — `flock`ed for the Applier's lifetime; holds the owner's pid for messages.
//! - `.<name>.conf.prev` / `.<name>.conf.none` — the journal of a change in flight: the previous
//!   bytes, or "there was no file". Written (atomically, fsynced) *before* `<name>.conf` changes and
//!   removed once the change is tested and reloaded, or undone. A journal found at open means a crash
//!   between write and the end of the transaction: [`Applier::open`] tests nginx and restores every
//!   journaled file when the test fails.
//! - `.<name>.conf.tmp-<pid>-<n>` — temp files of atomic writes; left-overs are removed at open.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use tributary_core::UpstreamName;

use crate::fsutil::{read_optional, remove_if_exists, sync_dir, write_many, TMP_MARKER};
use crate::nginx::{CommandError, Nginx};

/// Name of the lock file inside `upstreams/`.
pub const LOCK_FILE: &str = ".tributary.lock";
const JOURNAL_PREV: &str = ".conf.prev";
const JOURNAL_NONE: &str = ".conf.none";

/// Options of an [`Applier`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Least time between two reloads; a reload due sooner waits (default 2 s).
    pub min_reload_gap: Duration,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            min_reload_gap: Duration::from_secs(2),
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
    /// The file already had these bytes: nothing written, tested or reloaded.
    Unchanged,
    /// Written and `nginx -t` passed; `reloaded` tells whether nginx was reloaded.
    Applied { reloaded: bool },
    /// `nginx -t` failed with this file: the previous bytes are back (or the file is gone if there
    /// was none). `nginx_error` is nginx's own output.
    TestFailed { nginx_error: String },
    /// The test passed but the reload command failed: the previous bytes are back and nginx was
    /// tested again; `error` says both.
    ReloadFailed { error: String },
    /// The file could not be written (disk full, permissions); nothing changed.
    /// (An addition to the contract: IO errors had no outcome to go to.)
    WriteFailed { error: String },
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
    /// The file is gone, nginx passed the test without it and was reloaded.
    Removed,
    /// There was no file.
    NotFound,
    /// nginx fails without the file (an `include` still names it): the file is kept.
    Refused { nginx_error: String },
    /// Removed and tested, but the reload failed: the file is back.
    ReloadFailed { error: String },
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
    /// `nginx -t` failed with them on disk; they were restored to their previous bytes / removed.
    pub restored: bool,
    /// nginx's output of the failed test that caused the restore.
    pub test_error: Option<String>,
    /// nginx's output if it still fails after the restore (not caused by us).
    pub still_failing: Option<String>,
    /// The test passed and nginx was reloaded to serve the interrupted changes
    /// (`Some(Err(..))`: the reload failed; `None`: no reload was needed or tried).
    pub reload: Option<Result<(), String>>,
}

/// One change in flight.
struct Pending {
    name: UpstreamName,
    previous: Option<Vec<u8>>,
    new: Option<Vec<u8>>,
}

/// The serialised apply transaction over one `upstreams/` folder. Holds the lock file while alive.
pub struct Applier {
    upstreams: PathBuf,
    nginx: Box<dyn Nginx>,
    opts: ApplyOptions,
    _lock: File,
    last_reload: Option<Instant>,
    recovery: RecoveryReport,
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
        };
        applier.recover()?;
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

    /// Applies a batch: unchanged files are left alone; the changed ones are written atomically,
    /// tested together with one `nginx -t` and, if it passes, made live with one reload. When the
    /// test fails, the culprits are found by testing halves of the batch (bisection), restored and
    /// reported with nginx's message; the others are applied with one reload.
    ///
    /// Returns one outcome per distinct name, in the order names first appear; when a name
    /// appears twice, its last change is used.
    pub fn apply_batch(&mut self, changes: &[Change]) -> Vec<(UpstreamName, ChangeOutcome)> {
        let mut order: Vec<UpstreamName> = Vec::new();
        let mut latest: HashMap<&UpstreamName, &Change> = HashMap::new();
        for c in changes {
            if latest.insert(&c.name, c).is_none() {
                order.push(c.name.clone());
            }
        }
        let mut outcomes: HashMap<UpstreamName, ChangeOutcome> = HashMap::new();
        let mut pending = Vec::new();
        for name in &order {
            let change = latest[name];
            match read_optional(&self.path_of(name)) {
                Err(e) => {
                    outcomes.insert(
                        name.clone(),
                        ChangeOutcome::WriteFailed {
                            error: e.to_string(),
                        },
                    );
                }
                Ok(Some(current)) if current == change.bytes => {
                    outcomes.insert(name.clone(), ChangeOutcome::Unchanged);
                }
                Ok(previous) => pending.push(Pending {
                    name: name.clone(),
                    previous,
                    new: Some(change.bytes.clone()),
                }),
            }
        }

        let accepted = self.stage_and_isolate(pending, &mut outcomes, true);
        if !accepted.is_empty() {
            match self.reload_or_undo(&accepted) {
                Ok(()) => {
                    for p in &accepted {
                        outcomes.insert(p.name.clone(), ChangeOutcome::Applied { reloaded: true });
                    }
                }
                Err(error) => {
                    for p in &accepted {
                        outcomes.insert(
                            p.name.clone(),
                            ChangeOutcome::ReloadFailed {
                                error: error.clone(),
                            },
                        );
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
                (n, o)
            })
            .collect()
    }

    /// Removes `name`'s file, but only if nginx still passes the test without it; then reloads.
    pub fn remove(&mut self, name: &UpstreamName) -> Result<RemoveOutcome, ApplyError> {
        let path = self.path_of(name);
        let Some(previous) = read_optional(&path).map_err(io_err(&path))? else {
            return Ok(RemoveOutcome::NotFound);
        };
        let pending = vec![Pending {
            name: name.clone(),
            previous: Some(previous),
            new: None,
        }];
        let staged = self.stage(pending).map_err(|(_, e)| io_err(&path)(e))?;
        if let Err(e) = self.nginx.test() {
            self.unstage(&staged);
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
            Err(error) => Ok(RemoveOutcome::ReloadFailed { error }),
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
        let failed = |nginx_error: String| ChangeOutcome::TestFailed { nginx_error };
        if pending.is_empty() {
            return pending;
        }
        let staged = self.stage_recording(pending, outcomes);
        if staged.is_empty() {
            return staged;
        }
        let err = match self.nginx.test() {
            Ok(()) => return staged,
            Err(e) => e,
        };
        self.unstage(&staged);
        if staged.len() == 1 {
            for p in staged {
                outcomes.insert(p.name, failed(err.output().to_string()));
            }
            return Vec::new();
        }
        // Does nginx pass without any of them? If not, the fault is not in this batch. (Deeper
        // levels need not ask: what is staged there has passed a test already.)
        if let Err(base) = if check_baseline {
            self.nginx.test()
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

    /// Like [`Self::stage`], recording write failures as outcomes.
    fn stage_recording(
        &mut self,
        pending: Vec<Pending>,
        outcomes: &mut HashMap<UpstreamName, ChangeOutcome>,
    ) -> Vec<Pending> {
        let mut remaining = pending;
        loop {
            match self.stage(remaining) {
                Ok(staged) => return staged,
                Err((rest, e)) => {
                    // `stage` undid everything; drop the failing one and retry the rest.
                    let mut rest = rest;
                    let bad = rest.remove(0);
                    outcomes.insert(
                        bad.name,
                        ChangeOutcome::WriteFailed {
                            error: e.to_string(),
                        },
                    );
                    remaining = rest;
                }
            }
        }
    }

    /// Writes journals then new contents. On an IO error everything in `pending` is put back as
    /// it was and the list is returned with the failing change first.
    fn stage(&mut self, pending: Vec<Pending>) -> Result<Vec<Pending>, (Vec<Pending>, io::Error)> {
        let dir = self.upstreams.clone();
        let result = (|| -> Result<(), (usize, io::Error)> {
            // 1. journals: the previous bytes, or an empty ".none" marker. Durable before step 2.
            let mut journals: Vec<(String, &[u8])> = Vec::with_capacity(pending.len());
            for (i, p) in pending.iter().enumerate() {
                let (prev, none) = self.journal_paths(&p.name);
                let (stale, entry) = match &p.previous {
                    Some(bytes) => (none, (file_name(&prev), bytes.as_slice())),
                    None => (prev, (file_name(&none), &b""[..])),
                };
                remove_if_exists(&stale).map_err(|e| (i, e))?;
                journals.push(entry);
            }
            write_many(&dir, &journals)?;
            sync_dir(&dir).map_err(|e| (0, e))?;
            // 2. the new contents (or the removal).
            let mut writes: Vec<(String, &[u8])> = Vec::new();
            let mut write_index: Vec<usize> = Vec::new();
            for (i, p) in pending.iter().enumerate() {
                match &p.new {
                    Some(bytes) => {
                        writes.push((p.name.file_name(), bytes.as_slice()));
                        write_index.push(i);
                    }
                    None => remove_if_exists(&self.path_of(&p.name)).map_err(|e| (i, e))?,
                }
            }
            write_many(&dir, &writes).map_err(|(k, e)| (write_index[k], e))?;
            sync_dir(&dir).map_err(|e| (0, e))
        })();
        match result {
            Ok(()) => Ok(pending),
            Err((failing, e)) => {
                self.unstage(&pending);
                let mut pending = pending;
                let bad = pending.remove(failing);
                pending.insert(0, bad);
                Err((pending, e))
            }
        }
    }

    /// Puts the previous contents back and removes the journals (best effort; a journal that
    /// cannot be removed is handled by recovery at the next open).
    fn unstage(&self, staged: &[Pending]) {
        let mut restores: Vec<(String, &[u8])> = Vec::new();
        for p in staged {
            match &p.previous {
                Some(bytes) => restores.push((p.name.file_name(), bytes.as_slice())),
                None => {
                    let _ = remove_if_exists(&self.path_of(&p.name));
                }
            }
        }
        if let Err((k, _)) = write_many(&self.upstreams, &restores) {
            // Retry the rest one by one so one failure does not leave the others changed.
            for item in &restores[k..] {
                let _ = write_many(&self.upstreams, std::slice::from_ref(item));
            }
        }
        let _ = sync_dir(&self.upstreams);
        self.drop_journals(staged);
    }

    fn drop_journals(&self, staged: &[Pending]) {
        for p in staged {
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

    /// Waits for the reload gap, reloads; on success drops the journals. On failure restores the
    /// staged changes, tests again, and returns the text to record.
    fn reload_or_undo(&mut self, staged: &[Pending]) -> Result<(), String> {
        if let Some(last) = self.last_reload {
            let since = last.elapsed();
            if since < self.opts.min_reload_gap {
                thread::sleep(self.opts.min_reload_gap - since);
            }
        }
        let result = self.nginx.reload();
        self.last_reload = Some(Instant::now());
        match result {
            Ok(()) => {
                self.drop_journals(staged);
                Ok(())
            }
            Err(e) => {
                self.unstage(staged);
                let retest = match self.nginx.test() {
                    Ok(()) => "previous files restored; nginx -t passes".to_string(),
                    Err(t) => format!(
                        "previous files restored; nginx -t still fails:\n{}",
                        t.output()
                    ),
                };
                Err(format!("{e}\n{retest}"))
            }
        }
    }

    // ---- crash recovery ----------------------------------------------------------------

    fn recover(&mut self) -> Result<(), ApplyError> {
        let dir = self.upstreams.clone();
        let mut pending: Vec<Pending> = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let fname = entry.file_name().to_string_lossy().into_owned();
            if !fname.starts_with('.') || fname == LOCK_FILE {
                continue;
            }
            if fname.contains(TMP_MARKER) {
                remove_if_exists(&entry.path()).map_err(io_err(&entry.path()))?;
                continue;
            }
            let stem = &fname[1..];
            let (name, previous) = if let Some(n) = stem.strip_suffix(JOURNAL_PREV) {
                let bytes = fs::read(entry.path()).map_err(io_err(&entry.path()))?;
                (n, Some(bytes))
            } else if let Some(n) = stem.strip_suffix(JOURNAL_NONE) {
                (n, None)
            } else {
                continue;
            };
            let Ok(name) = UpstreamName::parse(name) else {
                continue;
            };
            // `.prev` wins over `.none` if both exist (a crash while switching kinds).
            if let Some(existing) = pending.iter_mut().find(|p| p.name == name) {
                if previous.is_some() {
                    existing.previous = previous;
                }
                continue;
            }
            pending.push(Pending {
                name,
                previous,
                new: None,
            });
        }
        if pending.is_empty() {
            return Ok(());
        }
        pending.sort_by(|a, b| a.name.cmp(&b.name));
        let mut report = RecoveryReport {
            pending: pending.iter().map(|p| p.name.clone()).collect(),
            ..RecoveryReport::default()
        };
        match self.nginx.test() {
            Ok(()) => {
                // What is on disk is valid: make it live.
                report.reload = Some(self.reload_plain().map_err(|e| e.to_string()));
                self.drop_journals(&pending);
            }
            Err(e) => {
                report.restored = true;
                report.test_error = Some(e.output().to_string());
                self.unstage(&pending);
                if let Err(e2) = self.nginx.test() {
                    report.still_failing = Some(e2.output().to_string());
                }
            }
        }
        self.recovery = report;
        Ok(())
    }

    fn reload_plain(&mut self) -> Result<(), CommandError> {
        let r = self.nginx.reload();
        self.last_reload = Some(Instant::now());
        r
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
