//! The mirror's SQLite file and what readers see of it, so that neither a reader nor the session
//! waits on a SQLite write.
//!
//! - [`FileView`]: the bindings in memory, as etcd's changes applied in etcd's order made them
//!   (with the file's rule: a name that differs only in case from another binding's is refused).
//!   Every read of a binding (the engine's, the API's, the writes' guards) answers from it under
//!   the mirror's lock, which is never held across SQLite.
//! - [`apply`]: the one way changes reach the mirror. Under the mirror's lock the change is
//!   applied in memory (the view included) and the bindings' part is queued, in the same order,
//!   to the file's [`Writer`]: a thread of its own that writes each batch in one SQLite
//!   transaction. So a write that waits (a slow disk, another process holding the file's write
//!   lock up to SQLite's 5 s busy timeout) pauses no watch event, outcome flush or reader.
//! - The file's revision of each binding (what the session's next read of the prefix compares
//!   with: `Mirror::file_rev_of`) is recorded only once the file committed it. A write that fails
//!   (disk full, the file locked past the busy timeout) records nothing, nor do the batches
//!   queued behind it; the writer tells the session, which ends, and its next read of the prefix
//!   applies those changes again.
//! - This host's outcome history is written by the same thread (after the bindings queued before
//!   it: an outcome of a binding saved a moment ago is kept) and read through a connection of its
//!   own (`Shared::reader`): in WAL mode a reader is not blocked by a writer holding the write lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use super::mirror_writer::{FileJob, Writer};
use super::{Keys, Mirror, SecretKeys, Update};
use crate::etcd::{lock, Shared};
use crate::sqlite::MirrorOp;
use crate::{SqliteFile, StoreError, StoreEvent, StoredBinding};

/// The bindings as the mirror holds them (see the module docs).
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

    /// Applies `ops` in order as [`SqliteFile::mirror_apply`] does: returns the names whose
    /// binding changed, and the positions of the puts refused because another binding's name
    /// differs from theirs only in (ASCII) case (the file's `COLLATE NOCASE` index).
    fn apply(&mut self, ops: &[MirrorOp]) -> (Vec<String>, Vec<usize>) {
        let mut changed = Vec::new();
        let mut clashes = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                MirrorOp::Put(sb) => {
                    let name = &sb.binding.name;
                    if self.bindings.get(name) == Some(sb) {
                        continue;
                    }
                    if self
                        .bindings
                        .keys()
                        .any(|n| n != name && n.eq_ignore_ascii_case(name))
                    {
                        clashes.push(i);
                        continue;
                    }
                    self.bindings.insert(name.clone(), sb.clone());
                    changed.push(name.clone());
                }
                MirrorOp::Remove(name) => {
                    if self.bindings.remove(name).is_some() {
                        changed.push(name.clone());
                    }
                }
            }
        }
        (changed, clashes)
    }
}

/// One batch of updates, staged in memory.
#[derive(Default)]
pub struct Batch {
    pub events: Vec<StoreEvent>,
    /// The bindings' file writes, in etcd's order.
    pub ops: Vec<MirrorOp>,
    /// Binding keys' revisions: the view's at once, the file's once it committed them.
    pub staged: HashMap<String, i64>,
    /// The etcd revision of each binding version decoded.
    pub decoded: HashMap<String, i64>,
}

/// A full read's part in an [`apply`]: the keys it returned, its revision, and whether etcd went
/// back (every revision held is forgotten first).
pub type Snapshot = (HashSet<String>, i64, bool);

/// Applies `updates` (and, after a full read, the removal of what it did not return) to the
/// mirror and queues the bindings' file write; returns the events for them (the caller emits
/// them or not). See the module docs: nothing here waits on SQLite.
pub fn apply(shared: &Shared, updates: Vec<Update>, snapshot: Option<Snapshot>) -> Vec<StoreEvent> {
    let ids = (&shared.keys, &shared.secrets, shared.opts.host_id.as_str());
    // This host deletes its own outcome and marker of a removed binding (`own_keys.rs`).
    let note = |u: &[Update]| crate::etcd::own_keys::note_removals(shared, u);
    apply_to(&shared.mirror, &shared.writer, ids, updates, snapshot, note)
}

/// [`apply`] on a mirror and its file's writer.
fn apply_to(
    mirror: &Mutex<Mirror>,
    writer: &Writer,
    (keys, secrets, me): (&Keys, &SecretKeys, &str),
    mut updates: Vec<Update>,
    snapshot: Option<Snapshot>,
    note_removals: impl FnOnce(&[Update]),
) -> Vec<StoreEvent> {
    let bindings = snapshot.is_some() || updates.iter().any(|u| u.is_binding(keys));
    let mut m = lock(mirror);
    if bindings {
        if let Some((seen, rev, rebuild)) = snapshot {
            if rebuild {
                m.forget_revisions();
            }
            let gone = m.missing_from(&seen, rev, keys);
            updates.extend(gone);
        }
        note_removals(&updates);
    }
    let batch = m.stage(updates, keys, secrets, me);
    let (events, job) = m.take(batch);
    // Queued under the mirror's lock: the file is written in the order the view changed.
    if let Some(job) = job {
        writer.send(job);
    }
    events
}

