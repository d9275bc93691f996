//! The live upstream API (`upstreams_api;`, issue 11): change the servers of an upstream with a
//! shared-memory `zone` at run time, for every worker at once, without a reload.
//!
//! - `mod.rs` (this file): the directive, the configuration-time registration of upstreams and
//!   the process-local registry that maps an upstream to its live state.
//! - [`probe`]: which balancer an upstream uses.
//! - [`zone`]: the state in the zone, `PUT` application, retiring and freeing of busy peers.
//! - [`crate::ffi::peers`]: every access to nginx's round-robin peer structures (the
//!   version-sensitive part).
//! - [`balancer`]: per-request wrappers around the balancer.
//! - [`handler`]: the HTTP handler (`GET`/`PUT`, JSON answers).
//!
//! The JSON, validation, planning and error texts are in `upstrand_core::live`. The operator's
//! documentation is `docs/live-api.md`.

pub mod balancer;
pub mod handler;
pub mod probe;
pub mod zone;

use core::ffi::c_void;
use core::ptr::NonNull;
use std::collections::BTreeMap;
use std::sync::Mutex;

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_http_request_t, ngx_http_upstream_init_peer_pt,
    ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_pool_cleanup_add, ngx_shm_zone_init_pt,
    ngx_shm_zone_t, NGX_CONF_ANY, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET,
};

use crate::ffi::conf::{ConfExt, ConfPart, Directive};
use crate::ffi::content::set_content_handler;
use crate::ffi::peers::{Peers, Slab};
use crate::ffi::upstream::Upstream;
use crate::ffi::{bytes, command, ConfFail, NGX_ERROR, NGX_OK};
use zone::{LiveState, LiveUpstream};

/// `upstreams_api [write=on|off] [host=NAME ...];` in a `location`.
pub const COMMAND: ngx_command_t = command::<SetUpstreamsApi>(
    c"upstreams_api",
    NGX_HTTP_LOC_CONF | NGX_CONF_ANY,
    NGX_HTTP_LOC_CONF_OFFSET,
);

/// The live API's part of a location's configuration (not inherited: the directive sets the
/// location's content handler).
#[derive(Default)]
pub struct ApiLocation {
    /// `upstreams_api` of this location.
    pub access: Option<upstrand_core::live::Access>,
}

/// A balancer's `peer.init`.
pub type InitPeer =
    unsafe extern "C" fn(*mut ngx_http_request_t, *mut ngx_http_upstream_srv_conf_t) -> ngx_int_t;

/// A handle on an upstream's shared-memory zone (`ngx_shm_zone_t`), valid as long as the
/// configuration (cycle) it belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ShmZone(NonNull<ngx_shm_zone_t>);

impl ShmZone {
    /// The zone of `up`, when it has one.
    pub fn of(up: Upstream) -> Option<ShmZone> {
        up.shm_zone().map(ShmZone)
    }

    /// # Safety
    /// `z` is null or a shared-memory zone of a live configuration (nginx's argument to a
    /// zone's `init`).
    unsafe fn from_ptr(z: *mut ngx_shm_zone_t) -> Option<ShmZone> {
        NonNull::new(z).map(ShmZone)
    }

    fn raw(self) -> *mut ngx_shm_zone_t {
        self.0.as_ptr()
    }

    /// The zone's name.
    pub fn name(self) -> String {
        // SAFETY: the zone and its name live as long as the configuration (handle).
        String::from_utf8_lossy(unsafe { bytes(&(*self.raw()).shm.name) }).into_owned()
    }

    fn init(self) -> ngx_shm_zone_init_pt {
        // SAFETY: the zone is live (handle); `init` is read and written only while the
        // configuration is parsed and the zone made, on nginx's thread.
        unsafe { (*self.raw()).init }
    }

    fn set_init(self, f: ngx_shm_zone_init_pt) {
        // SAFETY: as in `init`.
        unsafe { (*self.raw()).init = f };
    }

    /// The zone's slab pool, once the zone is mapped (`shm.addr`).
    fn slab(self) -> Option<Slab> {
        // SAFETY: the zone is live (handle); once mapped, `shm.addr` is the slab pool nginx
        // initialised at the start of the zone.
        unsafe { Slab::from_ptr((*self.raw()).shm.addr.cast()) }
    }
}

