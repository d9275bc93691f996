//! Active health checks of live upstreams (`probe ...;` in a zoned `upstream {}`).
//!
//! - One probe per server per interval for the whole nginx: every worker runs a tick timer
//!   (`ffi/process.rs`), and per upstream only the worker holding the lease in the zone
//!   (`ffi/health.rs`) probes; the others take the lease over when its heartbeat goes stale
//!   (the owner died) or at once when the owner exits and gives it back.
//! - A round (the owner, every `interval`): the set is read under the gate and the lists' read
//!   locks (so servers added by a `PUT` are probed from the next round and removed ones no
//!   longer), the record table is rebuilt for that set (a kept server keeps its record, a
//!   removed one loses it), the peers' health bits are brought in line with their records, and
//!   one non-blocking probe per server starts.
//! - A probe's outcome updates the server's record (`HealthState::record`); when its health
//!   changes, the peer's `down::UNHEALTHY` / `down::CHECKING` bits are set under the lists'
//!   write locks (taken with a short deadline; a miss is corrected by the next round), so every
//!   worker's balancer skips it at once.
//! - Old workers after a reload (`ngx_exiting`) stop probing and give their leases back; the new
//!   configuration has new zones and its own workers probe them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ngx::ffi::{NGX_LOG_NOTICE, NGX_LOG_WARN};
use upstrand_core::live::down;
use upstrand_core::live::probe::{
    judge_answer, Health as HealthKind, HealthState, Outcome, ProbeConf, ProbeType, Transition,
    BODY_WINDOW,
};
use upstrand_core::live::render::UpstreamView;
use upstrand_core::live::stats::HealthChecks;

use super::zone::LiveUpstream;
use crate::ffi::health::{ProbeCounts, Rec};
use crate::ffi::log::log_cycle;
use crate::ffi::prober::{self, start_probe, ProbeDone, ProbeSpec, ProcessHooks, Ticker};

/// The tick while probes of a round wait to start.
const PENDING_TICK_MS: u64 = 5;

/// How long a probe result or a round waits for the record table's or the lists' write sides.
const WRITE_WAIT: Duration = Duration::from_millis(20);

/// Per-worker: the next round of each upstream this worker holds the lease of (by upstream
/// address), and the generation of the set its last round read.
static NEXT_ROUND: Mutex<BTreeMap<usize, (u64, u64)>> = Mutex::new(BTreeMap::new());

fn next_round() -> std::sync::MutexGuard<'static, BTreeMap<usize, (u64, u64)>> {
    NEXT_ROUND.lock().unwrap_or_else(|e| e.into_inner())
}

/// One probed upstream of the running configuration.
struct Job {
    key: usize,
    name: String,
    live: LiveUpstream,
    conf: Arc<ProbeConf>,
}

fn jobs() -> Vec<Job> {
    let running = crate::ffi::running_cycle();
    super::probed(running)
        .into_iter()
        .map(|(key, name, live, conf)| Job {
            key,
            name,
            live,
            conf,
        })
        .collect()
}

/// The `down` bits a record asks for.
fn bits_of(h: HealthKind) -> usize {
    match h {
        HealthKind::Healthy => 0,
        HealthKind::Unhealthy => down::UNHEALTHY,
        HealthKind::Checking => down::CHECKING,
    }
}

/// The worker hooks: start ticking; give the leases back on exit.
pub struct Workers;

impl ProcessHooks for Workers {
    fn init_process() {
        if !jobs().is_empty() {
            prober::arm_tick::<Tick>(1);
        }
    }

    fn exit_process() {
        prober::abort_all();
        release_all();
    }
}

fn release_all() {
    let me = prober::pid();
    for j in jobs() {
        if let Some(h) = j.live.health() {
            h.release(me);
        }
    }
    next_round().clear();
}

/// The tick.
pub struct Tick;

