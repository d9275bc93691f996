//! The live upstream API (`upstreams_api;`): change the servers of an upstream with a
//! shared-memory `zone` at run time, for every worker at once, without a reload.
//!
//! - `mod.rs` (this file): the directive, the configuration-time registration of upstreams and
//!   the process-local registry that maps an upstream to its live state.
//! - [`crate::ffi::probe`]: which balancer an upstream uses.
//! - [`zone`]: the state in the zone, `PUT` application (which retires busy peers).
//! - [`retired`]: freeing retired peers once idle, and the `retired_warn` line.
//! - [`crate::ffi::peers`]: every access to nginx's round-robin peer structures (the
//!   version-sensitive part).
//! - [`balancer`]: per-request wrappers around the balancer.
//! - [`handler`]: the HTTP handler (`GET`/`PUT`, JSON answers).
//! - [`health`]: active health checks (`probe ...;`).
//! - [`plus`]: the NGINX Plus-compatible API (`upstreams_api plus;`).
//!
//! The JSON, validation, planning and error texts are in `upstrand_core::live`. The operator's
//! documentation is `docs/live-api.md`.

pub mod balancer;
pub mod handler;
pub mod health;
pub mod plus;
pub mod retired;
pub mod slow_start;
pub mod zone;

use core::sync::atomic::Ordering;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_upstream_srv_conf_t, NGX_CONF_ANY, NGX_HTTP_LOC_CONF,
    NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_UPS_CONF, NGX_LOG_EMERG,
};
use upstrand_core::live::down;
use upstrand_core::live::probe::ProbeConf;

use crate::ffi::conf::{ConfExt, ConfPart, Directive};
use crate::ffi::peers::Peers;
use crate::ffi::pool::Cleanup;
use crate::ffi::probe::{self, Balancer};
use crate::ffi::request::set_content_handler;
use crate::ffi::upstream::{PeerInitFn, Upstream};
use crate::ffi::zone::{LiveState, LiveUpstream, ShmZone, ZoneData, ZoneInit, ZoneInitFn};
use crate::ffi::{command, ConfFail, Status};

/// `upstreams_api [plus] [write=on|off] [host=NAME ...];` in a `location` (`plus`: the NGINX
/// Plus-compatible API, [`plus`]).
pub const COMMAND: ngx_command_t = command::<SetUpstreamsApi>(
    c"upstreams_api",
    NGX_HTTP_LOC_CONF | NGX_CONF_ANY,
    NGX_HTTP_LOC_CONF_OFFSET,
);

/// `probe PARAMS;` in an `upstream {}` block (active health checks, [`health`]).
pub const PROBE_COMMAND: ngx_command_t =
    command::<SetProbe>(c"probe", NGX_HTTP_UPS_CONF | NGX_CONF_ANY, 0);

/// `(cycle, upstream address) → probe` of the configurations being read and running (checked
/// and moved into the registry's entries by [`init_main_conf`]).
static PROBES: Mutex<BTreeMap<(usize, usize), Arc<ProbeConf>>> = Mutex::new(BTreeMap::new());

struct SetProbe;

impl Directive for SetProbe {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        let up = crate::ffi::upstream::current(cf).ok_or(ConfFail::Text(
            "\"probe\" is allowed only in an upstream block",
        ))?;
        let texts = cf.param_texts();
        let params: Vec<&str> = texts.iter().map(String::as_str).collect();
        let conf = ProbeConf::parse(&params)?;
        let mut p = PROBES.lock().unwrap_or_else(|e| e.into_inner());
        let key = (cf.cycle as usize, up.as_ptr() as usize);
        if p.contains_key(&key) {
            return Err(ConfFail::Text("\"probe\" directive is duplicate"));
        }
        p.insert(key, Arc::new(conf));
        Ok(())
    }
}

/// The probed live upstreams of configuration `cycle`: address, name, live state, probe.
pub fn probed(cycle: usize) -> Vec<(usize, String, LiveUpstream, Arc<ProbeConf>)> {
    registry()
        .iter()
        .filter(|(_, e)| e.cycle == cycle)
        .filter_map(|(k, e)| Some((*k, e.name.clone(), e.live()?, e.probe.clone()?)))
        .collect()
}

/// The live API's part of a location's configuration (not inherited: the directive sets the
/// location's content handler).
#[derive(Default)]
pub struct ApiLocation {
    /// `upstreams_api` of this location.
    pub access: Option<upstrand_core::live::Access>,
}

