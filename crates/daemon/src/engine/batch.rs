//! Batching, as pure functions: when a batch closes ([`BatchRules::next`]) and how the messages
//! of a batch become one list of changes ([`Batch::collect`]). The apply task only waits and
//! applies.
//!
//! Rules: a batch opens with a change (a removal or a stop is handled alone, at once). It closes
//! when no new message arrived for `quiet`, or `max` after it opened, or when a stop arrives.
//! While every change of the batch can go live (live mode, no reload to share, only
//! the `nginx -t`), `live_quiet` and `live_max` (at most `max`) take their place: changes that
//! arrive together still share one test, and a lone change is not held back for a grouping
//! that buys nothing. A change that needs a reload joining such a batch brings back `quiet` and
//! `max` (counted from the batch's opening). Which changes can go live is the caller's guess
//! (`all_live`); a wrong guess only changes how long the batch waits.
//! The same binding twice in one batch: the newer bytes win and every caller gets the outcome of
//! the newer one.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tributary_apply::Change;
use tributary_core::UpstreamName;

/// When a batch closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchRules {
    /// A batch closes when no new message arrived for this long...
    pub quiet: Duration,
    /// ...or this long after it opened, whichever comes first.
    pub max: Duration,
    /// `quiet` of a batch whose changes can all go live.
    pub live_quiet: Duration,
    /// `max` of a batch whose changes can all go live (never more than `max`).
    pub live_max: Duration,
}

/// A message for the apply task. `R`, `M`, `S` are the reply channels of a change, a removal and
/// a stop (generic so the rules are testable without channels).
pub(crate) enum Queued<R, M, S> {
    Change(Change, R),
    Remove(UpstreamName, M),
    Stop(S),
}

