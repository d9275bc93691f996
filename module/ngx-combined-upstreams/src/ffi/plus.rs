//! What the NGINX Plus-compatible API (`live/plus/`) reads of nginx beyond the live state:
//! nginx's connection and request counters (the stub status module's `ngx_stat_*`, found at run
//! time so the module still loads into an nginx built without that module), a zone's slab
//! size classes, a request's `$request_id`, and how often and when a configuration was loaded
//! (the module's `init_module`, which nginx's master runs once per configuration it loads).

use core::sync::atomic::{AtomicU64, Ordering};

use ngx::ffi::{ngx_cycle_t, ngx_int_t};
use upstrand_core::plus::view::{SlabFigures, SlotFigures, StubCounters};

use super::peers::Slab;
use super::request::Req;

/// nginx's counter `name`.
fn counter(name: &core::ffi::CStr) -> Option<u64> {
    super::global_counter(name)
}

/// nginx's stub status counters, or None when nginx was built without the stub status module
/// (then it keeps none).
pub fn stub_counters() -> Option<StubCounters> {
    Some(StubCounters {
        accepted: counter(c"ngx_stat_accepted")?,
        handled: counter(c"ngx_stat_handled")?,
        active: counter(c"ngx_stat_active")?,
        reading: counter(c"ngx_stat_reading")?,
        writing: counter(c"ngx_stat_writing")?,
        waiting: counter(c"ngx_stat_waiting")?,
        requests: counter(c"ngx_stat_requests")?,
    })
}

impl Slab {
    /// The pool's pages and size classes (`ngx_slab_stat_t`), read under its mutex.
    pub fn slot_figures(self) -> SlabFigures {
        let f = self.figures("");
        let slots = self.lock().size_classes(|shift, stats| {
            stats
                .iter()
                .enumerate()
                .map(|(i, s)| SlotFigures {
                    size: 1u64 << (i + shift),
                    total: s.total as u64,
                    used: s.used as u64,
                    reqs: s.reqs as u64,
                    fails: s.fails as u64,
                })
                .collect()
        });
        SlabFigures {
            pages_total: f.pages_total,
            pages_free: f.pages_free,
            slots,
        }
    }
}

impl Req {
    /// The request's `$request_id` (empty when nginx has no such variable: before 1.11.0).
    pub fn request_id(self) -> String {
        let v = self.variable_by_name(b"request_id").unwrap_or_default();
        String::from_utf8_lossy(&v).into_owned()
    }
}

/// Configurations loaded by this process and the ones it forked (start and every reload that
/// succeeded), and when the last one was (epoch ms). Statics of the module survive a reload:
/// nginx opens the same `.so` again while the old configuration still holds it.
static LOADS: AtomicU64 = AtomicU64::new(0);
static LOADED_MS: AtomicU64 = AtomicU64::new(0);

/// `init_module` of the module object: nginx's master calls it once a new configuration is
/// loaded (after which loading cannot fail), before the workers of it are started.
pub extern "C" fn init_module(_cycle: *mut ngx_cycle_t) -> ngx_int_t {
    LOADS.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    LOADED_MS.store(now, Ordering::Relaxed);
    super::Status::NGX_OK.0
}

/// `(configurations loaded, epoch ms of the last load)` as this process knows them (a worker:
/// as of its fork); None before the first load.
pub fn config_loads() -> Option<(u64, u64)> {
    let n = LOADS.load(Ordering::Relaxed);
    (n > 0).then(|| (n, LOADED_MS.load(Ordering::Relaxed)))
}
