//! Live apply (issue 11): which changes go live through the module's `upstreams_api` and which
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
//! ([`tributary_apply::Push`]). Everything else takes the reload path, with the reason recorded:
//! a new upstream, a changed directive or `zone` size, host names, an API that is unreachable or
//! does not list the upstream — and any live failure, which falls back to one confirmed reload
//! for the batch's refused changes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tributary_apply::{Applier, Change, ChangeOutcome, Push};
use tributary_store::Applied;

use crate::live_api::{LiveApi, LiveServer, PushTimes, PutError, ZoneTooSmall};

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

    fn add_zone(&self, rendered: &str) -> String {
        tributary_core::add_zone_at_least(rendered, |n| self.get(n))
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
        self.zoned() && live_plan(a.live_bytes(&c.name), &self.file_bytes(c.bytes.clone())).is_ok()
    }

    /// [`Self::file_bytes`] of a text: what previews show (the test resolution, the UI form, the
    /// `resolve` dry run), so that they show the exact bytes this mode writes.
    pub fn file_text(&self, rendered: String) -> String {
        if self.zoned() {
            self.zone_floors.add_zone(&rendered)
        } else {
            rendered
        }
    }

    /// The bytes the applier gets: the rendered file, plus the `zone` line when zoned.
    pub fn file_bytes(&self, rendered: Vec<u8>) -> Vec<u8> {
        if !self.zoned() {
            return rendered;
        }
        match String::from_utf8(rendered) {
            Ok(text) => self.zone_floors.add_zone(&text).into_bytes(),
            Err(e) => e.into_bytes(),
        }
    }
}

/// What happened to one change, with the path taken and why (the outcome's `applied`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApplyResult {
    pub outcome: ChangeOutcome,
    /// Set when the change was applied (`Applied`), `None` otherwise.
    pub path: Option<(Applied, String)>,
}

impl ApplyResult {
    pub(crate) fn new(outcome: ChangeOutcome, why_reload: Option<String>) -> ApplyResult {
        let path = match &outcome {
            ChangeOutcome::Applied { reloaded: false } => Some((
                Applied::Live,
                "server set changed: PUT through the live API and confirmed by reading it back"
                    .to_string(),
            )),
            ChangeOutcome::Applied { reloaded: true } => Some((
                Applied::Reload,
                why_reload.unwrap_or_else(|| "reload".to_string()),
            )),
            _ => None,
        };
        ApplyResult { outcome, path }
    }
}

/// A rendered file's servers (`ADDR:PORT`, weight, drained) and its other lines.
type Split<'a> = (Vec<(String, u32, bool)>, Vec<&'a str>);

/// The servers of a rendered file (`    server ADDR weight=W;` lines, and `... down;` for a
/// server graceful removal drains, `super::drain`) and the other lines.
fn split(bytes: &[u8]) -> Option<Split<'_>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut servers = Vec::new();
    let mut rest = Vec::new();
    for line in text.lines() {
        match line.strip_prefix("    server ") {
            Some(s) => {
                let s = s.strip_suffix(';')?;
                let (s, drain) = match s.strip_suffix(" down") {
                    Some(s) => (s, true),
                    None => (s, false),
                };
                let (addr, weight) = s.split_once(" weight=")?;
                servers.push((addr.to_string(), weight.parse().ok()?, drain));
            }
            None => rest.push(line),
        }
    }
    Some((servers, rest))
}

/// Servers of a rendered file as the API takes them (a `down` line is a drained server: the
/// file's `down` keeps it out of rotation across a reload, the API's `drain` lets its requests
/// in flight finish).
fn to_live(servers: Vec<(String, u32, bool)>) -> Vec<LiveServer> {
    servers
        .into_iter()
        .map(|(a, w, drain)| LiveServer {
            drain,
            ..LiveServer::new(a, w)
        })
        .collect()
}

/// What [`live_plan`] found: the set to `PUT` and the set it replaces (put back if the change
/// is undone).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LivePlan {
    pub set: Vec<LiveServer>,
    pub before: Vec<LiveServer>,
}

/// Whether `addr:port` (IPv6 in brackets) is an address, not a host name.
fn is_ip_port(hp: &str) -> bool {
    let host = hp.rsplit_once(':').map(|(h, _)| h).unwrap_or(hp);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<std::net::IpAddr>().is_ok()
}

