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

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use upstrand_core::live::probe::{ramp_slot, ProbeConf};

use super::zone::LiveUpstream;

/// The slot length: the tick of an upstream with slow start.
pub const SLOT_MS: u64 = 20;

/// How long a slot waits for the lists' write sides (a miss just repeats next slot).
const WRITE_WAIT: Duration = Duration::from_millis(5);

/// Per ramping server (upstream address, peer name): its credit and whether its bit is set now
/// (None: not set by this worker yet).
type Ramps = BTreeMap<(usize, Vec<u8>), (f64, Option<bool>)>;

static RAMPS: Mutex<Ramps> = Mutex::new(BTreeMap::new());

fn ramps() -> std::sync::MutexGuard<'static, Ramps> {
    RAMPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// One slot of upstream `key` (this worker holds its lease).
pub fn step(key: usize, live: LiveUpstream, conf: &ProbeConf, now: u64) {
    let Some(h) = live.health() else { return };
    let Some(recs) = h.read() else { return };
    // (name, sit out), and the names whose ramp just ended.
    let mut changes: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut ended: Vec<Vec<u8>> = Vec::new();
    {
        let mut st = ramps();
        for r in &recs {
            let k = (key, r.name().to_vec());
            match r.state.ramp_fraction(conf, now) {
                Some(f) => {
                    let e = st.entry(k).or_insert((0.0, None));
                    let sit_out = !ramp_slot(&mut e.0, f);
                    if e.1 != Some(sit_out) {
                        changes.push((r.name().to_vec(), sit_out));
                    }
                }
                None => {
                    let was = st.remove(&k).is_some();
                    if was || r.state.slow_start_since_ms != 0 {
                        changes.push((r.name().to_vec(), false));
                    }
                    if r.state.slow_start_since_ms != 0 && r.state.health == 0 {
                        ended.push(r.name().to_vec());
                    }
                }
            }
        }
        // Servers no longer in the table (removed).
        let names: std::collections::BTreeSet<&[u8]> = recs.iter().map(|r| r.name()).collect();
        st.retain(|(k, n), _| *k != key || names.contains(n.as_slice()));
    }
    if changes.is_empty() && ended.is_empty() {
        return;
    }
    // Made before the write sides are taken: nothing allocates while they are held.
    let mut applied: Vec<Option<bool>> = vec![None; changes.len()];
    if let Some(lists) = live.primary.write_both(Instant::now() + WRITE_WAIT) {
        for ((name, sit_out), out) in changes.iter().zip(applied.iter_mut()) {
            *out = Some(lists.set_slow_start(name, *sit_out));
        }
    }
    {
        let mut st = ramps();
        for ((name, _), set) in changes.into_iter().zip(applied) {
            if let (Some(e), Some(set)) = (st.get_mut(&(key, name)), set) {
                e.1 = Some(set);
            }
        }
    }
    for name in ended {
        h.modify(usize::MAX, &name, Instant::now() + WRITE_WAIT, |r| {
            r.state.slow_start_since_ms = 0;
        });
    }
}
