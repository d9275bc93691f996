//! The steps of a batch ([`Applier::apply_batch`], [`Applier::apply_live_batch`]): sort the
//! changes ([`Applier::triage`]), stage and test them, finding culprits by bisection
//! ([`Applier::stage_and_isolate`], or [`Applier::push_then_test`] on the live path), make the
//! good ones live by push ([`Applier::push_accepted`]) or by one confirmed reload
//! ([`Applier::reload_rest`]), and report per name ([`Batch::finish`]).

use std::collections::HashMap;
use std::thread;
use std::time::Instant;

use tributary_core::{NeedsReload, UpstreamName};

use super::push::Tested;
use super::{
    join_errors, Applier, Change, ChangeOutcome, Outcomes, Pending, Push, ReloadCause, ReloadError,
    StepTimes, Unrestored,
};
use crate::fsutil::read_optional;

/// One batch on its way through the steps: the distinct names in the order they first appear,
/// each name's last change, and what is known so far per name.
pub(super) struct Batch<'c> {
    order: Vec<UpstreamName>,
    latest: HashMap<&'c UpstreamName, &'c Change>,
    /// The outcome of each name that has one yet.
    outcomes: Outcomes,
    /// For changes that took the reload path on the live path: why live failed.
    why_reload: HashMap<UpstreamName, NeedsReload>,
}

impl<'c> Batch<'c> {
    /// The distinct names of `changes`; when a name appears twice, its last change is used.
    fn new(changes: &'c [Change]) -> Batch<'c> {
        let mut order: Vec<UpstreamName> = Vec::new();
        let mut latest: HashMap<&UpstreamName, &Change> = HashMap::new();
        for c in changes {
            if latest.insert(&c.name, c).is_none() {
                order.push(c.name.clone());
            }
        }
        Batch {
            order,
            latest,
            outcomes: HashMap::new(),
            why_reload: HashMap::new(),
        }
    }

    /// One outcome per distinct name, in the order names first appear, with why live failed.
    fn finish(mut self) -> Vec<(UpstreamName, ChangeOutcome, Option<NeedsReload>)> {
        self.order
            .into_iter()
            .map(|n| {
                let o = self
                    .outcomes
                    .remove(&n)
                    .unwrap_or(ChangeOutcome::WriteFailed {
                        error: "internal: no outcome recorded".into(),
                    });
                let why = self.why_reload.remove(&n);
                (n, o, why)
            })
            .collect()
    }
}

impl Applier {
    /// The one body of [`Self::apply_batch`] (`push` = `None`: every tested change goes by reload)
    /// and [`Self::apply_live_batch`].
    pub(super) fn apply_changes(
        &mut self,
        changes: &[Change],
        push: Option<(&mut dyn Push, bool)>,
    ) -> Vec<(UpstreamName, ChangeOutcome, Option<NeedsReload>)> {
        let started = Instant::now();
        self.steps = StepTimes::default();
        let mut batch = Batch::new(changes);
        let pending = self.triage(&mut batch);
        let (mut push, test) = match push {
            Some((push, test)) => (Some(push), test),
            None => (None, true),
        };
        let accepted: Vec<Tested> = match push.as_deref_mut() {
            Some(push) => {
                let test = test || pending.iter().any(|p| !self.tested(&p.name));
                self.push_then_test(pending, &batch.latest, push, test, &mut batch.outcomes)
            }
            None => self
                .stage_and_isolate(pending, &mut batch.outcomes, true)
                .into_iter()
                .map(|p| (p, None))
                .collect(),
        };
        self.steps.ready = started.elapsed();
        let reload = self.push_accepted(&mut batch, accepted, push);
        self.reload_rest(&mut batch, reload);
        batch.finish()
    }

    /// Retries earlier failed restores, then sorts the batch: a change whose file is stuck in a
    /// failed restore, or cannot be read, or whose bytes are on disk and live gets its outcome
    /// now; the others are returned to be applied.
    fn triage(&mut self, batch: &mut Batch<'_>) -> Vec<Pending> {
        let stuck = self.retry_restores();
        let mut pending = Vec::new();
        for name in &batch.order {
            let change = batch.latest[name];
            if let Some(error) = stuck.iter().find(|(n, _)| n == name).map(|(_, e)| e) {
                batch.outcomes.insert(
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
                    batch.outcomes.insert(
                        name.clone(),
                        ChangeOutcome::WriteFailed {
                            error: e.to_string(),
                        },
                    );
                }
                Ok(Some(current)) if current == change.bytes && self.is_live(name, &current) => {
                    batch
                        .outcomes
                        .insert(name.clone(), ChangeOutcome::Unchanged);
                }
                Ok(previous) => pending.push(Pending {
                    name: name.clone(),
                    previous,
                    new: Some(change.bytes.clone()),
                }),
            }
        }
        pending
    }

