//! The mirror file's writer (`mirror_file.rs` has the whole picture): a thread of its own that
//! writes the bindings' changes [`super::apply`] queues, in their order, each batch in one SQLite
//! transaction, and answers for each batch: the file's revisions it brings are recorded only once
//! it committed; a failed write records nothing, nor do the batches queued behind it, and is
//! reported for the session to end (its next read of the prefix applies them again).

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Mirror;
use crate::etcd::lock;
use crate::sqlite::MirrorOp;
use crate::{OutcomeRecord, SqliteFile, StoreError};

/// A batch's writes for the file, and the binding keys' revisions they bring it to.
pub(super) struct FileJob {
    pub(super) ops: Vec<MirrorOp>,
    pub(super) staged: HashMap<String, i64>,
    /// The mirror's epoch when it was staged (`Mirror::forget_revisions`).
    pub(super) epoch: u64,
}

enum ToWriter {
    Write(FileJob),
    /// This host's outcome history (after the bindings queued before it: an outcome of a binding
    /// the file does not have yet would be dropped).
    Outcomes(Vec<(String, OutcomeRecord)>, Answer),
    /// Answered once every write queued before it is done.
    Flush(mpsc::Sender<()>),
}

type Answer = tokio::sync::oneshot::Sender<Result<(), StoreError>>;

/// Why the file's last write failed, until the session takes it.
#[derive(Default)]
pub struct WriteFailure {
    error: Mutex<Option<String>>,
    /// Wakes the session when a write failed.
    pub notify: tokio::sync::Notify,
}

impl WriteFailure {
    /// The error of a write that failed since the last call (the session ends with it).
    pub fn take(&self) -> Option<String> {
        lock(&self.error).take()
    }
}

/// The mirror file's writer: a thread that writes the batches [`super::apply`] queues and this
/// host's outcome history, in their order (see the module docs). It ends when the store is
/// dropped, after what was queued.
pub struct Writer {
    tx: Mutex<mpsc::Sender<ToWriter>>,
    pub failure: Arc<WriteFailure>,
}

impl Writer {
    /// Starts the thread writing `file` for `mirror`.
    pub fn start(
        file: Arc<Mutex<SqliteFile>>,
        mirror: Arc<Mutex<Mirror>>,
        location: String,
    ) -> Result<Writer, StoreError> {
        let (tx, rx) = mpsc::channel();
        let failure = Arc::new(WriteFailure::default());
        let f = failure.clone();
        std::thread::Builder::new()
            .name("tributary-mirror".into())
            .spawn(move || write_loop(&rx, &file, &mirror, &f, &location))
            .map_err(|e| StoreError::Settings(format!("starting the mirror's writer: {e}")))?;
        Ok(Writer {
            tx: Mutex::new(tx),
            failure,
        })
    }

    pub(super) fn send(&self, job: FileJob) {
        // The thread ends only when this sender is dropped.
        let _ = lock(&self.tx).send(ToWriter::Write(job));
    }

    /// Records this host's outcomes in the file's history, after the bindings queued so far;
    /// answers once written.
    pub fn record_outcomes(
        &self,
        list: Vec<(String, OutcomeRecord)>,
    ) -> tokio::sync::oneshot::Receiver<Result<(), StoreError>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Not sent: the thread ended, and the receiver says so.
        let _ = lock(&self.tx).send(ToWriter::Outcomes(list, tx));
        rx
    }

    /// Waits (blocking, at most `limit`) until every batch queued so far is written or failed.
    pub fn flush(&self, limit: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        if lock(&self.tx).send(ToWriter::Flush(tx)).is_err() {
            return true;
        }
        rx.recv_timeout(limit).is_ok()
    }
}