impl Ticker for Tick {
    fn tick() -> Option<u64> {
        if prober::exiting() {
            PENDING.with_borrow_mut(|p| p.clear());
            release_all();
            prober::disarm_tick();
            return None;
        }
        let now = crate::ffi::current_msec();
        let me = prober::pid();
        let mut next = 1000u64;
        for j in jobs() {
            let Some(h) = j.live.health() else { continue };
            if j.live.state().superseded() {
                continue;
            }
            let tick = if j.conf.slow_start_ms > 0 {
                super::slow_start::SLOT_MS
            } else {
                (j.conf.interval_ms / 4).max(5)
            };
            next = next.min(tick);
            // The owner renews every tick; a heartbeat older than an interval means it is gone.
            if !h.lease(me, now, j.conf.interval_ms) {
                next_round().remove(&j.key);
                continue;
            }
            let (due, seen) = next_round().get(&j.key).copied().unwrap_or((0, 0));
            let generation = j.live.state().generation();
            if now >= due {
                next_round().insert(j.key, (now + j.conf.interval_ms, generation));
                round(&j, now, true);
            } else if j.conf.slow_start_ms > 0 && generation != seen {
                // A PUT changed the set: servers it added start their ramp now, not at the
                // next round.
                next_round().insert(j.key, (due, generation));
                round(&j, now, false);
            }
            if j.conf.slow_start_ms > 0 {
                super::slow_start::step(j.key, j.live, &j.conf, now);
            }
        }
        if let Some(d) = start_due(now) {
            next = next.min(d.max(PENDING_TICK_MS));
        }
        Some(next)
    }
}

/// One server of a round.
struct Target {
    name: String,
    sockaddr: Vec<u8>,
    down: usize,
}

