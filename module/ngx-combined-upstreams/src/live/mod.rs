//! The live upstream API (`upstreams_api;`, issue 11): change the servers of an upstream with a
//! shared-memory `zone` at run time, for every worker at once, without a reload.
//!
//! - `mod.rs` (this file): the directive, the configuration-time registration of upstreams and
//!   the process-local registry that maps an upstream to its live state.
//! - [`probe`]: which balancer an upstream uses.
//! - [`zone`]: the state in the zone, `PUT` application, retiring and freeing of busy peers.
//! - [`peers`]: every access to nginx's round-robin peer structures (the version-sensitive part).
//! - [`balancer`]: per-request wrappers around the balancer.
//! - [`handler`]: the HTTP handler (`GET`/`PUT`, JSON answers).
//!
//! The JSON, validation, planning and error texts are in `upstrand_core::live`. The operator's
//! documentation is `docs/live-api.md`.

pub mod balancer;
pub mod handler;
pub mod peers;
pub mod probe;
pub mod zone;

use core::ffi::{c_char, c_void};
use core::ptr;
use std::collections::BTreeMap;
use std::sync::Mutex;

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_http_conf_ctx_t, ngx_http_core_loc_conf_t,
    ngx_http_core_module, ngx_http_upstream_init_peer_pt, ngx_http_upstream_srv_conf_t, ngx_int_t,
    ngx_pool_cleanup_add, ngx_shm_zone_init_pt, ngx_shm_zone_t, ngx_slab_pool_t, NGX_CONF_NOARGS,
    NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET,
};

use crate::ffi_util::{bytes, command, NGX_ERROR, NGX_OK};

/// `upstreams_api;` in a `location`.
pub const COMMAND: ngx_command_t = command(
    c"upstreams_api",
    NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
    set_upstreams_api,
    NGX_HTTP_LOC_CONF_OFFSET,
);

/// What the registry knows about one `upstream {}` block of a configuration.
pub struct Entry {
    /// The configuration (cycle) it belongs to.
    cycle: *mut ngx_cycle_t,
    /// The upstream.
    pub uscf: *mut ngx_http_upstream_srv_conf_t,
    /// Its name.
    pub name: String,
    /// Its zone (null without one).
    shm_zone: *mut ngx_shm_zone_t,
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
    /// Live state in the zone, once the zone exists.
    pub shared: *mut zone::Shared,
}

// SAFETY: nginx runs each process single-threaded; the pointers are only used on that thread.
unsafe impl Send for Entry {}

/// Entries by the address of their `ngx_http_upstream_srv_conf_t`.
static REGISTRY: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());

/// The cycle whose configuration contains `upstreams_api` (set while it is parsed).
static API_CYCLE: Mutex<usize> = Mutex::new(0);

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

/// The balancer's `peer.init` and the live state for `uscf`.
pub fn lookup_peer_init(
    uscf: *mut ngx_http_upstream_srv_conf_t,
) -> Option<(
    unsafe extern "C" fn(
        *mut ngx::ffi::ngx_http_request_t,
        *mut ngx_http_upstream_srv_conf_t,
    ) -> ngx_int_t,
    *mut zone::Shared,
)> {
    with_entry(uscf, |e| e.orig_init.map(|f| (f, e.shared))).flatten()
}

unsafe extern "C" fn set_upstreams_api(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: called by nginx inside a location; its core loc conf is at the core module's index.
    unsafe {
        let ctx = (*cf).ctx as *mut ngx_http_conf_ctx_t;
        let idx = (*ptr::addr_of!(ngx_http_core_module)).ctx_index;
        let clcf = *(*ctx).loc_conf.add(idx) as *mut ngx_http_core_loc_conf_t;
        (*clcf).handler = Some(handler::handle);
        *API_CYCLE.lock().unwrap_or_else(|e| e.into_inner()) = (*cf).cycle as usize;
    }
    ngx::core::NGX_CONF_OK
}