/// What the registry knows about one `upstream {}` block of a configuration.
pub struct Entry {
    /// The configuration (cycle) it belongs to (its address, compared only).
    cycle: usize,
    /// The upstream.
    pub up: Upstream,
    /// Its name.
    pub name: String,
    /// Its zone, when it has one.
    shm_zone: Option<ShmZone>,
    /// Its zone's name, when it has one.
    pub zone: Option<String>,
    /// Its balancer.
    pub balancer: Balancer,
    /// It has `server ... resolve` servers (nginx 1.27.3+), which nginx keeps up to date
    /// itself: never live.
    pub resolves_names: bool,
    /// The balancer's `peer.init` (wrapped by [`balancer::LivePeerInit`] for live upstreams).
    orig_init: Option<PeerInitFn>,
    /// The zone's `init` (wrapped by [`ZoneInitWrapper`]).
    orig_zone_init: ZoneInitFn,
    /// Live state in the zone, once the zone exists (live upstreams only).
    pub state: Option<LiveState>,
    /// Its `probe` (active health checks).
    pub probe: Option<Arc<ProbeConf>>,
}

// SAFETY: nginx runs each process single-threaded; the handles are only used on that thread.
unsafe impl Send for Entry {}

impl Entry {
    /// The live upstream (state and zone list), for upstreams the API can change once their zone
    /// exists.
    pub fn live(&self) -> Option<LiveUpstream> {
        // State exists only for an upstream whose `peer.init` this module wrapped (round robin
        // or least_conn with a zone); it is made after nginx's zone `init` copied the peers into
        // the zone and pointed `peer.data` at the zone's list, in this zone.
        LiveUpstream::new(self.state?, &self.balancer)
    }
}

/// Entries by the address of their `ngx_http_upstream_srv_conf_t`.
static REGISTRY: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());

/// The cycle whose configuration contains `upstreams_api` (set while it is parsed).
static API_CYCLE: Mutex<usize> = Mutex::new(0);

/// `(cycle, retired_warn in ms, 0: off)`: the smallest `retired_warn` of the `upstreams_api`
/// locations of the configuration being parsed (`off` only when every location says it).
static RETIRED_WARN: Mutex<(usize, u64)> = Mutex::new((0, 0));

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<usize, Entry>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the entry of `uscf`.
#[inline]
pub fn with_entry<T>(
    uscf: *mut ngx_http_upstream_srv_conf_t,
    f: impl FnOnce(&Entry) -> T,
) -> Option<T> {
    registry().get(&(uscf as usize)).map(f)
}

/// The balancer's `peer.init` and the live upstream for `us`.
#[inline]
pub fn lookup_peer_init(us: Upstream) -> Option<(PeerInitFn, Option<LiveUpstream>)> {
    with_entry(us.as_ptr(), |e| e.orig_init.map(|f| (f, e.live()))).flatten()
}

struct SetUpstreamsApi;

impl Directive for SetUpstreamsApi {
    fn handle(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
        let loc = ApiLocation::of_conf(cf).ok_or(ConfFail::Logged)?;
        declare(cf, loc)
    }
}

/// Records the location's access parameters and makes it the API's location.
fn declare(cf: &mut ngx_conf_t, loc: &mut ApiLocation) -> Result<(), ConfFail> {
    if loc.access.is_some() {
        return Err(upstrand_core::ConfError::ApiDuplicate.into());
    }
    let texts = cf.param_texts();
    let params: Vec<&str> = texts.iter().map(String::as_str).collect();
    upstrand_core::plus::check_mode_word(&params)?;
    let (plus, params) = upstrand_core::plus::split_mode(&params);
    let access = upstrand_core::live::Access::parse(params)?;
    let warn = access.retired_warn_ms.unwrap_or(0);
    {
        let mut w = RETIRED_WARN.lock().unwrap_or_else(|e| e.into_inner());
        if w.0 != cf.cycle as usize {
            *w = (cf.cycle as usize, warn);
        } else if warn != 0 && (w.1 == 0 || warn < w.1) {
            w.1 = warn;
        }
    }
    loc.access = Some(access);
    if plus {
        set_content_handler::<plus::Api>(cf)?;
    } else {
        set_content_handler::<handler::Api>(cf)?;
    }
    *API_CYCLE.lock().unwrap_or_else(|e| e.into_inner()) = cf.cycle as usize;
    Ok(())
}

