//! Live apply: which changes go live through the module's `upstreams_api` and which
//! need a reload, and running a batch on both paths.
//!
//! A change goes live when the upstream's file is already live in nginx and the new file differs
//! from it in its `server` lines only, each an address (no host name); the set is PUT
//! ([`crate::live_api::LiveApi::replace`]) once the file's journal exists, the file is written as
//! always, the set is read back once the file is in place ([`crate::live_api::LiveApi::confirm`]),
//! then `nginx -t` tests the files — for the upstream's first live change after a start, or every
//! one with `--live-test every` ([`LiveTest`]); no reload.
//! The change counts as applied only when both passed; a failed test takes the set back (the
//! previous file's servers, PUT under the generation our PUT left) before the file is restored
//! ([`tributary_apply::Push`]). Everything else takes the reload path, with the reason recorded
//! as a tag ([`ReloadReason`]) and a text: a new upstream, a changed directive or `zone` size,
//! host names, an API that is unreachable or does not list the upstream — and any live failure,
//! which falls back to one confirmed reload for the batch's refused changes.
//!
//! The decision is [`tributary_core::live_plan`] on two [`UpstreamFile`]s (the bytes nginx runs
//! and the bytes wanted, each parsed strictly: a file not in the daemon's rendered form reloads);
//! `push.rs` is the push over the API ([`tributary_apply::Push`]) and its log line.

mod push;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Instant;

use tributary_apply::{Applier, Change, ChangeOutcome};
use tributary_core::{NeedsReload, ReloadReason, Server, UpstreamFile};
use tributary_store::Applied;

use crate::live_api::{LiveApi, LiveServer, PushTimes};
use push::{log_live, ms, ApiPush};

/// `--apply`: how changes are made live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ApplyMode {
    /// Always reload nginx (the files are the seed's exact render).
    Reload,
    /// Server changes through the module's API (`--live-api` required), the rest by reload.
    Live,
    /// Live when `--live-api` is given and the API answers, else reload.
    #[default]
    Auto,
}

/// `--live-test`: which live changes run the test command (`nginx -t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LiveTest {
    /// An upstream's first live change after the daemon started (its file was not tested by this
    /// daemon yet). Later ones differ from a tested file only in server addresses and weights,
    /// which the daemon checks by nginx's rules, so the test could not fail because of them.
    #[default]
    First,
    /// Every live change (after its `PUT`; a failed test takes the set back).
    Every,
}

/// The live set-up of the engine: the mode, the API when there is one, and which live changes
/// are tested.
#[derive(Debug, Clone, Default)]
pub struct LiveOptions {
    pub mode: ApplyMode,
    pub api: Option<LiveApi>,
    pub test: LiveTest,
    /// Zone sizes the module said changes needed (507), per upstream.
    pub zone_floors: ZoneFloors,
}

/// Per upstream, the largest zone size (bytes) the module named when it refused a change for
/// want of room: the `zone` line written for it is at least that from then on (kept while the
/// daemon runs; shared by the clones of [`LiveOptions`]).
#[derive(Debug, Clone, Default)]
pub struct ZoneFloors(std::sync::Arc<std::sync::Mutex<HashMap<String, u64>>>);

impl ZoneFloors {
    /// The floor of `name` (0: none).
    pub fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .map(|m| m.get(name).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Raises the floor of `name` to `bytes`.
    pub fn raise(&self, name: &str, bytes: u64) {
        if let Ok(mut m) = self.0.lock() {
            let f = m.entry(name.to_string()).or_insert(0);
            *f = (*f).max(bytes);
        }
    }

    /// `file` with its `zone` line, at least the floor of its upstream.
    fn add_zone(&self, file: UpstreamFile) -> UpstreamFile {
        let floor = self.get(file.name.as_str());
        file.with_zone(floor)
    }
}

impl LiveOptions {
    /// Whether files carry the `zone` line (live or auto with an API).
    pub fn zoned(&self) -> bool {
        self.mode != ApplyMode::Reload && self.api.is_some()
    }