/// From the module's `init_main_conf` (after every upstream ran its `init_upstream`): when the
/// configuration has an `upstreams_api` location, records every `upstream {}` block and wraps
/// the `peer.init` and zone `init` of those the API can change.
///
/// # Safety
/// `cf` is the configuration nginx is parsing, at the end of `http {}`.
pub unsafe fn init_main_conf(cf: *mut ngx_conf_t) -> Result<(), &'static str> {
    // SAFETY: forwarded; the upstreams are the configuration's own.
    unsafe {
        let cycle = (*cf).cycle;
        if *API_CYCLE.lock().unwrap_or_else(|e| e.into_inner()) != cycle as usize {
            return Ok(());
        }
        let cln = ngx_pool_cleanup_add((*cf).pool, 0);
        if cln.is_null() {
            return Err("out of memory");
        }
        (*cln).handler = Some(forget_cycle);
        (*cln).data = cycle.cast();
        let probes = probe::Probes::run(cf);
        let mut reg = registry();
        for up in crate::upstreams::all(&*cf) {
            let uscf = up.as_ptr();
            if (*uscf).srv_conf.is_null() {
                continue; // an implicit upstream (proxy_pass http://host)
            }
            let name = String::from_utf8_lossy(bytes(&(*uscf).host)).into_owned();
            let zone_ptr = (*uscf).shm_zone;
            let zone = (!zone_ptr.is_null())
                .then(|| String::from_utf8_lossy(bytes(&(*zone_ptr).shm.name)).into_owned());
            let balancer = probes.classify(uscf);
            // Only round robin and least_conn are known to keep round-robin lists in peer.data.
            let resolves_names =
                balancer.live.is_some() && peers::resolves_names((*uscf).peer.data.cast());
            let mut e = Entry {
                cycle,
                uscf,
                name,
                shm_zone: zone_ptr,
                zone,
                balancer,
                resolves_names,
                orig_init: (*uscf).peer.init,
                orig_zone_init: None,
                shared: ptr::null_mut(),
            };
            if e.zone.is_some()
                && e.balancer.live.is_some()
                && !e.resolves_names
                && e.orig_init.is_some()
            {
                (*uscf).peer.init = Some(balancer::init_peer);
                let already = reg.values().find(|o| {
                    o.cycle == cycle && (*o.uscf).shm_zone == zone_ptr && o.orig_zone_init.is_some()
                });
                match already {
                    Some(o) => e.orig_zone_init = o.orig_zone_init,
                    None => {
                        e.orig_zone_init = (*zone_ptr).init;
                        (*zone_ptr).init = Some(zone_init);
                    }
                }
            }
            reg.insert(uscf as usize, e);
        }
        Ok(())
    }
}

unsafe extern "C" fn forget_cycle(data: *mut c_void) {
    let cycle = data.cast::<ngx_cycle_t>();
    registry().retain(|_, e| e.cycle != cycle);
}

/// The zone `init` installed for zones of live upstreams: runs nginx's (which copies the peers
/// into the zone), then allocates each live upstream's state in the zone.
unsafe extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    let mut reg = registry();
    let Some(orig) = reg
        .values()
        .find(|e| e.shm_zone == shm_zone && e.orig_zone_init.is_some())
        .and_then(|e| e.orig_zone_init)
    else {
        return NGX_ERROR;
    };
    // SAFETY: nginx passes the zone it is creating; orig is the upstream zone module's init.
    unsafe {
        let rc = orig(shm_zone, data);
        if rc != NGX_OK {
            return rc;
        }
        let pool = (*shm_zone).shm.addr.cast::<ngx_slab_pool_t>();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64);
        for e in reg.values_mut() {
            if e.shm_zone == shm_zone && e.orig_zone_init.is_some() {
                e.shared = zone::create(pool, now_ms);
                if e.shared.is_null() {
                    return NGX_ERROR;
                }
            }
        }
    }
    NGX_OK
}
