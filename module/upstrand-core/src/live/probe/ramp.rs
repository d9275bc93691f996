//! Slow start's book of one worker: per ramping server, its credit ([`ramp_slot`]) and whether
//! its `down::SLOW_START` bit is set now; each slot it plans the bit changes
//! ([`RampBook::plan`]) and, once the module tried to make them under the lists' write sides,
//! learns what was made ([`RampBook::settle`]). Pure: the module owns the lists and the zone.
//!
//! A change the module could not make (the write sides stayed taken past the slot's wait) is
//! planned again next slot, the clearing of a finished ramp included: the server's ramp is
//! forgotten, and its `slow_start_since_ms` reset, only once its bit is cleared.

use std::collections::BTreeMap;

use super::{ramp_slot, HealthState, ProbeConf};

/// (upstream key, server name).
type Key = (usize, Vec<u8>);

/// A ramping server: its credit, and its bit as this worker last set it (None: not yet).
#[derive(Debug, Clone, Copy, Default)]
struct Ramp {
    credit: f64,
    sitting_out: Option<bool>,
}

/// One bit change a slot asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct BitChange {
    pub name: Vec<u8>,
    /// Set the bit (sit this slot out), or clear it.
    pub sit_out: bool,
    /// The clearing of a ramp that is over (or stopped: the server is not healthy).
    pub ramp_over: bool,
}

/// What one slot of one upstream asks for.
#[derive(Debug, Default, PartialEq)]
pub struct SlotPlan {
    key: usize,
    pub changes: Vec<BitChange>,
    /// Healthy servers whose ramp is over: `slow_start_since_ms` to reset once the bit is clear.
    ended: Vec<Vec<u8>>,
}

impl SlotPlan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.ended.is_empty()
    }
}

/// Every ramp of one worker, over its upstreams.
#[derive(Debug, Default)]
pub struct RampBook {
    ramps: BTreeMap<Key, Ramp>,
}

impl RampBook {
    pub const fn new() -> RampBook {
        RampBook {
            ramps: BTreeMap::new(),
        }
    }

    /// One slot of upstream `key` whose servers are `servers` (name, health state) at `now_ms`.
    pub fn plan<'a>(
        &mut self,
        key: usize,
        servers: impl IntoIterator<Item = (&'a [u8], &'a HealthState)>,
        conf: &ProbeConf,
        now_ms: u64,
    ) -> SlotPlan {
        let mut plan = SlotPlan {
            key,
            ..SlotPlan::default()
        };
        let mut present: Vec<&[u8]> = Vec::new();
        for (name, state) in servers {
            present.push(name);
            let k = (key, name.to_vec());
            match state.ramp_fraction(conf, now_ms) {
                Some(f) => {
                    let r = self.ramps.entry(k).or_default();
                    let sit_out = !ramp_slot(&mut r.credit, f);
                    if r.sitting_out != Some(sit_out) {
                        plan.changes.push(BitChange {
                            name: name.to_vec(),
                            sit_out,
                            ramp_over: false,
                        });
                    }
                }
                None => {
                    // Forgotten in `settle`, once the bit is clear.
                    let was = self.ramps.contains_key(&k);
                    if was || state.slow_start_since_ms != 0 {
                        plan.changes.push(BitChange {
                            name: name.to_vec(),
                            sit_out: false,
                            ramp_over: true,
                        });
                    }
                    if state.slow_start_since_ms != 0 && state.health == 0 {
                        plan.ended.push(name.to_vec());
                    }
                }
            }
        }
        // Servers no longer in the upstream (removed).
        self.ramps
            .retain(|(k, n), _| *k != key || present.contains(&n.as_slice()));
        plan
    }

    /// What the module made of `plan`: `applied[i]` is `Some(bit set)` for `plan.changes[i]`
    /// when it held the write sides, None when it could not take them. Returns the servers whose
    /// `slow_start_since_ms` the module resets now.
    pub fn settle(&mut self, plan: SlotPlan, applied: &[Option<bool>]) -> Vec<Vec<u8>> {
        let mut cleared: Vec<Vec<u8>> = Vec::new();
        for (c, set) in plan.changes.into_iter().zip(applied) {
            let Some(set) = set else { continue };
            let k = (plan.key, c.name);
            if c.ramp_over {
                self.ramps.remove(&k);
                cleared.push(k.1);
            } else if let Some(r) = self.ramps.get_mut(&k) {
                r.sitting_out = Some(*set);
            }
        }
        // A ramp whose clearing missed the write sides ends in a later slot.
        plan.ended
            .into_iter()
            .filter(|n| cleared.contains(n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(p: &str) -> ProbeConf {
        ProbeConf::parse(&p.split_whitespace().collect::<Vec<_>>()).unwrap()
    }

    /// The module's side of a slot: the server's bit in the lists, and its zone record.
    struct Server {
        bit: bool,
        state: HealthState,
    }

    impl Server {
        /// One slot at `now`; `locked`: the lists' write sides stay taken past the slot's wait.
        fn slot(&mut self, book: &mut RampBook, c: &ProbeConf, now: u64, locked: bool) {
            let plan = book.plan(7, [(&b"b2"[..], &self.state)], c, now);
            let applied: Vec<Option<bool>> = plan
                .changes
                .iter()
                .map(|ch| {
                    (!locked).then(|| {
                        self.bit = ch.sit_out;
                        ch.sit_out
                    })
                })
                .collect();
            for _ in book.settle(plan, &applied) {
                self.state.slow_start_since_ms = 0;
            }
        }
    }

    #[test]
    fn a_ramp_ramps_then_clears_its_bit_and_ends() {
        let c = conf("slow_start=1s");
        let mut book = RampBook::new();
        let mut s = Server {
            bit: false,
            state: HealthState::added(&c, 1000),
        };
        let mut sat_out = 0;
        for now in (1000..2000).step_by(20) {
            s.slot(&mut book, &c, now, false);
            sat_out += usize::from(s.bit);
        }
        // About half the slots of a linear ramp sat out.
        assert!(
            (20..=30).contains(&sat_out),
            "{sat_out} of 50 slots sat out"
        );
        s.slot(&mut book, &c, 2000, false);
        assert!(!s.bit);
        assert_eq!(s.state.slow_start_since_ms, 0);
        // Over: nothing more to do.
        assert!(book.plan(7, [(&b"b2"[..], &s.state)], &c, 2020).is_empty());
    }

    #[test]
    fn a_ramps_end_that_missed_the_write_sides_clears_the_bit_next_slot() {
        let c = conf("slow_start=1s");
        let mut book = RampBook::new();
        let mut s = Server {
            bit: false,
            state: HealthState::added(&c, 1000),
        };
        // The ramp's first slot sits out (its share is 0 then): the bit is set.
        s.slot(&mut book, &c, 1000, false);
        assert!(s.bit, "the bit is set in the ramp's first slot");
        // The ramp ends in a slot whose write sides stay taken: nothing is cleared...
        s.slot(&mut book, &c, 2000, true);
        assert!(s.bit);
        // ... and the next slots clear the bit, then forget the ramp.
        s.slot(&mut book, &c, 2020, false);
        assert!(!s.bit, "the bit stayed set after the ramp's end");
        assert_eq!(s.state.slow_start_since_ms, 0);
        assert!(book.plan(7, [(&b"b2"[..], &s.state)], &c, 2040).is_empty());
    }
}