/// The set to PUT for a change from `live` (the bytes nginx runs, `None` for a new upstream) to
/// `new`, with the set it replaces, or why it needs a reload.
pub(crate) fn live_plan(live: Option<&[u8]>, new: &[u8]) -> Result<LivePlan, String> {
    let Some(live) = live else {
        return Err("new upstream (or its file is not confirmed live yet): needs a reload".into());
    };
    let (Some((before, old_rest)), Some((servers, new_rest))) = (split(live), split(new)) else {
        return Err("the file is not in the daemon's rendered form: needs a reload".into());
    };
    if old_rest != new_rest {
        let zone = |r: &[&str]| -> Option<String> {
            r.iter()
                .find(|l| l.starts_with("    zone "))
                .map(|l| l.to_string())
        };
        return Err(if zone(&old_rest) != zone(&new_rest) {
            format!(
                "the zone line changes ({} servers): needs a reload",
                servers.len()
            )
        } else {
            "the upstream's directives changed: needs a reload".into()
        });
    }
    if !old_rest.iter().any(|l| l.starts_with("    zone ")) {
        return Err("the running upstream has no zone: needs a reload".into());
    }
    if let Some((h, _, _)) = servers.iter().find(|(a, _, _)| !is_ip_port(a)) {
        return Err(format!(
            "host-name target {h}: live changes take addresses only, needs a reload"
        ));
    }
    Ok(LivePlan {
        set: to_live(servers),
        before: to_live(before),
    })
}

/// Applies a batch on a blocking thread: the changes [`live_plan`] accepts through the API (before
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
                ApplyMode::Reload => "apply mode reload",
                _ => "no live API configured (--live-api)",
            };
            return a
                .apply_batch(changes)
                .into_iter()
                .map(|(n, o)| (n, ApplyResult::new(o, Some(why.to_string()))))
                .collect();
        }
    };
    let mut live: Vec<(Change, LivePlan)> = Vec::new();
    let mut reload: Vec<(Change, String)> = Vec::new();
    for c in changes {
        let current = a.read_current(&c.name).filter(|b| a.is_live(&c.name, b));
        if current.as_deref() == Some(c.bytes.as_slice()) {
            // Unchanged: the applier says so without touching anything.
            reload.push((c.clone(), String::new()));
            continue;
        }
        match live_plan(current.as_deref(), &c.bytes) {
            Ok(plan) => live.push((c.clone(), plan)),
            Err(why) => reload.push((c.clone(), why)),
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
        let mut push = ApiPush {
            api,
            floors: &opts.zone_floors,
            rt,
            plans,
            listing: Some(listing),
            generations: Err("no list".to_string()),
            list_wait: Duration::ZERO,
            pushed: HashMap::new(),
        };
        // Every change here differs from the bytes nginx runs in server lines only (`live_plan`).
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
        let reasons: std::collections::HashMap<String, String> = reload
            .iter()
            .map(|(c, w)| (c.name.as_str().to_string(), w.clone()))
            .collect();
        let batch: Vec<Change> = reload.into_iter().map(|(c, _)| c).collect();
        for (n, o) in a.apply_batch(&batch) {
            let why = reasons.get(n.as_str()).cloned();
            out.push((n, ApplyResult::new(o, why)));
        }
    }
    out
}

/// The push of [`apply_batch`] over the module's API: PUTs a change's set guarded by the
/// upstream's generation (from the API's list, asked as the batch starts, then from each `PUT`
/// answer and read-back) and reads it back; takes it back, with the set of the file nginx ran before, when
/// the test that follows fails.
struct ApiPush<'a> {
    api: &'a LiveApi,
    /// Where a size the module names in a 507 is kept for the next `zone` line.
    floors: &'a ZoneFloors,
    rt: &'a tokio::runtime::Handle,
    /// Per upstream: the set to push and the set it replaces.
    plans: HashMap<String, LivePlan>,
    listing: Option<tokio::task::JoinHandle<Result<HashMap<String, u64>, String>>>,
    /// The generations of the listed upstreams (each updated by our own PUTs), or why there are
    /// none.
    generations: Result<HashMap<String, u64>, String>,
    /// How long the first push still waited for the list.
    list_wait: Duration,
    /// The pushes made (the last per upstream), for the log.
    pushed: HashMap<String, PushTimes>,
}