/// From the module's `init_main_conf` (after every upstream ran its `init_upstream`): when the
/// configuration has an `upstreams_api` location, records every `upstream {}` block and wraps
/// the `peer.init` and zone `init` of those the API can change.
pub fn init_main_conf(cf: &mut ngx_conf_t) -> Result<(), ConfFail> {
    let cycle = cf.cycle as usize;
    let probes: BTreeMap<usize, Arc<ProbeConf>> = {
        let mut p = PROBES.lock().unwrap_or_else(|e| e.into_inner());
        let mine = p
            .iter()
            .filter(|((c, _), _)| *c == cycle)
            .map(|((_, u), conf)| (*u, conf.clone()))
            .collect();
        p.retain(|(c, _), _| *c != cycle);
        mine
    };
    if *API_CYCLE.lock().unwrap_or_else(|e| e.into_inner()) != cycle && probes.is_empty() {
        return Ok(());
    }
    if !cf.on_cleanup::<ForgetCycle>(cycle) {
        return Err(ConfFail::Text("out of memory"));
    }
    let balancers = probe::Probes::run(cf);
    let mut reg = registry();
    for up in crate::ffi::upstream::all(cf) {
        if !up.is_block() {
            continue; // an implicit upstream (proxy_pass http://host)
        }
        let shm_zone = ShmZone::of(up);
        let balancer = balancers.classify(up);
        // Only round robin and least_conn are known to keep a round-robin list in peer.data
        // (in the configuration pool: the zone is not made yet).
        let resolves_names = balancer.rr_list().is_some_and(Peers::resolves_names);
        let mut e = Entry {
            cycle,
            up,
            name: String::from_utf8_lossy(up.host()).into_owned(),
            shm_zone,
            zone: shm_zone.map(ShmZone::name),
            balancer,
            resolves_names,
            orig_init: up.peer_init_fn(),
            orig_zone_init: ZoneInitFn::default(),
            state: None,
            probe: probes.get(&(up.as_ptr() as usize)).cloned(),
        };
        if e.probe.is_some() {
            if let Some(why) = probe_refused(&e) {
                let (file, line) = up.file_line();
                cf.log_plain(
                    NGX_LOG_EMERG,
                    &format!(
                        "\"probe\" in upstream \"{}\" {why} in {file}:{line}",
                        e.name
                    ),
                );
                return Err(ConfFail::Logged);
            }
        }
        if let (Some(z), Some(_), false, Some(_)) =
            (shm_zone, e.balancer.live(), e.resolves_names, e.orig_init)
        {
            up.wrap_peer_init::<balancer::LivePeerInit>();
            let already = reg
                .values()
                .find(|o| o.cycle == cycle && o.shm_zone == Some(z) && o.orig_zone_init.is_some());
            match already {
                Some(o) => e.orig_zone_init = o.orig_zone_init,
                None => {
                    e.orig_zone_init = z.init_fn();
                    z.wrap_init::<ZoneInitWrapper>();
                }
            }
        }
        reg.insert(up.as_ptr() as usize, e);
    }
    Ok(())
}

/// Why an upstream with `probe` cannot be probed (None: it can).
fn probe_refused(e: &Entry) -> Option<String> {
    if e.shm_zone.is_none() {
        return Some("needs a \"zone\"".into());
    }
    if e.balancer.live().is_none() {
        return Some(format!(
            "needs round robin or least_conn (with or without keepalive), not {}",
            e.balancer.name
        ));
    }
    if e.resolves_names {
        return Some("cannot probe servers with \"resolve\"".into());
    }
    if e.orig_init.is_none() {
        return Some("has no balancer to drive".into());
    }
    None
}

/// From the module's `create_main_conf`, when nginx starts reading an `http {}` block: in the
/// master during a reload, marks the zone state of every live upstream of the running
/// configuration as replaced by the one being read (`cf.cycle`), so the workers of the running
/// configuration answer 503 instead of changing (or showing) a zone the new configuration will
/// not use: nginx never reuses an upstream zone across a reload, and the old workers keep
/// serving for a while after the new zone is made. When the new configuration fails
/// to load, its pool's cleanup ([`WithdrawSupersede`]) takes the marks back.
pub fn configuration_begins(cf: &mut ngx_conf_t) -> Result<(), &'static str> {
    let new = cf.cycle as usize;
    // While a configuration is read, the running one is still the previous one.
    let running = crate::ffi::running_cycle();
    let marked = mark_running(running, new, LiveState::supersede);
    if !marked {
        return Ok(());
    }
    if !cf.on_cleanup::<WithdrawSupersede>(new) {
        mark_running(running, new, LiveState::withdraw);
        return Err("out of memory");
    }
    Ok(())
}