/// A round of `j` (this worker holds its lease): the record table follows the set, the peers'
/// health bits follow the records, and with `probe` one probe per server starts.
fn round(j: &Job, now: u64, probe: bool) {
    let Some(h) = j.live.health() else { return };
    let mut targets: Vec<Target> = probe_targets(j.live)
        .into_iter()
        .map(|(name, sockaddr, down)| Target {
            name,
            sockaddr,
            down,
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    targets.retain(|t| seen.insert(t.name.clone()));
    let Some(old) = h.read() else { return };
    // The servers of a new zone's first round are its configured ones; later new records are
    // servers a PUT added (slow start ramps those).
    let first = old.is_empty() && h.counts().0 == 0;
    let index: BTreeMap<&[u8], usize> =
        old.iter().enumerate().map(|(i, r)| (r.name(), i)).collect();
    let mut recs = Vec::with_capacity(targets.len());
    let mut from = Vec::with_capacity(targets.len());
    for t in &targets {
        let i = index.get(t.name.as_bytes()).copied();
        let state = match i.and_then(|i| old.get(i)) {
            Some(r) => r.state,
            None if first => HealthState::new_server(j.conf.mandatory),
            None => HealthState::added(&j.conf, now),
        };
        recs.push(Rec::new(&t.name, state));
        from.push(i);
    }
    let deadline = Instant::now() + WRITE_WAIT;
    let membership_changed =
        recs.len() != old.len() || recs.iter().zip(&old).any(|(a, b)| a.name() != b.name());
    if membership_changed && !h.rebuild(&recs, &from, deadline) {
        return; // the zone is full or the table busy: the next round tries again
    }
    // Bring the peers' health bits in line with the records (a missed write, a server added
    // under `mandatory` whose record is already healthy after a quick remove and re-add).
    let Some(current) = h.read() else { return };
    let wanted: BTreeMap<&[u8], usize> = current
        .iter()
        .map(|r| (r.name(), bits_of(r.state.health())))
        .collect();
    let mask = down::UNHEALTHY | down::CHECKING;
    let fix: Vec<(&str, usize)> = targets
        .iter()
        .filter_map(|t| {
            let w = *wanted.get(t.name.as_bytes())?;
            (t.down & mask != w).then_some((t.name.as_str(), w))
        })
        .collect();
    if !fix.is_empty() {
        if let Some(lists) = j.live.primary.write_both(Instant::now() + WRITE_WAIT) {
            for (name, bits) in &fix {
                lists.set_health_bits(Some(name.as_bytes()), *bits);
            }
        }
    }
    if !probe {
        return;
    }
    h.count_round(targets.len() as u64);
    let request = match j.conf.kind {
        ProbeType::Http => Some(j.conf.request(&j.name)),
        ProbeType::Tcp => None,
    };
    let running = crate::ffi::running_cycle();
    // Spread over the first half of the interval, so a round of many servers is many small
    // pieces of work between the worker's other events, not one long one.
    let n = targets.len().max(1) as u64;
    // The first round of a new zone starts at once: under `mandatory` every server waits for it.
    let spread = if first { 0 } else { j.conf.interval_ms / 2 };
    let mut queued = Pending::with_capacity(targets.len());
    for (i, t) in targets.into_iter().enumerate() {
        let mut sockaddr = t.sockaddr;
        if let Some(port) = j.conf.port {
            set_port(&mut sockaddr, port);
        }
        let spec = ProbeSpec {
            sockaddr,
            name: t.name.clone(),
            request: request.clone(),
            timeout_ms: j.conf.timeout_ms,
            max_read: BODY_WINDOW,
        };
        let token = Token {
            live: j.live,
            index: i,
            cycle: running,
            upstream: j.name.clone(),
            server: t.name,
            conf: j.conf.clone(),
        };
        queued.push_back((now + spread * i as u64 / n, spec, token));
    }
    PENDING.with_borrow_mut(|p| {
        p.append(&mut queued);
        // Rounds of several upstreams interleave: keep the queue in start order.
        p.make_contiguous().sort_by_key(|e| e.0);
    });
}

/// Probes of this worker's rounds not started yet: start time, what, token (in start order per
/// round).
type Pending = std::collections::VecDeque<(u64, ProbeSpec, Token)>;

thread_local! {
    // nginx runs a worker on one thread: the queue is that thread's.
    static PENDING: std::cell::RefCell<Pending> = const { std::cell::RefCell::new(Pending::new()) };
}

/// Starts the pending probes that are due; the delay to the next one, if any.
fn start_due(now: u64) -> Option<u64> {
    let mut due = Vec::new();
    let next = PENDING.with_borrow_mut(|p| {
        while p.front().is_some_and(|e| e.0 <= now) {
            if let Some(e) = p.pop_front() {
                due.push(e);
            }
        }
        p.front().map(|e| e.0)
    });
    for (_, spec, token) in due {
        start_probe::<Done>(spec, token);
    }
    next.map(|t| t.saturating_sub(now).max(1))
}

/// Writes `port` into an IPv4 or IPv6 socket address (the port is at the same place in both);
/// unix sockets have none.
fn set_port(sa: &mut [u8], port: u16) {
    let family = sa.first().copied().map(u16::from).unwrap_or(0)
        | (sa.get(1).copied().map(u16::from).unwrap_or(0) << 8);
    // AF_INET (2) or AF_INET6 (10), little-endian `sa_family`.
    if family == 2 || family == 10 {
        if let Some(p) = sa.get_mut(2..4) {
            p.copy_from_slice(&port.to_be_bytes());
        }
    }
}

/// What a probe carries back to its result.
pub struct Token {
    /// The upstream (valid while its configuration runs: checked with `cycle` first).
    live: LiveUpstream,
    /// The server's place in the record table when the round started (a hint).
    index: usize,
    cycle: usize,
    upstream: String,
    server: String,
    conf: Arc<ProbeConf>,
}

/// Where the probes' outcomes go.
pub struct Done;

impl ProbeDone for Done {
    type Token = Token;

    fn judge(t: &Token, data: &[u8], complete: bool) -> Option<Outcome> {
        judge_answer(&t.conf, data, complete)
    }

    fn done(t: Token, outcome: Outcome) {
        // A probe of a configuration that is no longer running (a reload) changes nothing.
        if t.cycle != crate::ffi::running_cycle() {
            return;
        }
        let Some(h) = t.live.health() else { return };
        let now = crate::ffi::current_msec();
        let mut change = None;
        h.modify(
            t.index,
            t.server.as_bytes(),
            Instant::now() + WRITE_WAIT,
            |r| {
                let tr = r.state.record(&t.conf, outcome, now);
                let c = &mut r.counts;
                c.checks = c.checks.wrapping_add(1);
                if matches!(outcome, Outcome::Fail { .. }) {
                    c.fails = c.fails.wrapping_add(1);
                }
                if tr == Transition::BecameUnhealthy {
                    c.unhealthy = c.unhealthy.wrapping_add(1);
                }
                change = Some((tr, r.state));
            },
        );
        let Some((tr, state)) = change else { return };
        if tr == Transition::None {
            return;
        }
        if let Some(lists) = t.live.primary.write_both(Instant::now() + WRITE_WAIT) {
            lists.set_health_bits(Some(t.server.as_bytes()), bits_of(state.health()));
            if state.ramp_fraction(&t.conf, now).is_some() {
                // Back (or in for the first time) under slow start: it sits out from now on,
                // and the ramp lets it in a growing share of the time.
                lists.set_slow_start(t.server.as_bytes(), true);
            }
        }
        match tr {
            Transition::BecameUnhealthy => log_cycle(
                NGX_LOG_WARN,
                &format!(
                    "upstream \"{}\": server {} is unhealthy after {} failed probes ({})",
                    t.upstream,
                    t.server,
                    state.fails,
                    state.error_text().unwrap_or_default()
                ),
            ),
            Transition::BecameHealthy => log_cycle(
                NGX_LOG_NOTICE,
                &format!(
                    "upstream \"{}\": server {} is healthy ({} passed probes)",
                    t.upstream, t.server, state.passes
                ),
            ),
            Transition::None => {}
        }
    }
}

/// Adds the health fields to `GET <loc>/NAME` of an upstream with `probe` `conf`.
pub fn decorate(view: &mut UpstreamView, live: LiveUpstream, conf: &ProbeConf) {
    let now = crate::ffi::current_msec();
    let recs = live.health().and_then(|h| h.read()).unwrap_or_default();
    let by_name: BTreeMap<&[u8], (HealthState, ProbeCounts)> = recs
        .iter()
        .map(|r| (r.name(), (r.state, r.counts)))
        .collect();
    for s in &mut view.servers {
        // A server added since the last round has no record yet: its state is a new server's.
        let (state, counts) = by_name
            .get(s.address.as_bytes())
            .copied()
            .unwrap_or_else(|| {
                (
                    HealthState::new_server(conf.mandatory),
                    ProbeCounts::default(),
                )
            });
        s.health = Some(state.view(conf, now));
        s.stats.get_or_insert_default().health_checks = Some(HealthChecks {
            checks: counts.checks,
            fails: counts.fails,
            unhealthy: counts.unhealthy,
            last_passed: (state.last_probe_ms != 0).then_some(state.last_error == 0),
        });
    }
    let mut pv = conf.view();
    if let Some(h) = live.health() {
        pv.owner_pid = h.owner();
        (pv.rounds, pv.probes) = h.counts();
    }
    view.probe = Some(pv);
}

/// The servers of `live` a round probes: name, socket address and `down` bits, read under the
/// gate's and each list's read side.
fn probe_targets(live: LiveUpstream) -> Vec<(String, Vec<u8>, usize)> {
    let _g = live.state().gate_read();
    let mut out = Vec::new();
    for list in [Some(live.primary), live.primary.backup()] {
        let Some(list) = list else { continue };
        let lock = list.read();
        for p in lock.peers() {
            out.push(p.probe_target());
        }
    }
    out
}
