//! The mirror's SQLite file and what readers see of it, so that no reader waits on a SQLite write.
//!
//! - [`FileView`]: the bindings as the file last **committed** them, in memory. Every read of a
//!   binding (the engine's, the API's, the writes' guards) answers from it under the mirror's
//!   lock, which is never held across SQLite.
//! - [`apply`]: the one way changes reach the mirror. The in-memory state is changed under the
//!   mirror's lock; the bindings' SQLite write is made outside it, under the file's own lock
//!   (`Shared::file`, which also orders the writers: a batch with bindings is staged, written
//!   and committed before the next one is staged; a batch without any is applied in memory at
//!   once and never waits for the file); then, under the mirror's lock again, the view takes what the
//!   file committed and the batch's binding revisions are recorded. A write that fails (disk
//!   full, the file locked past SQLite's busy timeout) records neither: the next read of the
//!   prefix applies the change again.
//! - The outcome history is read through a connection of its own (`Shared::reader`): in WAL mode
//!   a reader is not blocked by a writer holding the write lock.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use super::{Keys, Mirror, SecretKeys, Update};
use crate::etcd::{lock, Shared};
use crate::sqlite::MirrorOp;
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

    /// What [`SqliteFile::mirror_apply`] committed: `ops` in order, except the puts at the
    /// positions it refused (`clashes`).
    fn committed(&mut self, ops: Vec<MirrorOp>, clashes: &[usize]) {
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                MirrorOp::Put(sb) if !clashes.contains(&i) => {
                    self.bindings.insert(sb.binding.name.clone(), sb);
                }
                MirrorOp::Put(_) => {}
                MirrorOp::Remove(name) => {
                    self.bindings.remove(&name);
                }
            }
        }
    }
}

/// One batch of updates, staged in memory, waiting for the file.
#[derive(Default)]
pub struct Batch {
    pub events: Vec<StoreEvent>,
    /// The bindings' file writes, in etcd's order.
    pub ops: Vec<MirrorOp>,
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
    updates: Vec<Update>,
    snapshot: Option<Snapshot>,
) -> Result<Vec<StoreEvent>, StoreError> {
    let ids = (&shared.keys, &shared.secrets, shared.opts.host_id.as_str());
    // This host deletes its own outcome and marker of a removed binding (`own_keys.rs`).
    let note = |u: &[Update]| crate::etcd::own_keys::note_removals(shared, u);
    apply_to(&shared.mirror, &shared.file, ids, updates, snapshot, note)
}

/// [`apply`] on a mirror and its file.
fn apply_to(
    mirror: &Mutex<Mirror>,
    file: &Mutex<SqliteFile>,
    (keys, secrets, me): (&Keys, &SecretKeys, &str),
    mut updates: Vec<Update>,
    snapshot: Option<Snapshot>,
    note_removals: impl FnOnce(&[Update]),
) -> Result<Vec<StoreEvent>, StoreError> {
    let bindings = snapshot.is_some() || updates.iter().any(|u| u.is_binding(keys));
    if !bindings {
        // Nothing for the file (claims, target sets, heartbeats, outcomes): in memory at once.
        let mut m = lock(mirror);
        let batch = m.stage(updates, keys, secrets, me);
        return m.commit(batch, Ok(Default::default()));
    }
    let mut file = lock(file);
    let batch = {
        let mut m = lock(mirror);
        if let Some((seen, rev, rebuild)) = snapshot {
            if rebuild {
                m.forget_revisions();
            }
            let gone = m.missing_from(&seen, rev, keys);
            updates.extend(gone);
        }
        note_removals(&updates);
        m.stage(updates, keys, secrets, me)
    };
    let written = if batch.ops.is_empty() {
        Ok(Default::default())
    } else {
        file.mirror_apply(&batch.ops)
    };
    let mut m = lock(mirror);
    m.commit(batch, written)
}