    /// Whether `c` looks like a change that goes live: zoned, and only the servers differ from
    /// the bytes nginx has confirmed live. A guess for batching ([`super::batch`]); the batch
    /// itself decides with the file on disk and the API's list.
    pub(crate) fn goes_live(&self, a: &Applier, c: &Change) -> bool {
        self.zoned() && decide(a.live_bytes(&c.name), &self.file_bytes(c.bytes.clone())).is_ok()
    }

    /// [`Self::file_bytes`] of a text: what previews show (the test resolution, the UI form, the
    /// `resolve` dry run), so that they show the exact bytes this mode writes.
    pub fn file_text(&self, rendered: String) -> String {
        match self
            .zoned()
            .then(|| UpstreamFile::parse(&rendered).ok())
            .flatten()
        {
            Some(file) => self.zone_floors.add_zone(file).render(),
            None => rendered,
        }
    }

    /// The bytes the applier gets: the rendered file, plus the `zone` line when zoned (a text
    /// not in the rendered form, e.g. with a `server` directive of the binding's own, stays as
    /// it is: it always reloads).
    pub fn file_bytes(&self, rendered: Vec<u8>) -> Vec<u8> {
        match self
            .zoned()
            .then(|| UpstreamFile::parse_bytes(&rendered).ok())
            .flatten()
        {
            Some(file) => self.zone_floors.add_zone(file).render().into_bytes(),
            None => rendered,
        }
    }
}

/// What happened to one change, with the path taken and why (the outcome's `applied`,
/// `applied_reason` and `reload_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApplyResult {
    pub outcome: ChangeOutcome,
    /// Set when the change was applied (`Applied`), `None` otherwise.
    pub path: Option<(Applied, String)>,
    /// For a change applied by a reload, why (when known).
    pub reload_reason: Option<ReloadReason>,
}

impl ApplyResult {
    pub(crate) fn new(outcome: ChangeOutcome, why_reload: Option<NeedsReload>) -> ApplyResult {
        let (path, reload_reason) = match &outcome {
            ChangeOutcome::Applied { reloaded: false } => (
                Some((
                    Applied::Live,
                    "server set changed: PUT through the live API and confirmed by reading it \
                     back"
                        .to_string(),
                )),
                None,
            ),
            ChangeOutcome::Applied { reloaded: true } => match why_reload {
                Some(w) => (Some((Applied::Reload, w.text)), Some(w.reason)),
                None => (Some((Applied::Reload, "reload".to_string())), None),
            },
            _ => (None, None),
        };
        ApplyResult {
            outcome,
            path,
            reload_reason,
        }
    }
}

/// Servers of a file as the API takes them (a `down` line is a drained server: the file's `down`
/// keeps it out of rotation across a reload, the API's `drain` lets its requests in flight
/// finish).
fn to_live(servers: &[Server]) -> Vec<LiveServer> {
    servers
        .iter()
        .map(|s| {
            let mut l = LiveServer::new(s.host_port(), u32::from(s.target.weight));
            l.drain = s.down;
            l
        })
        .collect()
}

/// What [`decide`] found: the set to `PUT` and the set it replaces (put back if the change is
/// undone).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LivePlan {
    pub set: Vec<LiveServer>,
    pub before: Vec<LiveServer>,
}

/// The set to PUT for a change from `live` (the bytes nginx runs, `None` for a new upstream) to
/// `new`, with the set it replaces, or why it needs a reload: [`tributary_core::live_plan`] on
/// the two files, parsed strictly ([`UpstreamFile::parse_bytes`]).
pub(crate) fn decide(live: Option<&[u8]>, new: &[u8]) -> Result<LivePlan, NeedsReload> {
    let not_rendered = |_| {
        NeedsReload::new(
            ReloadReason::NotRendered,
            "the file is not in the daemon's rendered form: needs a reload",
        )
    };
    let live = match live {
        Some(bytes) => Some(UpstreamFile::parse_bytes(bytes).map_err(not_rendered)?),
        None => None,
    };
    let new = UpstreamFile::parse_bytes(new).map_err(not_rendered)?;
    let plan = tributary_core::live_plan(live.as_ref(), &new)?;
    Ok(LivePlan {
        set: to_live(&plan.set),
        before: to_live(&plan.before),
    })
}