/// What the registry knows about one `upstream {}` block of a configuration.
pub struct Entry {
    /// The configuration (cycle) it belongs to (compared only).
    cycle: *mut ngx_cycle_t,
    /// The upstream.
    pub up: Upstream,
    /// Its name.
    pub name: String,
    /// Its zone, when it has one.
    shm_zone: Option<ShmZone>,
    /// Its zone's name, when it has one.
    pub zone: Option<String>,
    /// Its balancer.
    pub balancer: probe::Balancer,
    /// It has `server ... resolve` servers (nginx 1.27.3+), which nginx keeps up to date
    /// itself: never live.
    pub resolves_names: bool,
    /// The balancer's `peer.init` (wrapped by [`balancer::init_peer`] for live upstreams).
    orig_init: ngx_http_upstream_init_peer_pt,
    /// The zone's `init` (wrapped by [`zone_init`]).
    orig_zone_init: ngx_shm_zone_init_pt,
    /// Live state in the zone, once the zone exists (live upstreams only).
    pub state: Option<LiveState>,
}

// SAFETY: nginx runs each process single-threaded; the handles are only used on that thread.
unsafe impl Send for Entry {}

impl Entry {
    /// The live upstream (state and zone list), for upstreams the API can change once their zone
    /// exists.
    pub fn live(&self) -> Option<LiveUpstream> {
        let state = self.state?;
        // SAFETY: state exists only for an upstream whose `peer.init` this module wrapped (round
        // robin or least_conn with a zone); it is made after nginx's zone `init` copied the
        // peers into the zone and pointed `peer.data` at the zone's list, in this zone.
        unsafe {
            let primary = Peers::from_ptr(self.up.peer_data().cast())?;
            LiveUpstream::new(state, primary)
        }
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
pub fn with_entry<T>(
    uscf: *mut ngx_http_upstream_srv_conf_t,
    f: impl FnOnce(&Entry) -> T,
) -> Option<T> {
    registry().get(&(uscf as usize)).map(f)
}

/// The balancer's `peer.init` and the live upstream for `uscf`.
pub fn lookup_peer_init(
    uscf: *mut ngx_http_upstream_srv_conf_t,
) -> Option<(InitPeer, Option<LiveUpstream>)> {
    with_entry(uscf, |e| e.orig_init.map(|f| (f, e.live()))).flatten()
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
    let access = upstrand_core::live::Access::parse(&params)?;
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
    set_content_handler::<handler::Api>(cf)?;
    *API_CYCLE.lock().unwrap_or_else(|e| e.into_inner()) = cf.cycle as usize;
    Ok(())
}

/// From the module's `init_main_conf` (after every upstream ran its `init_upstream`): when the
/// configuration has an `upstreams_api` location, records every `upstream {}` block and wraps
/// the `peer.init` and zone `init` of those the API can change.
pub fn init_main_conf(cf: &mut ngx_conf_t) -> Result<(), &'static str> {
    let cycle = cf.cycle;
    if *API_CYCLE.lock().unwrap_or_else(|e| e.into_inner()) != cycle as usize {
        return Ok(());
    }
    // SAFETY: cf.pool is the live configuration pool; the cleanup nginx returns is ours to fill.
    unsafe {
        let cln = ngx_pool_cleanup_add(cf.pool, 0);
        if cln.is_null() {
            return Err("out of memory");
        }
        (*cln).handler = Some(forget_cycle);
        (*cln).data = cycle.cast();
    }
    let probes = probe::Probes::run(cf);
    let mut reg = registry();
    for up in crate::ffi::upstream::all(cf) {
        if !up.is_block() {
            continue; // an implicit upstream (proxy_pass http://host)
        }
        let shm_zone = ShmZone::of(up);
        let balancer = probes.classify(up);
        // Only round robin and least_conn are known to keep a round-robin list in peer.data.
        let resolves_names = balancer.live.is_some()
            // SAFETY: for those, peer.data is the list their init_upstream made (in the
            // configuration pool; the zone is not made yet).
            && unsafe { Peers::from_ptr(up.peer_data().cast()) }.is_some_and(Peers::resolves_names);
        let mut e = Entry {
            cycle,
            up,
            name: String::from_utf8_lossy(up.host()).into_owned(),
            shm_zone,
            zone: shm_zone.map(ShmZone::name),
            balancer,
            resolves_names,
            orig_init: up.peer_init(),
            orig_zone_init: None,
            state: None,
        };
        if let (Some(z), Some(_), false, Some(_)) =
            (shm_zone, e.balancer.live, e.resolves_names, e.orig_init)
        {
            up.set_peer_init(Some(balancer::init_peer));
            let already = reg
                .values()
                .find(|o| o.cycle == cycle && o.shm_zone == Some(z) && o.orig_zone_init.is_some());
            match already {
                Some(o) => e.orig_zone_init = o.orig_zone_init,
                None => {
                    e.orig_zone_init = z.init();
                    z.set_init(Some(zone_init));
                }
            }
        }
        reg.insert(up.as_ptr() as usize, e);
    }
    Ok(())
}

/// From the module's `create_main_conf`, when nginx starts reading an `http {}` block: in the
/// master during a reload, marks the zone state of every live upstream of the running
/// configuration as replaced by the one being read (`cf.cycle`), so the workers of the running
/// configuration answer 503 instead of changing (or showing) a zone the new configuration will
/// not use: nginx never reuses an upstream zone across a reload, and the old workers keep
/// serving for a while after the new zone is made (issue 20). When the new configuration fails
/// to load, its pool's cleanup ([`withdraw_supersede`]) takes the marks back.
pub fn configuration_begins(cf: &mut ngx_conf_t) -> Result<(), &'static str> {
    let new = cf.cycle;
    // SAFETY: `ngx_cycle` is nginx's running configuration, read on nginx's thread; while a
    // configuration is read it is still the previous one.
    let running = unsafe { ngx::ffi::ngx_cycle };
    let marked = mark_running(running, new, LiveState::supersede);
    if !marked {
        return Ok(());
    }
    // SAFETY: cf.pool is the new configuration's pool; the cleanup nginx returns is ours.
    unsafe {
        let cln = ngx_pool_cleanup_add(cf.pool, 0);
        if cln.is_null() {
            mark_running(running, new, LiveState::withdraw);
            return Err("out of memory");
        }
        (*cln).handler = Some(withdraw_supersede);
        (*cln).data = new.cast();
    }
    Ok(())
}

