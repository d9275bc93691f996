//! Slow start (`probe ... slow_start=T`): a server a `PUT` added, or one that came back
//! from unhealthy (or passed its first probe under `mandatory`), ramps from no traffic to its full
//! share over `T`.
//!
//! nginx's balancers have no per-peer ramp, and a peer's `weight` is its configured weight (what
//! `GET` shows and a `PUT` sets), so the ramp works in time slots of [`SLOT_MS`]: the prober that
//! holds the upstream's lease sets the peer's `down::SLOW_START` bit in the slots it sits out and
//! clears it in the others, so that it is in rotation a fraction `elapsed / T` of the time
//! (`upstrand_core::live::probe::ramp_slot`), and gets that fraction of what its weight gives it
//! (round robin and least_conn alike: both skip a peer whose `down` is not 0). The bit is set only
//! while another server of the same list is in rotation. Per-worker credit; a new lease holder
//! starts its own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use upstrand_core::live::probe::{ProbeConf, RampBook};

use super::zone::LiveUpstream;

/// The slot length: the tick of an upstream with slow start.
pub const SLOT_MS: u64 = 20;

/// How long a slot waits for the lists' write sides (a miss just repeats next slot).
const WRITE_WAIT: Duration = Duration::from_millis(5);

/// This worker's ramps (credit and bit per ramping server; see [`RampBook`]).
static RAMPS: Mutex<RampBook> = Mutex::new(RampBook::new());

fn ramps() -> std::sync::MutexGuard<'static, RampBook> {
    RAMPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// One slot of upstream `key` (this worker holds its lease).
pub fn step(key: usize, live: LiveUpstream, conf: &ProbeConf, now: u64) {
    let Some(h) = live.health() else { return };
    let Some(recs) = h.read() else { return };
    let plan = ramps().plan(key, recs.iter().map(|r| (r.name(), &r.state)), conf, now);
    if plan.is_empty() {
        return;
    }
    // Made before the write sides are taken: nothing allocates while they are held.
    let mut applied: Vec<Option<bool>> = vec![None; plan.changes.len()];
    if let Some(lists) = live.primary.write_both(Instant::now() + WRITE_WAIT) {
        for (c, out) in plan.changes.iter().zip(applied.iter_mut()) {
            *out = Some(lists.set_slow_start(&c.name, c.sit_out));
        }
    }
    // A ramp ends (its `slow_start_since_ms` reset) only once its bit is clear.
    let ended = ramps().settle(plan, &applied);
    for name in ended {
        h.modify(usize::MAX, &name, Instant::now() + WRITE_WAIT, |r| {
            r.state.slow_start_since_ms = 0;
        });
    }
}
