//! The selection state machine of an upstrand.
//!
//! [`UpstrandState`] is the per-worker state of one upstrand (round-robin cursors and blacklist);
//! [`Walk`] is the state of one request walking through the upstrand. Time (milliseconds of a
//! monotonic clock) and randomness (`rng(n)` returning an index below `n`) are inputs, so every
//! path is testable. No function divides by the length of an empty list.

use super::conf::{Member, UpstrandConf};
use super::status::{Answer, Origin};

/// Which list of the upstrand a member belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cycle {
    Normal,
    Backup,
}

impl Cycle {
    fn slot(self) -> usize {
        match self {
            Cycle::Normal => 0,
            Cycle::Backup => 1,
        }
    }
}

/// A member of an upstrand: list and position in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberRef {
    pub cycle: Cycle,
    pub index: usize,
}

fn list(conf: &UpstrandConf, cycle: Cycle) -> &[Member] {
    match cycle {
        Cycle::Normal => &conf.normal,
        Cycle::Backup => &conf.backup,
    }
}

/// The member behind a reference.
///
/// # Panics
/// When `m` does not come from a walk over `conf`.
pub fn member(conf: &UpstrandConf, m: MemberRef) -> &Member {
    &list(conf, m.cycle)[m.index]
}

/// A source of randomness: returns some index in `0..n` for `n > 0` (out-of-range values are
/// reduced modulo `n`).
pub type Rng<'a> = dyn FnMut(usize) -> usize + 'a;

/// Per-worker state of one upstrand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstrandState {
    cursor: [usize; 2],
    initialised: [bool; 2],
    /// Blacklisted until this time (ms); `0` means not blacklisted.
    until: [Vec<u64>; 2],
}

impl UpstrandState {
    pub fn new(conf: &UpstrandConf) -> Self {
        UpstrandState {
            cursor: [0, 0],
            initialised: [false, false],
            until: [vec![0; conf.normal.len()], vec![0; conf.backup.len()]],
        }
    }

    /// True when `m` is blacklisted at time `now`.
    pub fn is_blacklisted(&self, m: MemberRef, now: u64) -> bool {
        self.until[m.cycle.slot()]
            .get(m.index)
            .is_some_and(|u| now < *u)
    }

    fn blacklist(&mut self, m: MemberRef, until: u64) {
        if let Some(slot) = self.until[m.cycle.slot()].get_mut(m.index) {
            *slot = until;
        }
    }

    fn all_blacklisted(&self, now: u64) -> bool {
        self.until.iter().flatten().all(|u| now < *u)
    }

    fn whitelist_all(&mut self) {
        self.until.iter_mut().flatten().for_each(|u| *u = 0);
    }

    /// Where a request that enters `cycle` (of length `len > 0`) starts, advancing the per-worker
    /// cursor unless the order is `per_request`.
    fn take_start(
        &mut self,
        conf: &UpstrandConf,
        cycle: Cycle,
        len: usize,
        rng: &mut Rng,
    ) -> usize {
        debug_assert!(len > 0);
        let random = |rng: &mut Rng| rng(len) % len;
        if conf.per_request {
            return if conf.start_random { random(rng) } else { 0 };
        }
        let s = cycle.slot();
        if !self.initialised[s] {
            self.cursor[s] = if conf.start_random { random(rng) } else { 0 };
            self.initialised[s] = true;
        }
        let start = self.cursor[s] % len;
        self.cursor[s] = (start + 1) % len;
        start
    }

    /// First member of `cycle`, looking at positions `start + offset ..` (wrapping, each position
    /// at most once), that is not blacklisted at `now`. Returns its offset.
    fn first_available(
        &self,
        conf: &UpstrandConf,
        cycle: Cycle,
        start: usize,
        from_offset: usize,
        now: u64,
    ) -> Option<usize> {
        let len = list(conf, cycle).len();
        (from_offset..len).find(|off| {
            let m = MemberRef {
                cycle,
                index: (start + off) % len,
            };
            !self.is_blacklisted(m, now)
        })
    }
}