impl Mirror {
    /// Takes what the file committed of `batch` (`written`: the names whose stored binding
    /// changed, and the positions of the puts refused as clashing in case with another name):
    /// the view, the binding revisions and decoded versions. On an error nothing of the
    /// bindings is recorded.
    pub fn commit(
        &mut self,
        batch: Batch,
        written: Result<(Vec<String>, Vec<usize>), StoreError>,
    ) -> Result<Vec<StoreEvent>, StoreError> {
        let (changed, clashes) = written?;
        let Batch {
            mut events,
            ops,
            staged,
            mut decoded,
        } = batch;
        for &i in &clashes {
            if let Some(MirrorOp::Put(sb)) = ops.get(i) {
                let c = &sb.binding.name;
                decoded.remove(c);
                tracing::error!(binding = %c, "binding from etcd not applied: its name differs only in case from another binding's");
            }
        }
        self.file.committed(ops, &clashes);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::auth::Meta;
    use crate::BindingRecord;

    fn stored(name: &str, service: &str, at: i64) -> StoredBinding {
        StoredBinding {
            binding: BindingRecord {
                name: name.into(),
                plugin: "consul".into(),
                provider: "consul".into(),
                config: Default::default(),
                service: service.into(),
                interval_secs: 30,
                directives: vec![],
                probe: None,
                drain_secs: 0,
            },
            created_at_ms: at,
            updated_at_ms: at,
        }
    }

    fn put(name: &str, service: &str, rev: i64) -> Update {
        Update::Binding {
            name: name.into(),
            rev,
            value: Some(stored(name, service, rev)),
            meta: Meta {
                create_rev: rev,
                version: 1,
            },
        }
    }

    fn remove(name: &str, rev: i64) -> Update {
        Update::Binding {
            name: name.into(),
            rev,
            value: None,
            meta: Meta::default(),
        }
    }

    fn service(sb: Option<StoredBinding>) -> Option<String> {
        sb.map(|sb| sb.binding.service)
    }

    /// One watch response can carry a binding's removal and its creation again (or the other
    /// way round): the file and the view end as etcd did, in a real SQLite file.
    #[test]
    fn a_batch_is_written_in_etcds_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = SqliteFile::open(&dir.path().join("mirror.db")).unwrap();
        let keys = Keys::new("/t/").unwrap();
        let secrets = SecretKeys::from_bytes(&[&[7u8; 32]]).unwrap();
        let mirror = Mutex::new(Mirror::new(FileView::load(&file).unwrap(), None));
        let file = Mutex::new(file);
        let ids = (&keys, &secrets, "host-a");
        apply_to(
            &mirror,
            &file,
            ids,
            vec![put("api", "web1", 2)],
            None,
            |_| {},
        )
        .unwrap();
        apply_to(&mirror, &file, ids, vec![put("old", "x", 3)], None, |_| {}).unwrap();
        let events = apply_to(
            &mirror,
            &file,
            ids,
            vec![
                remove("api", 4),
                put("api", "web2", 5),
                put("old", "y", 6),
                remove("old", 7),
            ],
            None,
            |_| {},
        )
        .unwrap();
        assert!(
            events.contains(&StoreEvent::Binding("api".into())),
            "{events:?}"
        );
        let on_disk = lock(&file).get_binding("api").unwrap();
        assert_eq!(service(on_disk).as_deref(), Some("web2"));
        assert_eq!(lock(&file).get_binding("old").unwrap(), None);
        let m = lock(&mirror);
        assert_eq!(
            service(m.file.get_binding("api").unwrap()).as_deref(),
            Some("web2")
        );
        assert_eq!(m.file.get_binding("old").unwrap(), None);
        assert_eq!(m.rev_of(&keys.binding("api")), 5);
        assert_eq!(m.rev_of(&keys.binding("old")), 7);
        // The view is what the file holds.
        let loaded = FileView::load(&lock(&file)).unwrap();
        assert_eq!(
            m.file.list_bindings().unwrap(),
            loaded.list_bindings().unwrap()
        );
    }
}
