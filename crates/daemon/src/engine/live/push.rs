//! The push of a live batch over the module's API ([`ApiPush`], the applier's
//! [`tributary_apply::Push`]), the reasons a live change falls back to a reload, and the log line
//! of each change made live.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tributary_apply::{Change, Push, UndoError};
use tributary_core::{NeedsReload, ReloadReason, UpstreamName};

use super::{LivePlan, ZoneFloors};
use crate::live_api::{LiveApi, LiveApiError, LiveServer, PushTimes, ZoneTooSmall};

/// Why a push of one upstream did not go through.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum PushFailure {
    #[error(
        "the live API does not list this upstream (no zone, or a balancer that cannot change \
         live): needs a reload"
    )]
    NotListed,
    /// The API's list could not be read (or the location is read-only).
    #[error("live API unavailable: {0}")]
    Unavailable(LiveApiError),
    /// The `PUT` or the read-back failed.
    #[error(transparent)]
    Api(LiveApiError),
}

impl PushFailure {
    /// The kind of reload this failure leads to.
    pub(super) fn reason(&self) -> ReloadReason {
        match self {
            PushFailure::NotListed | PushFailure::Unavailable(LiveApiError::ReadOnly { .. }) => {
                ReloadReason::NotListed
            }
            PushFailure::Unavailable(_) => ReloadReason::ApiDown,
            PushFailure::Api(e) if e.is_down() => ReloadReason::ApiDown,
            PushFailure::Api(LiveApiError::Status { status: 507, .. }) => ReloadReason::ZoneFull,
            PushFailure::Api(_) => ReloadReason::LiveFailed,
        }
    }
}

type Listing = tokio::task::JoinHandle<Result<HashMap<String, u64>, LiveApiError>>;

/// The push of [`apply_batch`] over the module's API: PUTs a change's set guarded by the
/// upstream's generation (from the API's list, asked as the batch starts, then from each `PUT`
/// answer and read-back) and reads it back; takes it back, with the set of the file nginx ran before, when
/// the test that follows fails.
pub(super) struct ApiPush<'a> {
    api: &'a LiveApi,
    /// Where a size the module names in a 507 is kept for the next `zone` line.
    floors: &'a ZoneFloors,
    rt: &'a tokio::runtime::Handle,
    /// Per upstream: the set to push and the set it replaces.
    pub(super) plans: HashMap<String, LivePlan>,
    listing: Option<Listing>,
    /// The generations of the listed upstreams (each updated by our own PUTs), or why there are
    /// none.
    generations: Result<HashMap<String, u64>, LiveApiError>,
    /// How long the first push still waited for the list.
    pub(super) list_wait: Duration,
    /// The pushes made (the last per upstream), for the log.
    pub(super) pushed: HashMap<String, PushTimes>,
}

impl<'a> ApiPush<'a> {
    /// A push of `plans` over `api`, whose generations come from `listing` (asked as the batch
    /// starts).
    pub(super) fn new(
        api: &'a LiveApi,
        floors: &'a ZoneFloors,
        rt: &'a tokio::runtime::Handle,
        plans: HashMap<String, LivePlan>,
        listing: Listing,
    ) -> ApiPush<'a> {
        ApiPush {
            api,
            floors,
            rt,
            plans,
            listing: Some(listing),
            generations: Ok(HashMap::new()),
            list_wait: Duration::ZERO,
            pushed: HashMap::new(),
        }
    }

    /// PUTs `set` to `name` under its generation; the new generation is kept.
    fn replace(&mut self, name: &str, set: &[LiveServer]) -> Result<PushTimes, PushFailure> {
        if let Some(task) = self.listing.take() {
            let t0 = Instant::now();
            self.generations = self
                .rt
                .block_on(task)
                .unwrap_or_else(|e| Err(LiveApiError::Task(e.to_string())));
            self.list_wait = t0.elapsed();
        }
        let generation = match &self.generations {
            Ok(g) => *g.get(name).ok_or(PushFailure::NotListed)?,
            Err(e) => return Err(PushFailure::Unavailable(e.clone())),
        };
        let times = self
            .rt
            .block_on(self.api.replace(name, set, generation))
            .map_err(PushFailure::Api)?;
        self.note_generation(name, times.generation);
        Ok(times)
    }

    fn note_generation(&mut self, name: &str, generation: u64) {
        if let Ok(g) = &mut self.generations {
            g.insert(name.to_string(), generation);
        }
    }

    /// Reads `name` back and compares it with `set`.
    fn confirm_set(&mut self, name: &str, set: &[LiveServer]) -> Result<Duration, LiveApiError> {
        let (generation, took) = self.rt.block_on(self.api.confirm(name, set))?;
        self.note_generation(name, generation);
        Ok(took)
    }
}