/// Applies a batch on a blocking thread: the changes [`decide`] accepts through the API (before
/// `nginx -t` runs), the others — and the live ones the API refuses — by one reload each path.
pub(crate) fn apply_batch(
    a: &mut Applier,
    opts: &LiveOptions,
    changes: &[Change],
    decided: &[Instant],
    rt: &tokio::runtime::Handle,
) -> Vec<(tributary_core::UpstreamName, ApplyResult)> {
    let started = Instant::now();
    let decided: HashMap<String, Instant> = changes
        .iter()
        .zip(decided)
        .map(|(c, d)| (c.name.as_str().to_string(), *d))
        .collect();
    let changes: Vec<Change> = changes
        .iter()
        .map(|c| Change {
            name: c.name.clone(),
            bytes: opts.file_bytes(c.bytes.clone()),
        })
        .collect();
    let changes = changes.as_slice();
    let api = match (opts.zoned(), &opts.api) {
        (true, Some(api)) => api,
        _ => {
            let why = match opts.mode {
                ApplyMode::Reload => NeedsReload::new(ReloadReason::ApplyMode, "apply mode reload"),
                _ => NeedsReload::new(
                    ReloadReason::NoLiveApi,
                    "no live API configured (--live-api)",
                ),
            };
            return a
                .apply_batch(changes)
                .into_iter()
                .map(|(n, o)| (n, ApplyResult::new(o, Some(why.clone()))))
                .collect();
        }
    };
    let mut live: Vec<(Change, LivePlan)> = Vec::new();
    let mut reload: Vec<(Change, Option<NeedsReload>)> = Vec::new();
    for c in changes {
        let current = a.read_current(&c.name).filter(|b| a.is_live(&c.name, b));
        if current.as_deref() == Some(c.bytes.as_slice()) {
            // Unchanged: the applier says so without touching anything.
            reload.push((c.clone(), None));
            continue;
        }
        match decide(current.as_deref(), &c.bytes) {
            Ok(plan) => live.push((c.clone(), plan)),
            Err(why) => reload.push((c.clone(), Some(why))),
        }
    }
    let mut out = Vec::new();
    if !live.is_empty() {
        // The API's list (which upstreams can go live, and their generations for the PUT's guard)
        // is asked now, while the journals are made: it is only needed for the push.
        let listing = {
            let api = api.clone();
            rt.spawn(async move { api.listing().await })
        };
        let (batch, plans): (Vec<Change>, HashMap<String, LivePlan>) = live
            .into_iter()
            .map(|(c, plan)| {
                let name = c.name.as_str().to_string();
                (c, (name, plan))
            })
            .unzip();
        let mut push = ApiPush::new(api, &opts.zone_floors, rt, plans, listing);
        // Every change here differs from the bytes nginx runs in server lines only (`decide`).
        let test = opts.test == LiveTest::Every;
        let results = a.apply_live_batch(&batch, &mut push, test);
        let made_live: Vec<(&tributary_core::UpstreamName, &[LiveServer], &PushTimes)> = results
            .iter()
            .filter(|(_, o, _)| *o == ChangeOutcome::Applied { reloaded: false })
            .filter_map(|(n, _, _)| {
                let times = push.pushed.get(n.as_str())?;
                Some((n, push.plans[n.as_str()].set.as_slice(), times))
            })
            .collect();
        log_live(
            &made_live,
            &decided,
            started,
            ms(push.list_wait),
            a.last_steps(),
        );
        for (n, o, why) in results {
            out.push((n, ApplyResult::new(o, why)));
        }
    }
    if !reload.is_empty() {
        let reasons: HashMap<String, Option<NeedsReload>> = reload
            .iter()
            .map(|(c, w)| (c.name.as_str().to_string(), w.clone()))
            .collect();
        let batch: Vec<Change> = reload.into_iter().map(|(c, _)| c).collect();
        for (n, o) in a.apply_batch(&batch) {
            let why = reasons.get(n.as_str()).cloned().flatten();
            out.push((n, ApplyResult::new(o, why)));
        }
    }
    out
}