    /// Makes the tested changes live by `push` where it went through (pushing now those tested
    /// on their own), settles them and notes them live. Returns the changes left for the reload:
    /// all of them without `push`, else those whose push failed (why goes to the batch).
    fn push_accepted(
        &mut self,
        batch: &mut Batch<'_>,
        accepted: Vec<Tested>,
        mut push: Option<&mut (dyn Push + '_)>,
    ) -> Vec<Pending> {
        let mut reload = Vec::new();
        let mut done = Vec::new();
        for (p, pushed) in accepted {
            let result = match (pushed, push.as_deref_mut()) {
                (Some(result), _) => result,
                // Tested on its own after the batch failed: its file is in place, so the push
                // can be confirmed right away.
                (None, Some(push)) => push
                    .push(batch.latest[&p.name])
                    .and_then(|()| push.confirm(batch.latest[&p.name])),
                (None, None) => {
                    reload.push(p);
                    continue;
                }
            };
            match result {
                Ok(()) => {
                    batch
                        .outcomes
                        .insert(p.name.clone(), ChangeOutcome::Applied { reloaded: false });
                    done.push(p);
                }
                Err(why) => {
                    batch.why_reload.insert(p.name.clone(), why);
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
        reload
    }

    /// Makes `reload` live with one confirmed reload, or restores them; records their outcomes.
    fn reload_rest(&mut self, batch: &mut Batch<'_>, reload: Vec<Pending>) {
        if reload.is_empty() {
            return;
        }
        match self.reload_or_undo(&reload) {
            Ok(()) => {
                for p in &reload {
                    batch
                        .outcomes
                        .insert(p.name.clone(), ChangeOutcome::Applied { reloaded: true });
                }
            }
            Err((cause, error, unrestored)) => {
                for p in &reload {
                    let o = match unrestored.iter().find(|(n, _)| n == &p.name) {
                        Some((_, e)) => ChangeOutcome::RestoreFailed {
                            cause: error.clone(),
                            error: e.clone(),
                        },
                        None => ChangeOutcome::ReloadFailed {
                            cause,
                            error: error.clone(),
                        },
                    };
                    batch.outcomes.insert(p.name.clone(), o);
                }
            }
        }
    }

    /// Stages `pending`, tests, and when the test fails finds the bad ones by bisection.
    /// Returns the changes left staged (tested good); failures go to `outcomes`.
    pub(super) fn stage_and_isolate(
        &mut self,
        pending: Vec<Pending>,
        outcomes: &mut Outcomes,
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
    pub(super) fn isolate(
        &mut self,
        staged: Vec<Pending>,
        err: crate::CommandError,
        outcomes: &mut Outcomes,
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
    pub(super) fn timed_test(&mut self) -> Result<(), crate::CommandError> {
        let t0 = Instant::now();
        let r = self.nginx.test();
        self.steps.test += t0.elapsed();
        self.steps.tests += 1;
        r
    }

    /// Waits for the reload gap, reloads and waits for the reload to be confirmed live.
    pub(super) fn reload_confirmed(&mut self) -> Result<(), ReloadError> {
        if let Some(last) = self.last_reload {
            let since = last.elapsed();
            if since < self.opts.min_reload_gap {
                thread::sleep(self.opts.min_reload_gap - since);
            }
        }
        let confirm = self.opts.confirm.clone();
        let before = match &confirm {
            Some(c) => Some(c.before()?),
            None => None,
        };
        let result = self.nginx.reload();
        self.last_reload = Some(Instant::now());
        result?;
        if let (Some(c), Some(b)) = (&confirm, &before) {
            c.wait(b)?;
        }
        Ok(())
    }

    /// Reloads (confirmed); on success drops the journals and notes the new bytes as live. On
    /// failure restores the staged changes, tests again, and returns the reload's cause, the text
    /// to record and the restores that failed.
    pub(super) fn reload_or_undo(
        &mut self,
        staged: &[Pending],
    ) -> Result<(), (ReloadCause, String, Unrestored)> {
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
                Err((
                    e.cause(),
                    format!("{e}\n{retest}"),
                    restore.err().unwrap_or_default(),
                ))
            }
        }
    }
}