fn write_loop(
    rx: &mpsc::Receiver<ToWriter>,
    file: &Mutex<SqliteFile>,
    mirror: &Mutex<Mirror>,
    failure: &WriteFailure,
    location: &str,
) {
    while let Ok(msg) = rx.recv() {
        let job = match msg {
            ToWriter::Write(job) => job,
            other => {
                not_bindings(other, file);
                continue;
            }
        };
        let written = lock(file).mirror_apply(&job.ops);
        let mut m = lock(mirror);
        match written {
            Ok((_, clashes)) => {
                for i in clashes {
                    if let Some(MirrorOp::Put(sb)) = job.ops.get(i) {
                        tracing::error!(store = %location, binding = %sb.binding.name, "the mirror file refused a binding its view holds: its name differs only in case from another binding's in the file");
                    }
                }
                m.file_written(&job.staged, true, job.epoch);
            }
            Err(e) => {
                m.file_written(&job.staged, false, job.epoch);
                // What is queued behind it was staged before the failure was known (the queue
                // is fed under the mirror's lock, held here): applied again by the session's
                // next read of the prefix, like the failed batch.
                // The rest (outcome history, flushes) in their order, once the mirror's lock is
                // let go.
                let mut rest = Vec::new();
                while let Ok(next) = rx.try_recv() {
                    match next {
                        ToWriter::Write(j) => m.file_written(&j.staged, false, j.epoch),
                        other => rest.push(other),
                    }
                }
                tracing::warn!(store = %location, error = %e, "writing the mirror file failed: the session reads the prefix again and the change is written again");
                *lock(&failure.error) = Some(e.to_string());
                drop(m);
                failure.notify.notify_one();
                rest.into_iter().for_each(|msg| not_bindings(msg, file));
            }
        }
    }
}

/// Writes an outcome history, or answers a flush.
fn not_bindings(msg: ToWriter, file: &Mutex<SqliteFile>) {
    match msg {
        ToWriter::Outcomes(list, done) => {
            let _ = done.send(lock(file).record_outcomes(&list));
        }
        ToWriter::Flush(done) => {
            let _ = done.send(());
        }
        ToWriter::Write(_) => unreachable!("bindings are written by the loop"),
    }
}

impl Mirror {
    /// The revision of binding key `key` the file has, or will have once its queued write
    /// commits.
    pub(super) fn file_rev_of(&self, key: &str) -> i64 {
        let committed = self.file_revs.get(key).copied().unwrap_or(0);
        committed.max(self.queued.get(key).copied().unwrap_or(0))
    }

    /// Whether `rev` of binding key `key` is to be applied: newer than what the file has (or
    /// will have) and `staged` (this batch's binding writes) holds, and not older than what
    /// memory holds (the same revision is applied again when the file's write of it failed);
    /// stages it when so.
    pub(super) fn staged_newer(
        &self,
        staged: &mut HashMap<String, i64>,
        key: String,
        rev: i64,
    ) -> bool {
        let held = self
            .file_rev_of(&key)
            .max(staged.get(&key).copied().unwrap_or(0));
        if rev != 0 && (rev <= held || rev < self.rev_of(&key)) {
            return false;
        }
        staged.insert(key, held.max(rev));
        true
    }

    /// Records a batch's binding revisions: in memory at once; for the file when its write
    /// was `queued` (answered by [`Mirror::file_written`]), else at once (nothing to write).
    pub(super) fn view_staged(&mut self, staged: &HashMap<String, i64>, queued: bool) {
        for (key, &rev) in staged {
            let e = self.revs.entry(key.clone()).or_insert(0);
            *e = (*e).max(rev);
            let f = match queued {
                true => self.queued.entry(key.clone()).or_insert(0),
                false => self.file_revs.entry(key.clone()).or_insert(0),
            };
            *f = (*f).max(rev);
        }
    }

    /// The writer's answer for a batch that brought binding keys to `staged`: committed (`ok`:
    /// the file's revisions now) or not (nothing recorded: the next read applies it again).
    fn file_written(&mut self, staged: &HashMap<String, i64>, ok: bool, epoch: u64) {
        if epoch != self.epoch {
            return;
        }
        for (key, &rev) in staged {
            if ok {
                let e = self.file_revs.entry(key.clone()).or_insert(0);
                *e = (*e).max(rev);
            }
            if self.queued.get(key).is_some_and(|&q| q <= rev) {
                self.queued.remove(key);
            }
        }
    }
}