/// Why a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalReason {
    /// The answer is not in `next_upstream_statuses`.
    NotListed,
    /// A backend answered a POST/LOCK/PATCH and `non_idempotent` is not listed.
    NonIdempotent,
    /// `next_upstream_timeout` expired.
    TimedOut,
    /// No upstream left in the normal and backup cycles.
    Exhausted,
}

/// What to do after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Swallow the answer and run the request against this member.
    Next(MemberRef),
    /// The answer is final; deliver it, or with `intercept: Some(i)` deliver the response of
    /// `intercept_statuses` directive number `i` instead.
    Final {
        reason: FinalReason,
        intercept: Option<usize>,
    },
}

/// The start of a walk.
#[derive(Debug)]
pub struct Begin {
    pub walk: Walk,
    /// Every upstream was blacklisted and all were whitelisted again: log
    /// [`whitelist_message`].
    pub whitelisted: bool,
}

/// The log line for the whitelist-all event.
pub fn whitelist_message(upstrand: &str) -> String {
    format!("all upstreams in upstrand \"{upstrand}\" are blacklisted, whitelisting them")
}

/// The log line for a second upstrand in one request (the C module's wording).
pub fn multiple_message(original: &str, new: &str) -> String {
    format!(
        "accessing multiple upstrand variables in a single request is prohibited (original \
         upstrand is \"{original}\", new upstrand is \"{new}\")"
    )
}

/// One request's walk through an upstrand. Plain data (no heap), so the cdylib can keep it in an
/// nginx pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    cycle: Cycle,
    start: usize,
    offset: usize,
    /// When the first upstream of the walk was contacted (ms); `None` until then.
    started_ms: Option<u64>,
    steps: usize,
}

impl Walk {
    /// Starts a walk at time `now`: picks the first member. `None` only for an upstrand without
    /// members (which [`super::conf::UpstrandBuilder::finish`] never produces).
    pub fn begin(
        conf: &UpstrandConf,
        state: &mut UpstrandState,
        now: u64,
        rng: &mut Rng,
    ) -> Option<Begin> {
        if conf.normal.is_empty() && conf.backup.is_empty() {
            return None;
        }
        let whitelisted = state.all_blacklisted(now);
        if whitelisted {
            state.whitelist_all();
        }
        for cycle in [Cycle::Normal, Cycle::Backup] {
            let len = list(conf, cycle).len();
            if len == 0 {
                continue;
            }
            let start = state.take_start(conf, cycle, len, rng);
            if let Some(offset) = state.first_available(conf, cycle, start, 0, now) {
                let walk = Walk {
                    cycle,
                    start,
                    offset,
                    started_ms: None,
                    steps: 1,
                };
                return Some(Begin { walk, whitelisted });
            }
        }
        None
    }

    /// The member the request is running against now.
    pub fn current(&self, conf: &UpstrandConf) -> MemberRef {
        let len = list(conf, self.cycle).len().max(1);
        MemberRef {
            cycle: self.cycle,
            index: (self.start + self.offset) % len,
        }
    }

    /// How many members the walk has run against so far (the current one included).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// When the first upstream of the walk was contacted (ms), once [`Walk::contacted`] said so.
    pub fn started_ms(&self) -> Option<u64> {
        self.started_ms
    }

    /// Records that an upstream of the walk was contacted at `at` (ms). Only the first call
    /// counts: `next_upstream_timeout` is measured from the moment the first upstream was
    /// contacted, not from the start of the request (a client that uploads its body slowly
    /// does not use up the failover time).
    pub fn contacted(&mut self, at: u64) {
        self.started_ms.get_or_insert(at);
    }