impl ApiPush<'_> {
    /// PUTs `set` to `name` under its generation; the new generation is kept.
    fn replace(&mut self, name: &str, set: &[LiveServer]) -> Result<PushTimes, PutError> {
        if let Some(task) = self.listing.take() {
            let t0 = Instant::now();
            self.generations = self
                .rt
                .block_on(task)
                .unwrap_or_else(|e| Err(e.to_string()));
            self.list_wait = t0.elapsed();
        }
        let generation = match &self.generations {
            Ok(g) => *g.get(name).ok_or_else(|| {
                "the live API does not list this upstream (no zone, or a balancer that cannot \
                 change live): needs a reload"
                    .to_string()
            })?,
            Err(e) => return Err(format!("live API unavailable: {e}").into()),
        };
        let times = self.rt.block_on(self.api.replace(name, set, generation))?;
        self.note_generation(name, times.generation);
        Ok(times)
    }

    fn note_generation(&mut self, name: &str, generation: u64) {
        if let Ok(g) = &mut self.generations {
            g.insert(name.to_string(), generation);
        }
    }

    /// Reads `name` back and compares it with `set`.
    fn confirm_set(&mut self, name: &str, set: &[LiveServer]) -> Result<Duration, String> {
        let (generation, took) = self.rt.block_on(self.api.confirm(name, set))?;
        self.note_generation(name, generation);
        Ok(took)
    }
}

/// A `PUT` the zone had no room for: logged, the size the module named kept as the upstream's
/// floor, and the reason the change falls back to a reload.
fn zone_too_small(
    name: &tributary_core::UpstreamName,
    t0: Instant,
    z: ZoneTooSmall,
    text: &str,
    floors: &ZoneFloors,
) -> String {
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
    e
}

/// A live failure: logged, and the reason the change falls back to a reload.
fn live_failed(name: &tributary_core::UpstreamName, t0: Instant, e: String) -> String {
    let e = format!("live apply failed, fell back to a reload: {e}");
    let push_ms = ms(t0.elapsed());
    tracing::warn!(upstream = %name, push_ms, error = %e, "live apply failed");
    e
}

impl Push for ApiPush<'_> {
    fn push(&mut self, c: &Change) -> Result<(), String> {
        let set = self.plans[c.name.as_str()].set.clone();
        let t0 = Instant::now();
        let times = match self.replace(c.name.as_str(), &set) {
            Ok(t) => t,
            Err(PutError {
                text,
                zone_too_small: Some(z),
            }) => return Err(zone_too_small(&c.name, t0, z, &text, self.floors)),
            Err(e) => return Err(live_failed(&c.name, t0, e.text)),
        };
        self.pushed.insert(c.name.as_str().to_string(), times);
        Ok(())
    }

    fn confirm(&mut self, c: &Change) -> Result<(), String> {
        let set = self.plans[c.name.as_str()].set.clone();
        let t0 = Instant::now();
        let took = self
            .confirm_set(c.name.as_str(), &set)
            .map_err(|e| live_failed(&c.name, t0, e))?;
        if let Some(times) = self.pushed.get_mut(c.name.as_str()) {
            times.readback = took;
            times.confirmed_at = Some(Instant::now());
        }
        Ok(())
    }

    fn undo(&mut self, c: &Change) -> Result<(), String> {
        let before = self.plans[c.name.as_str()].before.clone();
        self.pushed.remove(c.name.as_str());
        let r = self
            .replace(c.name.as_str(), &before)
            .map_err(|e| e.text)
            .and_then(|_| self.confirm_set(c.name.as_str(), &before).map(|_| ()));
        tracing::info!(upstream = %c.name, undone = r.is_ok(), "the set pushed live is taken back (its file could not be written, or nginx -t failed)");
        r
    }
}

