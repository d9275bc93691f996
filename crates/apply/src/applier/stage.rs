//! The stage/undo primitives of the transaction: journal and write a set of changes
//! ([`Applier::stage`]), put them back ([`Applier::unstage`]), and make finished ones durable
//! ([`Applier::settle`]). The on-disk protocol they follow is described in the parent module.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tributary_core::UpstreamName;

use super::{Applier, ChangeOutcome, Outcomes};
use crate::fsutil::{
    link_replace, read_optional, remove_if_exists, remove_temps, rename_temps, sync_dir,
    write_many, write_temps, Item,
};

pub(super) const JOURNAL_PREV: &str = ".conf.prev";
pub(super) const JOURNAL_NONE: &str = ".conf.none";

/// One change in flight.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) name: UpstreamName,
    pub(super) previous: Option<Vec<u8>>,
    pub(super) new: Option<Vec<u8>>,
}

/// What [`Applier::stage`] runs once the journals of its changes exist (the live path pushes
/// there, [`super::push`]).
pub(super) type Journaled<'a> = dyn FnMut(&[Pending]) + 'a;

/// Restores that failed: upstream name → why.
pub(super) type Unrestored = Vec<(UpstreamName, String)>;

impl Applier {
    /// Like [`Self::stage`], recording write (and restore) failures as outcomes.
    pub(super) fn stage_recording(
        &mut self,
        pending: Vec<Pending>,
        outcomes: &mut Outcomes,
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
    pub(super) fn stage(
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
    pub(super) fn unstage(&mut self, staged: &[Pending]) -> Result<(), Unrestored> {
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
    pub(super) fn retry_restores(&mut self) -> Unrestored {
        if self.unrestored.is_empty() {
            return Vec::new();
        }
        let list = std::mem::take(&mut self.unrestored);
        self.unstage(&list).err().unwrap_or_default()
    }

    /// Makes the renames of applied changes durable (their folder is not synced when they are
    /// written, see [`Self::stage`]), then drops their journals. When the fsync fails the journals
    /// stay: recovery at the next open finds them, tests what is on disk and makes it live.
    pub(super) fn settle<'a>(&self, done: impl IntoIterator<Item = &'a Pending>) {
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

    pub(super) fn journal_paths(&self, name: &UpstreamName) -> (PathBuf, PathBuf) {
        (
            self.upstreams.join(format!(".{name}{JOURNAL_PREV}")),
            self.upstreams.join(format!(".{name}{JOURNAL_NONE}")),
        )
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