/// Calls `f(state, token of new)` for every live state of the running configuration; whether
/// there was one. Only the running configuration's zones are sure to be mapped.
fn mark_running(running: usize, new: usize, f: fn(LiveState, u64)) -> bool {
    if running == 0 || running == new {
        return false;
    }
    let mut any = false;
    for e in registry().values().filter(|e| e.cycle == running) {
        if let Some(st) = e.state {
            f(st, new as u64);
            any = true;
        }
    }
    any
}

/// Pool cleanup of a configuration that marked the running one's zones: when it failed to load
/// (the running configuration stays), takes its marks back. When it loaded, the configurations
/// it marked are no longer running and the running one was never marked with its token: nothing.
struct WithdrawSupersede;

impl Cleanup for WithdrawSupersede {
    fn run(new: usize) {
        mark_running(crate::ffi::running_cycle(), new, LiveState::withdraw);
    }
}

/// Forgets a configuration's entries when its pool goes.
struct ForgetCycle;

impl Cleanup for ForgetCycle {
    fn run(cycle: usize) {
        registry().retain(|_, e| e.cycle != cycle);
    }
}

/// The zone `init` installed for zones of live upstreams: runs nginx's (which copies the peers
/// into the zone), then allocates each live upstream's state in the zone.
struct ZoneInitWrapper;

impl ZoneInit for ZoneInitWrapper {
    fn init(z: ShmZone, data: ZoneData) -> Status {
        let mut reg = registry();
        let Some(orig) = reg
            .values()
            .find(|e| e.shm_zone == Some(z) && e.orig_zone_init.is_some())
            .map(|e| e.orig_zone_init)
        else {
            return Status::NGX_ERROR;
        };
        let rc = orig.call(z, data);
        if rc != Status::NGX_OK {
            return rc;
        }
        let Some(slab) = z.slab() else {
            return Status::NGX_ERROR;
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64);
        let warn = RETIRED_WARN.lock().unwrap_or_else(|e| e.into_inner());
        for e in reg.values_mut() {
            if e.shm_zone == Some(z) && e.orig_zone_init.is_some() {
                let warn_ms = if warn.0 == e.cycle { warn.1 } else { 0 };
                e.state = LiveState::create(slab, now_ms, e.up, warn_ms);
                if e.state.is_none() {
                    return Status::NGX_ERROR;
                }
                let Some(live) = e.live() else {
                    return Status::NGX_ERROR;
                };
                // The configured servers get the upstream's first ids (0, 1, ...).
                let deadline = std::time::Instant::now() + zone::WRITE_WAIT;
                let Some(lists) = live.primary.write_both(deadline) else {
                    return Status::NGX_ERROR;
                };
                let next = lists.assign_ids(0);
                // ... and their statistics counters.
                let counted = lists.attach_counters(&slab.lock());
                drop(lists);
                if !counted {
                    crate::ffi::log::log_cycle(
                        NGX_LOG_EMERG,
                        &format!(
                            "upstreams_api: zone \"{}\" is too small for the statistics of upstream \"{}\" ({} bytes per server): make it larger",
                            z.name(),
                            e.name,
                            crate::ffi::counters::SLOT_BYTES.next_power_of_two()
                        ),
                    );
                    return Status::NGX_ERROR;
                }
                live.state().shared().next_id.store(next, Ordering::Relaxed);
                if let Some(p) = e.probe.clone() {
                    let bits = if p.mandatory { down::CHECKING } else { 0 };
                    if !live.create_health(bits) {
                        return Status::NGX_ERROR;
                    }
                    if bits != 0 {
                        // Every server of a new zone (start, reload) waits for its first pass.
                        let deadline = std::time::Instant::now() + zone::WRITE_WAIT;
                        let Some(lists) = live.primary.write_both(deadline) else {
                            return Status::NGX_ERROR;
                        };
                        lists.set_health_bits(None, bits);
                    }
                }
            }
        }
        Status::NGX_OK
    }
}