impl<R, M, S> Queued<R, M, S> {
    fn kind(&self) -> Kind {
        match self {
            Queued::Change(..) => Kind::Change,
            Queued::Remove(..) => Kind::Remove,
            Queued::Stop(_) => Kind::Stop,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Change,
    Remove,
    Stop,
}

/// What the apply task does after a message joined the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait for another message until this instant; if none comes, close.
    WaitUntil(Instant),
    /// Close the batch now.
    Close,
}

impl BatchRules {
    /// The step after the batch `msgs` (opened at `opened`, last message at `now`) grew;
    /// `all_live`: every message so far is a change that can go live.
    pub fn next<R, M, S>(
        &self,
        msgs: &[Queued<R, M, S>],
        opened: Instant,
        now: Instant,
        all_live: bool,
    ) -> Next {
        let (Some(first), Some(last)) = (msgs.first(), msgs.last()) else {
            return Next::Close;
        };
        if first.kind() != Kind::Change || last.kind() == Kind::Stop {
            return Next::Close;
        }
        let (quiet, max) = if all_live {
            (self.live_quiet, self.live_max.min(self.max))
        } else {
            (self.quiet, self.max)
        };
        let hard = opened + max;
        if now >= hard {
            return Next::Close;
        }
        Next::WaitUntil((now + quiet).min(hard))
    }
}

/// A closed batch: the changes to apply (one per binding, first-arrival order) with the replies
/// waiting for each, the removals and the stop requests.
pub(crate) struct Batch<R, M, S> {
    pub changes: Vec<Change>,
    /// `replies[i]` wait for the outcome of `changes[i]`.
    pub replies: Vec<Vec<R>>,
    pub removes: Vec<(UpstreamName, M)>,
    pub stops: Vec<S>,
}

impl<R, M, S> Batch<R, M, S> {
    /// Sorts the messages of one batch.
    pub fn collect(msgs: Vec<Queued<R, M, S>>) -> Batch<R, M, S> {
        let mut batch = Batch {
            changes: Vec::new(),
            replies: Vec::new(),
            removes: Vec::new(),
            stops: Vec::new(),
        };
        let mut index: HashMap<String, usize> = HashMap::new();
        for m in msgs {
            match m {
                Queued::Change(c, reply) => match index.get(c.name.as_str()) {
                    Some(&i) => {
                        batch.changes[i] = c;
                        batch.replies[i].push(reply);
                    }
                    None => {
                        index.insert(c.name.as_str().to_string(), batch.changes.len());
                        batch.changes.push(c);
                        batch.replies.push(vec![reply]);
                    }
                },
                Queued::Remove(n, reply) => batch.removes.push((n, reply)),
                Queued::Stop(reply) => batch.stops.push(reply),
            }
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Msg = Queued<u32, u32, u32>;

    const RULES: BatchRules = BatchRules {
        quiet: Duration::from_millis(100),
        max: Duration::from_secs(1),
        live_quiet: Duration::from_millis(2),
        live_max: Duration::from_millis(10),
    };

    /// In these tests a change can go live when its bytes start with "live".
    fn goes_live(m: &Msg) -> bool {
        matches!(m, Queued::Change(c, _) if c.bytes.starts_with(b"live"))
    }

    fn change(name: &str, bytes: &str, reply: u32) -> Msg {
        Queued::Change(
            Change {
                name: UpstreamName::parse(name).unwrap(),
                bytes: bytes.as_bytes().to_vec(),
            },
            reply,
        )
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Replays arrivals (offsets from the first message) through the rules the way the apply
    /// task does, and returns the size of each batch.
    fn batch_sizes(rules: BatchRules, arrivals: &[(u64, Msg)]) -> Vec<usize> {
        let t0 = Instant::now();
        let mut sizes = Vec::new();
        let mut i = 0;
        while i < arrivals.len() {
            let opened = t0 + ms(arrivals[i].0);
            let mut batch: Vec<&Msg> = vec![&arrivals[i].1];
            let mut all_live = goes_live(&arrivals[i].1);
            let mut now = opened;
            i += 1;
            loop {
                let view: Vec<Queued<(), (), ()>> = batch
                    .iter()
                    .map(|m| match m {
                        Queued::Change(c, _) => Queued::Change(c.clone(), ()),
                        Queued::Remove(n, _) => Queued::Remove(n.clone(), ()),
                        Queued::Stop(_) => Queued::Stop(()),
                    })
                    .collect();
                match rules.next(&view, opened, now, all_live) {
                    Next::Close => break,
                    Next::WaitUntil(until) => match arrivals.get(i) {
                        Some((at, m)) if t0 + ms(*at) <= until => {
                            now = t0 + ms(*at);
                            all_live &= goes_live(m);
                            batch.push(m);
                            i += 1;
                        }
                        _ => break,
                    },
                }
            }
            sizes.push(batch.len());
        }
        sizes
    }

    #[test]
    fn changes_close_together_form_one_batch() {
        let arrivals = [
            (0, change("a", "1", 1)),
            (50, change("b", "1", 2)),
            (120, change("c", "1", 3)),
        ];
        assert_eq!(batch_sizes(RULES, &arrivals), vec![3]);
    }

    #[test]
    fn a_quiet_gap_closes_the_batch() {
        let arrivals = [
            (0, change("a", "1", 1)),
            (50, change("b", "1", 2)),
            // 101 ms after the last message: the quiet time has passed.
            (151, change("c", "1", 3)),
        ];
        assert_eq!(batch_sizes(RULES, &arrivals), vec![2, 1]);
    }

    #[test]
    fn a_steady_trickle_closes_at_max() {
        // One change every 90 ms never leaves a quiet gap; the batch closes 1 s after it opened.
        let arrivals: Vec<(u64, Msg)> = (0..20)
            .map(|i| (i * 90, change(&format!("u{i}"), "1", i as u32)))
            .collect();
        let sizes = batch_sizes(RULES, &arrivals);
        // 0, 90, ..., 990 ms: 12 messages arrive within the first second.
        assert_eq!(sizes, vec![12, 8]);
    }

    #[test]
    fn wait_never_passes_max() {
        let t0 = Instant::now();
        let msgs = vec![change("a", "1", 1)];
        assert_eq!(
            RULES.next(&msgs, t0, t0, false),
            Next::WaitUntil(t0 + ms(100))
        );
        assert_eq!(
            RULES.next(&msgs, t0, t0 + ms(950), false),
            Next::WaitUntil(t0 + ms(1000))
        );
        assert_eq!(RULES.next(&msgs, t0, t0 + ms(1000), false), Next::Close);
    }

    #[test]
    fn a_stop_closes_the_batch_at_once() {
        let t0 = Instant::now();
        let msgs = vec![change("a", "1", 1), Queued::Stop(9)];
        assert_eq!(RULES.next(&msgs, t0, t0 + ms(10), false), Next::Close);
    }

    #[test]
    fn removals_and_stops_are_not_batched() {
        let t0 = Instant::now();
        let remove: Vec<Msg> = vec![Queued::Remove(UpstreamName::parse("a").unwrap(), 1)];
        assert_eq!(RULES.next(&remove, t0, t0, false), Next::Close);
        let stop: Vec<Msg> = vec![Queued::Stop(1)];
        assert_eq!(RULES.next(&stop, t0, t0, true), Next::Close);
        assert_eq!(RULES.next::<u32, u32, u32>(&[], t0, t0, true), Next::Close);
    }

    #[test]
    fn a_removal_joins_an_open_batch() {
        let arrivals = [
            (0, change("a", "1", 1)),
            (10, Queued::Remove(UpstreamName::parse("b").unwrap(), 2)),
            (20, change("c", "1", 3)),
        ];
        assert_eq!(batch_sizes(RULES, &arrivals), vec![3]);
    }

    #[test]
    fn zero_max_means_no_batching() {
        let rules = BatchRules {
            max: Duration::ZERO,
            ..RULES
        };
        let arrivals = [(0, change("a", "1", 1)), (0, change("b", "1", 2))];
        assert_eq!(batch_sizes(rules, &arrivals), vec![1, 1]);
        // Live batches never outlast `max` either.
        let arrivals = [(0, change("a", "live", 1)), (0, change("b", "live", 2))];
        assert_eq!(batch_sizes(rules, &arrivals), vec![1, 1]);
    }

    #[test]
    fn live_changes_close_after_the_live_quiet_time() {
        // 3 ms apart: more than live_quiet (2 ms), far less than quiet (100 ms).
        let live: Vec<(u64, Msg)> = (0..3)
            .map(|i| (i * 3, change(&format!("u{i}"), "live", i as u32)))
            .collect();
        assert_eq!(batch_sizes(RULES, &live), vec![1, 1, 1]);
        let reload: Vec<(u64, Msg)> = (0..3)
            .map(|i| (i * 3, change(&format!("u{i}"), "1", i as u32)))
            .collect();
        assert_eq!(batch_sizes(RULES, &reload), vec![3]);
        let t0 = Instant::now();
        let one = vec![change("a", "live", 1)];
        assert_eq!(RULES.next(&one, t0, t0, true), Next::WaitUntil(t0 + ms(2)));
    }

    #[test]
    fn live_changes_arriving_together_share_a_batch_up_to_live_max() {
        // One every millisecond: never 2 ms quiet, so the batch closes 10 ms after it opened.
        let arrivals: Vec<(u64, Msg)> = (0..15)
            .map(|i| (i, change(&format!("u{i}"), "live", i as u32)))
            .collect();
        assert_eq!(batch_sizes(RULES, &arrivals), vec![11, 4]);
        let t0 = Instant::now();
        let one = vec![change("a", "live", 1)];
        assert_eq!(
            RULES.next(&one, t0, t0 + ms(9), true),
            Next::WaitUntil(t0 + ms(10))
        );
        assert_eq!(RULES.next(&one, t0, t0 + ms(10), true), Next::Close);
    }

    #[test]
    fn a_change_that_needs_a_reload_brings_back_the_full_window() {
        // Live, then one that needs a reload 1 ms later: the batch now waits `quiet` (100 ms)
        // and takes the live change at 60 ms too.
        let arrivals = [
            (0, change("a", "live", 1)),
            (1, change("b", "1", 2)),
            (60, change("c", "live", 3)),
            (300, change("d", "live", 4)),
        ];
        assert_eq!(batch_sizes(RULES, &arrivals), vec![3, 1]);
        let t0 = Instant::now();
        let mixed = vec![change("a", "live", 1), change("b", "1", 2)];
        assert_eq!(
            RULES.next(&mixed, t0, t0 + ms(1), false),
            Next::WaitUntil(t0 + ms(101))
        );
    }

    #[test]
    fn collect_keeps_the_newer_bytes_and_every_reply() {
        let batch = Batch::collect(vec![
            change("a", "old", 1),
            change("b", "x", 2),
            Queued::Remove(UpstreamName::parse("gone").unwrap(), 7),
            change("a", "new", 3),
            Queued::Stop(8),
        ]);
        let names: Vec<&str> = batch.changes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["a", "b"]);
        assert_eq!(batch.changes[0].bytes, b"new");
        assert_eq!(batch.replies, vec![vec![1, 3], vec![2]]);
        assert_eq!(batch.removes.len(), 1);
        assert_eq!(batch.removes[0].0.as_str(), "gone");
        assert_eq!(batch.removes[0].1, 7);
        assert_eq!(batch.stops, vec![8]);
    }
}
