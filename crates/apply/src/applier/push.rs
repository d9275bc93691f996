//! The live path's order (issue 11): the set is pushed as soon as the files are written, then
//! `nginx -t` tests them.
//!
//! A change of `server` lines only reaches nginx's traffic through the module's API, not through
//! the files: the test guards the files (the next reload reads them), the module validates the set
//! it takes. So the push need not wait for the test; it waits only for the files to be durable
//! (their journals first: the files always hold at least what nginx serves), and stands only if
//! the test passes. When the test fails, every push of the batch is undone before the files are
//! restored — a change nginx -t refuses is never reported applied, and nginx ends up serving what
//! the files say. The test runs after the pushes, not beside them: a process starting on the
//! same cores slows the `PUT` (p99 3.7 → 8.2 ms in the benchmark), and the pushes are short.
//!
//! The caller may also say a batch cannot fail the test (only values it checked by nginx's rules
//! differ from the live bytes); the test is then skipped for upstreams whose live bytes passed a
//! test of this Applier. `nginx -t` is a new process costing ~7 ms of CPU (mostly its own start:
//! dynamic linking, OpenSSL), and at ten changes a second that alone took the proxied traffic's
//! p99 from 0.95–0.97× to 1.7–1.9× of the no-change run (docs/live-api.md, runs S and T).

use std::collections::HashMap;

use tributary_core::UpstreamName;

use super::{Applier, Change, ChangeOutcome, Pending};

/// How a change is made live without a reload (the module's API), for
/// [`Applier::apply_live_batch`].
pub trait Push {
    /// Makes `change` live and confirms it (PUT the set, read it back); `Err(why)` sends the
    /// change to the reload path.
    fn push(&mut self, change: &Change) -> Result<(), String>;
    /// Puts back the set that was live before a successful [`Self::push`] of `change` (the test
    /// failed meanwhile). `Err(why)`: nginx may still serve the pushed set.
    fn undo(&mut self, change: &Change) -> Result<(), String>;
}

/// A staged change and, when it was pushed before the batch's test, the push's result (`None`:
/// not pushed yet — the test failed and the change was tested again on its own).
pub(super) type Tested = (Pending, Option<Result<(), String>>);

impl Applier {
    /// Stages `pending`, pushes each staged change, then tests (unless `test` is false). Test
    /// passed or not run: the changes
    /// with their pushes' results. Test failed: the pushes that succeeded are undone and the
    /// batch is restored and bisected as by [`Applier::apply_batch`]; the changes found good are
    /// returned without a push result (they are pushed after their test).
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
        let staged = self.stage_recording(pending, outcomes);
        if staged.is_empty() {
            return Vec::new();
        }
        let pushed: Vec<Result<(), String>> =
            staged.iter().map(|p| push.push(changes[&p.name])).collect();
        let err = match if test { self.timed_test() } else { Ok(()) } {
            Ok(()) => {
                return staged
                    .into_iter()
                    .zip(pushed)
                    .map(|(p, r)| (p, Some(r)))
                    .collect()
            }
            Err(err) => err,
        };
        let mut not_undone = Vec::new();
        for (p, r) in staged.iter().zip(&pushed) {
            if r.is_ok() {
                if let Err(e) = push.undo(changes[&p.name]) {
                    not_undone.push((p.name.clone(), e));
                }
            }
        }
        let accepted = self.isolate(staged, err, outcomes, true);
        for (name, e) in not_undone {
            // nginx serves the pushed set, the files say otherwise: the next change reloads.
            self.forget_live(&name);
            let note = format!(
                "\n(the set pushed live before the test could not be taken back: {e}; \
                 nginx serves it until the next reload)"
            );
            match outcomes.get_mut(&name) {
                Some(ChangeOutcome::TestFailed { nginx_error }) => nginx_error.push_str(&note),
                Some(ChangeOutcome::RestoreFailed { cause, .. }) => cause.push_str(&note),
                _ => {}
            }
        }
        accepted.into_iter().map(|p| (p, None)).collect()
    }
}