fn ms(d: Duration) -> f64 {
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
fn log_live(
    pushed: &[(&tributary_core::UpstreamName, &[LiveServer], &PushTimes)],
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

#[cfg(test)]
mod tests {
    use super::*;

    const ZONED: &str = "# generated by tributary\nupstream api {\n    zone api 64k;\n    server 10.0.0.1:80 weight=1;\n    keepalive 8;\n}\n";

    #[test]
    fn server_changes_of_a_live_zoned_upstream_go_live() {
        let new = ZONED.replace("10.0.0.1:80 weight=1", "10.0.0.2:80 weight=3");
        let plan = live_plan(Some(ZONED.as_bytes()), new.as_bytes()).unwrap();
        assert_eq!(plan.set, vec![LiveServer::new("10.0.0.2:80".into(), 3)]);
        assert_eq!(plan.before, vec![LiveServer::new("10.0.0.1:80".into(), 1)]);
        let v6 = ZONED.replace("10.0.0.1:80", "[2001:db8::1]:80");
        assert!(live_plan(Some(ZONED.as_bytes()), v6.as_bytes()).is_ok());
    }

    #[test]
    fn everything_else_needs_a_reload_and_says_why() {
        let cases = [
            (None, ZONED.to_string(), "new upstream"),
            (
                Some(ZONED),
                ZONED.replace("keepalive 8;", "keepalive 16;"),
                "directives changed",
            ),
            (
                Some(ZONED),
                ZONED.replace("64k", "128k"),
                "zone line changes",
            ),
            (
                Some(ZONED),
                ZONED.replace("10.0.0.1:80", "app.internal:80"),
                "host-name target app.internal:80",
            ),
            (
                Some("# generated by tributary\nupstream api {\n    server 10.0.0.1:80 weight=1;\n}\n"),
                "# generated by tributary\nupstream api {\n    server 10.0.0.2:80 weight=1;\n}\n"
                    .to_string(),
                "no zone",
            ),
        ];
        for (old, new, why) in cases {
            let e = live_plan(old.map(str::as_bytes), new.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn a_size_named_by_a_507_is_the_floor_of_the_next_zone_line() {
        let live = LiveOptions {
            mode: ApplyMode::Live,
            api: Some(LiveApi::parse("unix:/run/x.sock").unwrap()),
            ..LiveOptions::default()
        };
        let file =
            "# generated by tributary\nupstream api {\n    server 10.0.0.1:80 weight=1;\n}\n";
        assert!(live.file_text(file.into()).contains("    zone api 64k;\n"));
        let name = tributary_core::UpstreamName::parse("api").unwrap();
        let why = zone_too_small(
            &name,
            Instant::now(),
            ZoneTooSmall {
                needed: 123_904,
                zone: 65_536,
            },
            "PUT api: HTTP 507: zone \"api\" too small",
            &live.zone_floors,
        );
        assert!(
            why.starts_with("zone too small (need 123904 bytes, zone is 65536)"),
            "{why}"
        );
        // A clone (the engine's) sees the floor too; other upstreams do not.
        let clone = live.clone();
        assert!(clone
            .file_text(file.into())
            .contains("    zone api 128k;\n"));
        let other = file.replace("api", "web");
        assert!(clone.file_text(other).contains("    zone web 64k;\n"));
        // The next change differs from the running file in its zone line: a reload.
        let running = live_plan(
            Some(tributary_core::add_zone(file).as_bytes()),
            &live.file_bytes(file.replace("10.0.0.1", "10.0.0.2").into_bytes()),
        );
        assert!(running.unwrap_err().contains("zone line changes"));
    }

    #[test]
    fn the_batching_guess_follows_the_bytes_nginx_runs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("upstreams")).unwrap();
        // The file found at open is taken as live. The guess adds the zone line as the batch does.
        let file = |servers: &str| {
            format!("# generated by tributary\nupstream api {{\n{servers}    keepalive 8;\n}}\n")
        };
        let running = tributary_core::add_zone(&file("    server 10.0.0.1:80 weight=1;\n"));
        std::fs::write(dir.path().join("upstreams/api.conf"), running).unwrap();
        let nginx = tributary_apply::CommandNginx::new(vec!["true".into()], vec!["true".into()]);
        let a = Applier::open(dir.path(), Box::new(nginx), Default::default()).unwrap();
        let change = |text: String| Change {
            name: tributary_core::UpstreamName::parse("api").unwrap(),
            bytes: text.into_bytes(),
        };
        let live = LiveOptions {
            mode: ApplyMode::Live,
            api: Some(LiveApi::parse("unix:/run/x.sock").unwrap()),
            ..LiveOptions::default()
        };
        let moved = change(file("    server 10.0.0.2:80 weight=1;\n"));
        assert!(live.goes_live(&a, &moved));
        let other = change(file("    server 10.0.0.2:80 weight=1;\n").replace("8;", "9;"));
        assert!(!live.goes_live(&a, &other));
        let unknown = Change {
            name: tributary_core::UpstreamName::parse("new").unwrap(),
            ..moved.clone()
        };
        assert!(!live.goes_live(&a, &unknown));
        let reload = LiveOptions {
            mode: ApplyMode::Reload,
            ..live
        };
        assert!(!reload.goes_live(&a, &moved));
    }

    #[test]
    fn zone_line_only_when_an_api_is_configured_outside_reload_mode() {
        let api = Some(LiveApi::parse("unix:/run/x.sock").unwrap());
        let file = b"# generated by tributary\nupstream a {\n    server 10.0.0.1:80 weight=1;\n}\n";
        for (mode, api, zoned) in [
            (ApplyMode::Reload, api.clone(), false),
            (ApplyMode::Auto, None, false),
            (ApplyMode::Auto, api.clone(), true),
            (ApplyMode::Live, api, true),
        ] {
            let o = LiveOptions {
                mode,
                api,
                ..LiveOptions::default()
            };
            let bytes = o.file_bytes(file.to_vec());
            assert_eq!(
                String::from_utf8(bytes)
                    .unwrap()
                    .contains("    zone a 64k;\n"),
                zoned,
                "{mode:?}"
            );
        }
    }
}
