//! The mirror's SQLite file and what readers see of it, so that no reader waits on a SQLite write.
//!
//! - [`FileView`]: the bindings as the file last **committed** them, in memory. Every read of a
//!   binding (the engine's, the API's, the writes' guards) answers from it under the mirror's
//!   lock, which is never held across SQLite.
//! - [`apply`]: the one way changes reach the mirror. The in-memory state is changed under the
//!   mirror's lock; the bindings' SQLite write is made outside it, under the file's own lock
//!   (`Shared::file`, which also orders the writers: a batch is staged, written and committed
//!   before the next one is staged); then, under the mirror's lock again, the view takes what the
//!   file committed and the batch's binding revisions are recorded. A write that fails (disk
//!   full, the file locked past SQLite's busy timeout) records neither: the next read of the
//!   prefix applies the change again.
//! - The outcome history is read through a connection of its own (`Shared::reader`): in WAL mode
//!   a reader is not blocked by a writer holding the write lock.

use std::collections::{BTreeMap, HashSet};

use super::{Mirror, Update};
use crate::etcd::{lock, Shared};
use crate::{SqliteFile, StoreError, StoreEvent, StoredBinding};

/// The bindings the mirror's file holds, as it last committed them (see the module docs).
#[derive(Debug, Default)]
pub struct FileView {
    bindings: BTreeMap<String, StoredBinding>,
}

impl FileView {
    /// What `file` holds now. A row that cannot be decoded fails here, at open, with the error a
    /// read of it would give.
    pub fn load(file: &SqliteFile) -> Result<FileView, StoreError> {
        Ok(FileView {
            bindings: file
                .list_bindings()?
                .into_iter()
                .map(|sb| (sb.binding.name.clone(), sb))
                .collect(),
        })
    }

    /// One binding by its exact name (as the file's `name = ?`).
    pub fn get_binding(&self, name: &str) -> Result<Option<StoredBinding>, StoreError> {
        Ok(self.bindings.get(name).cloned())
    }

    /// All bindings, ordered by name (bytewise, as the file's `ORDER BY name`).
    pub fn list_bindings(&self) -> Result<Vec<StoredBinding>, StoreError> {
        Ok(self.bindings.values().cloned().collect())
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.bindings.keys()
    }

    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    /// What [`SqliteFile::mirror_apply`] committed: `puts` in order except the `clashes` it
    /// refused, then `removes`.
    fn committed(&mut self, puts: &[StoredBinding], removes: &[String], clashes: &[String]) {
        for sb in puts {
            if !clashes.contains(&sb.binding.name) {
                self.bindings.insert(sb.binding.name.clone(), sb.clone());
            }
        }
        for name in removes {
            self.bindings.remove(name);
        }
    }
}

/// One batch of updates, staged in memory, waiting for the file.
#[derive(Default)]
pub struct Batch {
    pub events: Vec<StoreEvent>,
    pub puts: Vec<StoredBinding>,
    pub removes: Vec<String>,
    /// Binding keys' revisions: recorded once the file committed them.
    pub staged: std::collections::HashMap<String, i64>,
    /// The etcd revision of each binding version decoded: recorded once the file has it.
    pub decoded: std::collections::HashMap<String, i64>,
}

/// A full read's part in an [`apply`]: the keys it returned, its revision, and whether etcd went
/// back (every revision held is forgotten first).
pub type Snapshot = (HashSet<String>, i64, bool);

/// Applies `updates` (and, after a full read, the removal of what it did not return) to the
/// mirror; returns the events for them (the caller emits them or not). See the module docs for
/// the locks: readers of the mirror never wait on the SQLite write.
pub fn apply(
    shared: &Shared,
    mut updates: Vec<Update>,
    snapshot: Option<Snapshot>,
) -> Result<Vec<StoreEvent>, StoreError> {
    let (keys, secrets, me) = (&shared.keys, &shared.secrets, shared.opts.host_id.as_str());
    let bindings = snapshot.is_some() || updates.iter().any(|u| u.is_binding(keys));
    if !bindings {
        // Nothing for the file (claims, target sets, heartbeats, outcomes): in memory at once.
        let mut m = lock(&shared.mirror);
        let batch = m.stage(updates, keys, secrets, me);
        return m.commit(batch, Ok(Default::default()));
    }
    let mut file = lock(&shared.file);
    let batch = {
        let mut m = lock(&shared.mirror);
        if let Some((seen, rev, rebuild)) = snapshot {
            if rebuild {
                m.forget_revisions();
            }
            let gone = m.missing_from(&seen, rev, keys);
            updates.extend(gone);
        }
        m.stage(updates, keys, secrets, me)
    };
    let written = if batch.puts.is_empty() && batch.removes.is_empty() {
        Ok(Default::default())
    } else {
        file.mirror_apply(&batch.puts, &batch.removes)
    };
    let mut m = lock(&shared.mirror);
    m.commit(batch, written)
}

impl Mirror {
    /// Takes what the file committed of `batch` (`written`: the names whose stored binding
    /// changed, and the puts refused as clashing in case with another name): the view, the
    /// binding revisions and decoded versions. On an error nothing of the bindings is recorded.
    pub fn commit(
        &mut self,
        batch: Batch,
        written: Result<(Vec<String>, Vec<String>), StoreError>,
    ) -> Result<Vec<StoreEvent>, StoreError> {
        let (changed, clashes) = written?;
        let Batch {
            mut events,
            puts,
            removes,
            staged,
            mut decoded,
        } = batch;
        for c in &clashes {
            decoded.remove(c);
            tracing::error!(binding = %c, "binding from etcd not applied: its name differs only in case from another binding's");
        }
        self.file.committed(&puts, &removes, &clashes);
        events.extend(changed.into_iter().map(StoreEvent::Binding));
        // The file has this batch's bindings: their revisions are the mirror's now.
        for (key, rev) in staged {
            let e = self.revs.entry(key).or_insert(0);
            *e = (*e).max(rev);
        }
        self.decoded_rev.extend(decoded);
        Ok(events)
    }
}