    /// Takes the current member's answer at time `now` and decides the next step.
    /// `non_idempotent_method` is true for POST, LOCK and PATCH.
    pub fn on_answer(
        &mut self,
        conf: &UpstrandConf,
        state: &mut UpstrandState,
        answer: Answer,
        non_idempotent_method: bool,
        now: u64,
        rng: &mut Rng,
    ) -> Step {
        let current = self.current(conf);
        let listed = conf.next_statuses.matches(answer);
        if listed {
            if let Some(interval) = member(conf, current).blacklist_interval_ms {
                state.blacklist(current, now.saturating_add(interval));
            }
        }
        let finish = |reason| Step::Final {
            reason,
            intercept: conf.intercept_for(answer),
        };
        if !listed {
            return finish(FinalReason::NotListed);
        }
        if non_idempotent_method
            && answer.origin == Origin::Backend
            && !conf.next_statuses.non_idempotent
        {
            return finish(FinalReason::NonIdempotent);
        }
        // An answer proves contact at the latest now (the cdylib reports the exact moment).
        self.contacted(now);
        let started = self.started_ms.unwrap_or(now);
        if conf.next_timeout_ms > 0 && now.saturating_sub(started) >= conf.next_timeout_ms {
            return finish(FinalReason::TimedOut);
        }
        // Rest of the current cycle.
        if let Some(off) = state.first_available(conf, self.cycle, self.start, self.offset + 1, now)
        {
            self.offset = off;
            let next = self.current(conf);
            self.steps += 1;
            return Step::Next(next);
        }
        // From the normal cycle into the backup cycle.
        if self.cycle == Cycle::Normal && !conf.backup.is_empty() {
            let len = conf.backup.len();
            let start = state.take_start(conf, Cycle::Backup, len, rng);
            if let Some(off) = state.first_available(conf, Cycle::Backup, start, 0, now) {
                self.cycle = Cycle::Backup;
                self.start = start;
                self.offset = off;
                let next = self.current(conf);
                self.steps += 1;
                return Step::Next(next);
            }
        }
        finish(FinalReason::Exhausted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstrand::conf::{Matcher, UpstrandBuilder};

    fn conf(lines: &[&[&str]]) -> UpstrandConf {
        let known = ["u01", "u02", "u03", "b01", "b02"];
        let mut compile = |p: &str| -> Result<Matcher, String> {
            let p = p.trim_start_matches('^').to_string();
            Ok(Box::new(move |n: &str| n.starts_with(p.as_str())))
        };
        let mut b = UpstrandBuilder::new("us1").unwrap();
        for l in lines {
            b.directive(l, &known, &mut compile).unwrap();
        }
        b.finish().unwrap()
    }

    fn name(c: &UpstrandConf, m: MemberRef) -> &str {
        &member(c, m).name
    }

    /// Runs a whole request: `answers(name)` gives each upstream's answer. Returns visited names
    /// and the final step.
    fn run(
        c: &UpstrandConf,
        st: &mut UpstrandState,
        now: u64,
        post: bool,
        rng: &mut Rng,
        answers: &dyn Fn(&str) -> Answer,
    ) -> (Vec<String>, Step) {
        let begin = Walk::begin(c, st, now, rng).unwrap();
        let mut walk = begin.walk;
        let mut seen = vec![name(c, walk.current(c)).to_string()];
        loop {
            let a = answers(name(c, walk.current(c)));
            match walk.on_answer(c, st, a, post, now, rng) {
                Step::Next(m) => seen.push(name(c, m).to_string()),
                fin => {
                    assert_eq!(walk.steps(), seen.len());
                    return (seen, fin);
                }
            }
        }
    }

    fn no_rng(_: usize) -> usize {
        panic!("rng must not be used")
    }

    fn final_(reason: FinalReason, intercept: Option<usize>) -> Step {
        Step::Final { reason, intercept }
    }

    const BASE: &[&str] = &["upstream", "~^u"];
    const BACKUP: &[&str] = &["upstream", "~^b", "backup"];
    const FIVE: &[&str] = &["next_upstream_statuses", "5xx"];

    #[test]
    fn first_answer_not_listed_is_final() {
        let c = conf(&[BASE, FIVE]);
        let mut st = UpstrandState::new(&c);
        let (seen, step) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(200)
        });
        assert_eq!(seen, ["u01"]);
        assert_eq!(step, final_(FinalReason::NotListed, None));
    }