impl Mirror {
    /// Takes `batch` into memory (the view, the binding revisions and decoded versions; a put
    /// whose name clashes in case with another binding's is refused and logged); returns its
    /// events and what the file is to write, if anything.
    fn take(&mut self, batch: Batch) -> (Vec<StoreEvent>, Option<FileJob>) {
        let Batch {
            mut events,
            ops,
            staged,
            mut decoded,
        } = batch;
        let (changed, clashes) = self.file.apply(&ops);
        for &i in &clashes {
            if let Some(MirrorOp::Put(sb)) = ops.get(i) {
                let c = &sb.binding.name;
                decoded.remove(c);
                tracing::error!(binding = %c, "binding from etcd not applied: its name differs only in case from another binding's");
            }
        }
        events.extend(changed.into_iter().map(StoreEvent::Binding));
        self.decoded_rev.extend(decoded);
        let ops: Vec<MirrorOp> = ops
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !clashes.contains(i))
            .map(|(_, op)| op)
            .collect();
        self.view_staged(&staged, !ops.is_empty());
        let epoch = self.epoch;
        let job = (!ops.is_empty()).then_some(FileJob { ops, staged, epoch });
        (events, job)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

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

    struct Fixture {
        keys: Keys,
        secrets: SecretKeys,
        mirror: Arc<Mutex<Mirror>>,
        file: Arc<Mutex<SqliteFile>>,
        writer: Writer,
    }

    impl Fixture {
        /// [`apply_to`] as host `host-a`.
        fn apply(&self, updates: Vec<Update>) -> Vec<StoreEvent> {
            let ids = (&self.keys, &self.secrets, "host-a");
            apply_to(&self.mirror, &self.writer, ids, updates, None, |_| {})
        }
    }

    /// A mirror on a real SQLite file at `path`, with its writer thread.
    fn fixture(path: &std::path::Path) -> Fixture {
        let file = SqliteFile::open(path).unwrap();
        let mirror = Arc::new(Mutex::new(Mirror::new(
            FileView::load(&file).unwrap(),
            None,
        )));
        let file = Arc::new(Mutex::new(file));
        let writer = Writer::start(file.clone(), mirror.clone(), "test".into()).unwrap();
        Fixture {
            keys: Keys::new("/t/").unwrap(),
            secrets: SecretKeys::from_bytes(&[&[7u8; 32]]).unwrap(),
            mirror,
            file,
            writer,
        }
    }

    /// One watch response can carry a binding's removal and its creation again (or the other
    /// way round): the view at once, and the file once its writer is done, end as etcd did, in a
    /// real SQLite file; the file's revisions are recorded once it committed them.
    #[test]
    fn a_batch_is_written_in_etcds_order() {
        let dir = tempfile::tempdir().unwrap();
        let f = fixture(&dir.path().join("mirror.db"));
        let (keys, mirror, file, writer) = (&f.keys, &f.mirror, &f.file, &f.writer);
        f.apply(vec![put("api", "web1", 2)]);
        f.apply(vec![put("old", "x", 3)]);
        let events = f.apply(vec![
            remove("api", 4),
            put("api", "web2", 5),
            put("old", "y", 6),
            remove("old", 7),
        ]);
        assert!(
            events.contains(&StoreEvent::Binding("api".into())),
            "{events:?}"
        );
        {
            let m = lock(mirror);
            assert_eq!(
                service(m.file.get_binding("api").unwrap()).as_deref(),
                Some("web2")
            );
            assert_eq!(m.file.get_binding("old").unwrap(), None);
            assert_eq!(m.rev_of(&keys.binding("api")), 5);
            assert_eq!(m.rev_of(&keys.binding("old")), 7);
        }
        assert!(writer.flush(Duration::from_secs(10)));
        let on_disk = lock(file).get_binding("api").unwrap();
        assert_eq!(service(on_disk).as_deref(), Some("web2"));
        assert_eq!(lock(file).get_binding("old").unwrap(), None);
        let m = lock(mirror);
        assert_eq!(m.file_revs.get(&keys.binding("api")), Some(&5));
        assert_eq!(m.file_revs.get(&keys.binding("old")), Some(&7));
        assert!(m.queued.is_empty(), "{:?}", m.queued);
        // The view is what the file holds.
        let loaded = FileView::load(&lock(file)).unwrap();
        assert_eq!(
            m.file.list_bindings().unwrap(),
            loaded.list_bindings().unwrap()
        );
    }

    /// The file's write lock is held by another connection past SQLite's busy timeout: the
    /// change is in the view at once, the write fails, the file's revision is not recorded (nor
    /// that of the batch queued behind it), the failure is reported for the session to end, and
    /// the same revisions are applied again.
    #[test]
    fn a_failed_write_records_no_file_revision() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mirror.db");
        let f = fixture(&path);
        let (keys, mirror, file, writer) = (&f.keys, &f.mirror, &f.file, &f.writer);
        let locker = rusqlite::Connection::open(&path).unwrap();
        locker.execute_batch("BEGIN IMMEDIATE").unwrap();
        f.apply(vec![put("api", "web1", 2)]);
        f.apply(vec![put("db", "x", 3)]);
        assert_eq!(
            service(lock(mirror).file.get_binding("api").unwrap()).as_deref(),
            Some("web1")
        );
        // The same revision again while it is queued: not newer.
        f.apply(vec![put("api", "web1", 2)]);
        assert!(writer.flush(Duration::from_secs(20)));
        assert!(writer.failure.take().is_some());
        {
            let m = lock(mirror);
            assert_eq!(m.file_rev_of(&keys.binding("api")), 0);
            assert_eq!(m.file_rev_of(&keys.binding("db")), 0);
            assert_eq!(m.rev_of(&keys.binding("api")), 2);
        }
        locker.execute_batch("ROLLBACK").unwrap();
        // A read of the prefix delivers the same revisions: written this time.
        f.apply(vec![put("api", "web1", 2), put("db", "x", 3)]);
        assert!(writer.flush(Duration::from_secs(10)));
        assert!(writer.failure.take().is_none());
        assert_eq!(lock(file).list_bindings().unwrap().len(), 2);
        assert_eq!(lock(mirror).file_rev_of(&keys.binding("db")), 3);
    }
}
