//! The live path's order: journal, push, new file, confirm, then (when needed) test.
//!
//! A change of `server` lines only reaches nginx's traffic through the module's API, not through
//! the files: the test guards the files (the next reload reads them), the module validates the set
//! it takes. So the push waits neither for the test nor for the disk: it goes as soon as the
//! journals exist (a link, no flush), while the new files are made durable and renamed. A crash
//! after the push always leaves the journal, so recovery at the next start tests what is on disk
//! and reloads (nginx then serves what the files say) or restores. The set is read back only
//! once the new file is in place: a reload by anyone else before that brings back the old file's
//! set, which the read-back sees (the change then takes the reload path).
//!
//! A push stands only if the test passes; when it fails, every push of the batch is undone
//! before the files are restored — a change nginx -t refuses is never reported applied, and nginx
//! ends up serving what the files say. A push whose file could not be written is undone too.
//!
//! The caller may also say a batch cannot fail the test (only values it checked by nginx's rules
//! differ from the live bytes); the test is then skipped for upstreams whose live bytes passed a
//! test of this Applier. `nginx -t` is a new process costing ~7 ms of CPU (mostly its own start:
//! dynamic linking, OpenSSL), and at ten changes a second that alone took the proxied traffic's
//! p99 from 0.95–0.97× to 1.7–1.9× of the no-change run (measured with the live benchmark,
//! docs/live-api.md).

use std::collections::HashMap;

use tributary_core::{NeedsReload, ReloadReason, UpstreamName};

use super::{Applier, Change, ChangeOutcome, Pending};

/// How a change is made live without a reload (the module's API), for
/// [`Applier::apply_live_batch`].
pub trait Push {
    /// Sends `change` live (the `PUT`); `Err(why)` sends the change to the reload path. Called
    /// once its journal exists, before its new file is written.
    fn push(&mut self, change: &Change) -> Result<(), NeedsReload>;
    /// Confirms a pushed `change` once its new file is in place (reads the set back and
    /// compares); `Err(why)` sends the change to the reload path.
    fn confirm(&mut self, change: &Change) -> Result<(), NeedsReload>;
    /// Puts back the set that was live before a successful [`Self::push`] of `change` (its file
    /// could not be written, or the test failed). `Err(why)`: nginx may still serve the pushed
    /// set.
    fn undo(&mut self, change: &Change) -> Result<(), UndoError>;
}

/// Why a [`Push::undo`] failed (the caller's own error, shown in the outcome).
pub type UndoError = Box<dyn std::error::Error + Send + Sync>;

/// A staged change and, when it was pushed before the batch's test, the push's result (`None`:
/// not pushed yet — the test failed and the change was tested again on its own).
pub(super) type Tested = (Pending, Option<Result<(), NeedsReload>>);

impl Applier {
    /// Journals, pushes, writes and confirms each change of `pending`, then tests (unless `test`
    /// is false). Test passed or not run: the staged changes with their pushes' results. Test
    /// failed: the pushes that went through are undone and the batch is restored and bisected as
    /// by [`Applier::apply_batch`]; the changes found good are returned without a push result
    /// (they are pushed after their test).
    pub(super) fn push_then_test(
        &mut self,
        pending: Vec<Pending>,
        changes: &HashMap<&UpstreamName, &Change>,
        push: &mut dyn Push,
        test: bool,
        outcomes: &mut HashMap<UpstreamName, ChangeOutcome>,
    ) -> Vec<Tested> {
        if pending.is_empty() {
            return Vec::new();
        }
        // Each change is pushed once, the first time its journal exists (a write failure makes
        // `stage_recording` stage the others again).
        // (A list, in the batch's order, so that undos run in that order too.)
        let mut pushed: Vec<(UpstreamName, Result<(), NeedsReload>)> = Vec::new();
        let staged = self.stage_recording(pending, outcomes, &mut |journaled| {
            for p in journaled {
                if !pushed.iter().any(|(n, _)| n == &p.name) {
                    pushed.push((p.name.clone(), push.push(changes[&p.name])));
                }
            }
        });
        let went_through: Vec<UpstreamName> = pushed
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(n, _)| n.clone())
            .collect();
        // Pushed, but the file could not be written: take the set back.
        let unwritten: Vec<UpstreamName> = went_through
            .iter()
            .filter(|n| !staged.iter().any(|p| &p.name == *n))
            .cloned()
            .collect();
        let not_undone = self.undo_all(&unwritten, changes, push);
        self.note_not_undone(not_undone, outcomes);
        let results: Vec<Result<(), NeedsReload>> = staged
            .iter()
            .map(|p| match pushed.iter().find(|(n, _)| n == &p.name) {
                Some((_, Ok(()))) => push.confirm(changes[&p.name]),
                Some((_, Err(why))) => Err(why.clone()),
                None => Err(NeedsReload::new(
                    ReloadReason::LiveFailed,
                    "internal: the change was not pushed",
                )),
            })
            .collect();
        let err = match if test { self.timed_test() } else { Ok(()) } {
            Ok(()) => {
                return staged
                    .into_iter()
                    .zip(results)
                    .map(|(p, r)| (p, Some(r)))
                    .collect()
            }
            Err(err) => err,
        };
        let staged_pushes: Vec<UpstreamName> = went_through
            .into_iter()
            .filter(|n| staged.iter().any(|p| &p.name == n))
            .collect();
        let not_undone = self.undo_all(&staged_pushes, changes, push);
        let accepted = self.isolate(staged, err, outcomes, true);
        self.note_not_undone(not_undone, outcomes);
        accepted.into_iter().map(|p| (p, None)).collect()
    }

    /// Undoes the pushes of `names`; returns those that failed, with why.
    fn undo_all(
        &mut self,
        names: &[UpstreamName],
        changes: &HashMap<&UpstreamName, &Change>,
        push: &mut dyn Push,
    ) -> Vec<(UpstreamName, String)> {
        names
            .iter()
            .filter_map(|n| {
                push.undo(changes[n])
                    .err()
                    .map(|e| (n.clone(), e.to_string()))
            })
            .collect()
    }

    /// A push that could not be undone: nginx serves the pushed set while the files say
    /// otherwise, so the upstream is no longer taken as live (its next change reloads), and its
    /// outcome says so.
    fn note_not_undone(
        &mut self,
        not_undone: Vec<(UpstreamName, String)>,
        outcomes: &mut HashMap<UpstreamName, ChangeOutcome>,
    ) {
        for (name, e) in not_undone {
            self.forget_live(&name);
            let note = format!(
                "\n(the set pushed live could not be taken back: {e}; \
                 nginx serves it until the next reload)"
            );
            match outcomes.get_mut(&name) {
                Some(ChangeOutcome::TestFailed { nginx_error }) => nginx_error.push_str(&note),
                Some(ChangeOutcome::RestoreFailed { cause, .. }) => cause.push_str(&note),
                Some(ChangeOutcome::WriteFailed { error }) => error.push_str(&note),
                _ => {}
            }
        }
    }
}