    #[test]
    fn default_order_is_round_robin_one_step_per_request() {
        let c = conf(&[BASE, FIVE]);
        let mut st = UpstrandState::new(&c);
        let firsts: Vec<String> = (0..7)
            .map(|_| {
                run(&c, &mut st, 0, false, &mut no_rng, &|_| {
                    Answer::backend(200)
                })
                .0[0]
                    .clone()
            })
            .collect();
        assert_eq!(firsts, ["u01", "u02", "u03", "u01", "u02", "u03", "u01"]);
    }

    #[test]
    fn failover_goes_through_normal_cycle_then_backup_cycle() {
        let c = conf(&[BASE, BACKUP, FIVE]);
        let mut st = UpstrandState::new(&c);
        let fail = |_: &str| Answer::backend(503);
        let (seen, step) = run(&c, &mut st, 0, false, &mut no_rng, &fail);
        assert_eq!(seen, ["u01", "u02", "u03", "b01", "b02"]);
        assert_eq!(step, final_(FinalReason::Exhausted, None));
        // Next request starts one step further in both cycles.
        let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &fail);
        assert_eq!(seen, ["u02", "u03", "u01", "b02", "b01"]);
    }

    #[test]
    fn stops_at_first_unlisted_answer_in_backup_cycle() {
        let c = conf(&[BASE, BACKUP, FIVE]);
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| {
            if n == "b01" {
                Answer::backend(204)
            } else {
                Answer::backend(500)
            }
        };
        let (seen, step) = run(&c, &mut st, 0, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "u02", "u03", "b01"]);
        assert_eq!(step, final_(FinalReason::NotListed, None));
    }

    #[test]
    fn no_statuses_means_no_failover() {
        let c = conf(&[BASE, BACKUP]);
        let mut st = UpstrandState::new(&c);
        let (seen, step) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::generated(502)
        });
        assert_eq!(seen, ["u01"]);
        assert_eq!(step, final_(FinalReason::NotListed, None));
    }

    #[test]
    fn error_and_timeout_words() {
        let c = conf(&[BASE, &["next_upstream_statuses", "error", "timeout"]]);
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| match n {
            "u01" => Answer::generated(502),
            "u02" => Answer::generated(504),
            _ => Answer::backend(502),
        };
        let (seen, step) = run(&c, &mut st, 0, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "u02", "u03"]);
        assert_eq!(step, final_(FinalReason::NotListed, None));
    }

    #[test]
    fn non_idempotent_requests() {
        let c = conf(&[BASE, &["next_upstream_statuses", "error", "503"]]);
        let mut st = UpstrandState::new(&c);
        let (seen, step) = run(&c, &mut st, 0, true, &mut no_rng, &|_| Answer::backend(503));
        assert_eq!(
            seen,
            ["u01"],
            "a POST that reached a backend is not retried"
        );
        assert_eq!(step, final_(FinalReason::NonIdempotent, None));
        // No connection at all: the request never reached a backend, so it moves on.
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| {
            if n == "u03" {
                Answer::backend(200)
            } else {
                Answer::generated(502)
            }
        };
        let (seen, _) = run(&c, &mut st, 0, true, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "u02", "u03"]);
        // With non_idempotent it moves on after real answers too.
        let c = conf(&[BASE, &["next_upstream_statuses", "503", "non_idempotent"]]);
        let mut st = UpstrandState::new(&c);
        let (seen, step) = run(&c, &mut st, 0, true, &mut no_rng, &|_| Answer::backend(503));
        assert_eq!(seen, ["u01", "u02", "u03"]);
        assert_eq!(step, final_(FinalReason::Exhausted, None));
    }

    #[test]
    fn per_request_always_starts_at_first() {
        let c = conf(&[BASE, BACKUP, FIVE, &["order", "per_request"]]);
        let mut st = UpstrandState::new(&c);
        for _ in 0..3 {
            let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
                Answer::backend(503)
            });
            assert_eq!(seen, ["u01", "u02", "u03", "b01", "b02"]);
        }
    }

    #[test]
    fn start_random_starts_cursor_at_random_then_round_robin() {
        let c = conf(&[BASE, BACKUP, FIVE, &["order", "start_random"]]);
        let mut st = UpstrandState::new(&c);
        let mut calls = Vec::new();
        let mut rng = |n: usize| {
            calls.push(n);
            n + 1 // out of range on purpose: reduced modulo n
        };
        let (seen, _) = run(&c, &mut st, 0, false, &mut rng, &|_| Answer::backend(200));
        assert_eq!(seen, ["u02"]);
        let (seen, _) = run(&c, &mut st, 0, false, &mut rng, &|_| Answer::backend(503));
        assert_eq!(seen, ["u03", "u01", "u02", "b02", "b01"]);
        let (seen, _) = run(&c, &mut st, 0, false, &mut rng, &|_| Answer::backend(503));
        assert_eq!(seen, ["u01", "u02", "u03", "b01", "b02"]);
        assert_eq!(calls, [3, 2], "randomness only seeds each cursor once");
    }

    #[test]
    fn start_random_per_request_draws_every_request() {
        let c = conf(&[BASE, FIVE, &["order", "start_random", "per_request"]]);
        let mut st = UpstrandState::new(&c);
        let draws = [2usize, 0, 1, 2];
        let mut i = 0;
        let mut rng = |n: usize| {
            assert_eq!(n, 3);
            i += 1;
            draws[i - 1]
        };
        let mut firsts = Vec::new();
        for _ in 0..4 {
            firsts
                .push(run(&c, &mut st, 0, false, &mut rng, &|_| Answer::backend(200)).0[0].clone());
        }
        assert_eq!(firsts, ["u03", "u01", "u02", "u03"]);
    }

    #[test]
    fn empty_lists_with_random_per_request_do_not_divide_by_zero() {
        // Only backups.
        let c = conf(&[
            &["upstream", "~^b", "backup"],
            FIVE,
            &["order", "start_random", "per_request"],
        ]);
        let mut st = UpstrandState::new(&c);
        let mut rng = |n: usize| {
            assert!(n > 0);
            7
        };
        let (seen, _) = run(&c, &mut st, 0, false, &mut rng, &|_| Answer::backend(503));
        assert_eq!(seen, ["b02", "b01"]);
        // Only normal members.
        let c = conf(&[BASE, FIVE, &["order", "start_random", "per_request"]]);
        let mut st = UpstrandState::new(&c);
        let (seen, step) = run(&c, &mut st, 0, false, &mut rng, &|_| Answer::backend(503));
        assert_eq!(seen, ["u02", "u03", "u01"]);
        assert_eq!(step, final_(FinalReason::Exhausted, None));
        // Round-robin with only backups.
        let c = conf(&[&["upstream", "b01", "backup"], FIVE]);
        let mut st = UpstrandState::new(&c);
        let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(503)
        });
        assert_eq!(seen, ["b01"]);
    }

    #[test]
    fn empty_conf_yields_no_walk() {
        let c = UpstrandConf {
            name: "e".into(),
            normal: vec![],
            backup: vec![],
            start_random: true,
            per_request: true,
            next_statuses: Default::default(),
            next_timeout_ms: 0,
            intercepts: vec![],
        };
        let mut st = UpstrandState::new(&c);
        assert!(Walk::begin(&c, &mut st, 0, &mut no_rng).is_none());
    }

    #[test]
    fn blacklisted_upstream_is_skipped_by_later_requests_until_interval_ends() {
        let c = conf(&[
            &["upstream", "u01", "blacklist_interval=10s"],
            &["upstream", "u02"],
            &["upstream", "u03"],
            FIVE,
            &["order", "per_request"],
        ]);
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| {
            if n == "u01" {
                Answer::backend(503)
            } else {
                Answer::backend(200)
            }
        };
        let (seen, _) = run(&c, &mut st, 1_000, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "u02"]);
        let m = MemberRef {
            cycle: Cycle::Normal,
            index: 0,
        };
        assert!(st.is_blacklisted(m, 1_000));
        let (seen, _) = run(&c, &mut st, 10_999, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u02"], "skipped while blacklisted");
        let (seen, _) = run(&c, &mut st, 11_000, false, &mut no_rng, &answers);
        assert_eq!(
            seen,
            ["u01", "u02"],
            "tried again once the interval has passed"
        );
    }

    #[test]
    fn blacklist_picks_first_healthy_in_cycle_order_not_the_one_before() {
        // Decision 1: with u01, u02 blacklisted and the cursor at u01, the request goes to u03.
        let c = conf(&[
            &["upstream", "~^u", "blacklist_interval=1m"],
            FIVE,
            &["order", "per_request"],
        ]);
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| {
            if n == "u03" {
                Answer::backend(200)
            } else {
                Answer::backend(500)
            }
        };
        let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "u02", "u03"]);
        let (seen, _) = run(&c, &mut st, 5, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u03"]);
    }

    #[test]
    fn only_listed_answers_blacklist() {
        let c = conf(&[
            &["upstream", "~^u", "blacklist_interval=1m"],
            FIVE,
            &["order", "per_request"],
        ]);
        let mut st = UpstrandState::new(&c);
        run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(404)
        });
        let (seen, _) = run(&c, &mut st, 1, false, &mut no_rng, &|_| {
            Answer::backend(404)
        });
        assert_eq!(seen, ["u01"]);
    }

    #[test]
    fn fully_blacklisted_normal_cycle_goes_to_backup() {
        let c = conf(&[
            &["upstream", "~^u", "blacklist_interval=1m"],
            BACKUP,
            FIVE,
            &["order", "per_request"],
        ]);
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| {
            if n.starts_with('u') {
                Answer::backend(500)
            } else {
                Answer::backend(200)
            }
        };
        let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "u02", "u03", "b01"]);
        let b = Walk::begin(&c, &mut st, 10, &mut no_rng).unwrap();
        assert!(!b.whitelisted);
        assert_eq!(name(&c, b.walk.current(&c)), "b01");
    }

    #[test]
    fn everything_blacklisted_whitelists_all() {
        let c = conf(&[
            &["upstream", "~^u", "blacklist_interval=1m"],
            &["upstream", "~^b", "backup", "blacklist_interval=1m"],
            FIVE,
        ]);
        let mut st = UpstrandState::new(&c);
        let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(500)
        });
        assert_eq!(seen.len(), 5);
        let b = Walk::begin(&c, &mut st, 1, &mut no_rng).unwrap();
        assert!(b.whitelisted);
        // Round-robin cursor moved on by one for the second request.
        assert_eq!(name(&c, b.walk.current(&c)), "u02");
        for i in 0..3 {
            assert!(!st.is_blacklisted(
                MemberRef {
                    cycle: Cycle::Normal,
                    index: i
                },
                1
            ));
        }
        assert_eq!(
            whitelist_message("us1"),
            "all upstreams in upstrand \"us1\" are blacklisted, whitelisting them"
        );
    }

    #[test]
    fn members_without_interval_never_blacklist() {
        let c = conf(&[BASE, FIVE]);
        let mut st = UpstrandState::new(&c);
        run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(500)
        });
        assert!(!st.all_blacklisted(0));
        let b = Walk::begin(&c, &mut st, 0, &mut no_rng).unwrap();
        assert!(!b.whitelisted);
    }

    #[test]
    fn next_upstream_timeout_makes_current_answer_final() {
        let c = conf(&[BASE, BACKUP, FIVE, &["next_upstream_timeout", "1s"]]);
        let mut st = UpstrandState::new(&c);
        let mut walk = Walk::begin(&c, &mut st, 0, &mut no_rng).unwrap().walk;
        assert_eq!(walk.started_ms(), None, "not contacted yet");
        walk.contacted(100);
        walk.contacted(700);
        assert_eq!(walk.started_ms(), Some(100), "the first contact counts");
        let step = walk.on_answer(&c, &mut st, Answer::backend(503), false, 1_099, &mut no_rng);
        assert_eq!(
            step,
            Step::Next(MemberRef {
                cycle: Cycle::Normal,
                index: 1
            })
        );
        let step = walk.on_answer(&c, &mut st, Answer::backend(503), false, 1_100, &mut no_rng);
        assert_eq!(step, final_(FinalReason::TimedOut, None));
        assert_eq!(walk.steps(), 2);
    }

    #[test]
    fn next_upstream_timeout_counts_from_first_contact_not_from_begin() {
        // A slow client body: the walk begins at 0, the first upstream is contacted at 5_000.
        let c = conf(&[BASE, FIVE, &["next_upstream_timeout", "1s"]]);
        let mut st = UpstrandState::new(&c);
        let mut walk = Walk::begin(&c, &mut st, 0, &mut no_rng).unwrap().walk;
        walk.contacted(5_000);
        let step = walk.on_answer(&c, &mut st, Answer::backend(503), false, 5_500, &mut no_rng);
        assert!(matches!(step, Step::Next(_)), "{step:?}");
        walk.contacted(5_600);
        let step = walk.on_answer(&c, &mut st, Answer::backend(503), false, 6_000, &mut no_rng);
        assert_eq!(step, final_(FinalReason::TimedOut, None));
        // Without a reported contact the first answer starts the clock.
        let mut walk = Walk::begin(&c, &mut st, 0, &mut no_rng).unwrap().walk;
        let step = walk.on_answer(&c, &mut st, Answer::backend(503), false, 9_000, &mut no_rng);
        assert!(matches!(step, Step::Next(_)), "{step:?}");
        assert_eq!(walk.started_ms(), Some(9_000));
    }

    #[test]
    fn zero_timeout_means_no_limit() {
        let c = conf(&[BASE, FIVE, &["next_upstream_timeout", "0"]]);
        let mut st = UpstrandState::new(&c);
        let mut walk = Walk::begin(&c, &mut st, 0, &mut no_rng).unwrap().walk;
        let step = walk.on_answer(
            &c,
            &mut st,
            Answer::backend(503),
            false,
            u64::MAX,
            &mut no_rng,
        );
        assert!(matches!(step, Step::Next(_)));
    }

    #[test]
    fn intercept_decision_applies_to_every_final_answer() {
        let c = conf(&[
            BASE,
            &["next_upstream_statuses", "502", "503"],
            &["next_upstream_timeout", "1s"],
            &["intercept_statuses", "503", "/first"],
            &["intercept_statuses", "5xx", "/second"],
        ]);
        // Exhausted with 503 -> first intercept.
        let mut st = UpstrandState::new(&c);
        let (_, step) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(503)
        });
        assert_eq!(step, final_(FinalReason::Exhausted, Some(0)));
        // Unlisted 500 -> second intercept.
        let (_, step) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(500)
        });
        assert_eq!(step, final_(FinalReason::NotListed, Some(1)));
        // 200 -> delivered.
        let (_, step) = run(&c, &mut st, 0, false, &mut no_rng, &|_| {
            Answer::backend(200)
        });
        assert_eq!(step, final_(FinalReason::NotListed, None));
        // After a timeout the answer is intercepted too.
        let mut walk = Walk::begin(&c, &mut st, 0, &mut no_rng).unwrap().walk;
        walk.contacted(0);
        let step = walk.on_answer(&c, &mut st, Answer::backend(502), false, 5_000, &mut no_rng);
        assert_eq!(step, final_(FinalReason::TimedOut, Some(1)));
    }

    #[test]
    fn backup_blacklisted_members_are_skipped_when_entering_backup_cycle() {
        let c = conf(&[
            &["upstream", "u01"],
            &["upstream", "b01", "backup", "blacklist_interval=1m"],
            &["upstream", "b02", "backup"],
            FIVE,
            &["order", "per_request"],
        ]);
        let mut st = UpstrandState::new(&c);
        let answers = |n: &str| {
            if n == "b02" {
                Answer::backend(200)
            } else {
                Answer::backend(500)
            }
        };
        let (seen, _) = run(&c, &mut st, 0, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "b01", "b02"]);
        let (seen, _) = run(&c, &mut st, 1, false, &mut no_rng, &answers);
        assert_eq!(seen, ["u01", "b02"]);
    }
}