/// Calls `f(state, token of new)` for every live state of the running configuration; whether
/// there was one. Only the running configuration's zones are sure to be mapped.
fn mark_running(running: *mut ngx_cycle_t, new: *mut ngx_cycle_t, f: fn(LiveState, u64)) -> bool {
    if running.is_null() || running == new {
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
extern "C" fn withdraw_supersede(data: *mut c_void) {
    // SAFETY: as in `configuration_begins`.
    let running = unsafe { ngx::ffi::ngx_cycle };
    mark_running(running, data.cast(), LiveState::withdraw);
}

extern "C" fn forget_cycle(data: *mut c_void) {
    let cycle = data.cast::<ngx_cycle_t>();
    registry().retain(|_, e| e.cycle != cycle);
}

/// The zone `init` installed for zones of live upstreams: runs nginx's (which copies the peers
/// into the zone), then allocates each live upstream's state in the zone.
extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone it is creating, of the configuration being started.
    let Some(z) = (unsafe { ShmZone::from_ptr(shm_zone) }) else {
        return NGX_ERROR;
    };
    let mut reg = registry();
    let Some(orig) = reg
        .values()
        .find(|e| e.shm_zone == Some(z) && e.orig_zone_init.is_some())
        .and_then(|e| e.orig_zone_init)
    else {
        return NGX_ERROR;
    };
    // SAFETY: orig is the upstream zone module's init, called with nginx's own arguments.
    let rc = unsafe { orig(shm_zone, data) };
    if rc != NGX_OK {
        return rc;
    }
    let Some(slab) = z.slab() else {
        return NGX_ERROR;
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64);
    let warn = RETIRED_WARN.lock().unwrap_or_else(|e| e.into_inner());
    for e in reg.values_mut() {
        if e.shm_zone == Some(z) && e.orig_zone_init.is_some() {
            let warn_ms = if warn.0 == e.cycle as usize {
                warn.1
            } else {
                0
            };
            e.state = LiveState::create(slab, now_ms, warn_ms);
            if e.state.is_none() {
                return NGX_ERROR;
            }
        }
    }
    NGX_OK
}