/// A `PUT` the zone had no room for: logged, the size the module named kept as the upstream's
/// floor, and the reason the change falls back to a reload.
pub(super) fn zone_too_small(
    name: &UpstreamName,
    t0: Instant,
    z: ZoneTooSmall,
    text: &str,
    floors: &ZoneFloors,
) -> NeedsReload {
    floors.raise(name.as_str(), z.needed);
    let e = format!(
        "zone too small (need {} bytes, zone is {}): applied by a reload, which makes the zone \
         anew; a zone line the daemon writes for this upstream is at least {} from now on (one \
         more reload; a binding's own zone directive stays as written) ({text})",
        z.needed,
        z.zone,
        tributary_core::zone_size_text(z.needed.next_power_of_two())
    );
    let push_ms = ms(t0.elapsed());
    tracing::warn!(upstream = %name, push_ms, needed = z.needed, zone = z.zone, error = %e, "live apply refused: zone too small");
    NeedsReload::new(ReloadReason::ZoneFull, e)
}

/// A live failure: logged, and the reason the change falls back to a reload.
fn live_failed(name: &UpstreamName, t0: Instant, e: PushFailure) -> NeedsReload {
    let reason = e.reason();
    let e = format!("live apply failed, fell back to a reload: {e}");
    let push_ms = ms(t0.elapsed());
    tracing::warn!(upstream = %name, push_ms, reason = %reason, error = %e, "live apply failed");
    NeedsReload::new(reason, e)
}

impl Push for ApiPush<'_> {
    fn push(&mut self, c: &Change) -> Result<(), NeedsReload> {
        let set = self.plans[c.name.as_str()].set.clone();
        let t0 = Instant::now();
        let times = match self.replace(c.name.as_str(), &set) {
            Ok(t) => t,
            Err(PushFailure::Api(e)) => {
                return Err(match e.zone_too_small() {
                    Some(z) => zone_too_small(&c.name, t0, z, &e.to_string(), self.floors),
                    None => live_failed(&c.name, t0, PushFailure::Api(e)),
                })
            }
            Err(e) => return Err(live_failed(&c.name, t0, e)),
        };
        self.pushed.insert(c.name.as_str().to_string(), times);
        Ok(())
    }

    fn confirm(&mut self, c: &Change) -> Result<(), NeedsReload> {
        let set = self.plans[c.name.as_str()].set.clone();
        let t0 = Instant::now();
        let took = self
            .confirm_set(c.name.as_str(), &set)
            .map_err(|e| live_failed(&c.name, t0, PushFailure::Api(e)))?;
        if let Some(times) = self.pushed.get_mut(c.name.as_str()) {
            times.readback = took;
            times.confirmed_at = Some(Instant::now());
        }
        Ok(())
    }

    fn undo(&mut self, c: &Change) -> Result<(), UndoError> {
        let before = self.plans[c.name.as_str()].before.clone();
        self.pushed.remove(c.name.as_str());
        let r = self
            .replace(c.name.as_str(), &before)
            .and_then(|_| {
                self.confirm_set(c.name.as_str(), &before)
                    .map(|_| ())
                    .map_err(PushFailure::Api)
            })
            .map_err(UndoError::from);
        tracing::info!(upstream = %c.name, undone = r.is_ok(), "the set pushed live is taken back (its file could not be written, or nginx -t failed)");
        r
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One log line per change made live, with where its time went (the benchmark reads these):
/// `decided_to_visible_ms` from the decision (bytes rendered from a validated answer, handed to
/// the apply task) to the `PUT` answered, `decided_to_confirmed_ms` to the set read back equal
/// (after the new file is in place); `waited_ms` from the decision to the batch's start (queue
/// and batch window), then the batch's `write_ms` (journal, new file, their fsyncs, rename: after
/// the `PUT`, except the journal's link), `test_ms` (`nginx -t`, after the read-back; `tests` says
/// how many ran, 0 when `--live-test first` skipped it), `list_wait_ms` (how long the push still
/// waited for the API's list, asked while the batch started), and this change's `put_ms` and
/// `readback_ms`. `decided_unix_ms` places the decision on the wall clock, for comparing with
/// what a client of nginx sees (`first_server` tells which set it was).
pub(super) fn log_live(
    pushed: &[(&UpstreamName, &[LiveServer], &PushTimes)],
    decided: &HashMap<String, Instant>,
    started: Instant,
    list_wait_ms: f64,
    steps: tributary_apply::StepTimes,
) {
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    let unix_ms = |at: Instant| {
        wall.duration_since(std::time::UNIX_EPOCH)
            .map(|d| ms(d) - ms(now - at))
            .unwrap_or(0.0)
    };
    for (name, set, t) in pushed {
        let Some(&d) = decided.get(name.as_str()) else {
            continue;
        };
        tracing::info!(
            upstream = %name,
            servers = set.len(),
            first_server = set.first().map_or("", |s| s.address.as_str()),
            decided_to_visible_ms = ms(t.visible_at - d),
            decided_to_confirmed_ms = ms(t.confirmed_at.unwrap_or(t.visible_at) - d),
            waited_ms = ms(started.saturating_duration_since(d)),
            list_wait_ms,
            write_ms = ms(steps.write),
            test_ms = ms(steps.test),
            tests = steps.tests,
            put_ms = ms(t.put),
            readback_ms = ms(t.readback),
            decided_unix_ms = %format!("{:.3}", unix_ms(d)),
            "applied live"
        );
    }
}
