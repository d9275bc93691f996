//! The module's one FFI layer: everything that touches nginx's C structures or calls into nginx.
//!
//! nginx calls the module through `extern "C"` trampolines that live here; each turns nginx's
//! pointers into a reference or a handle once, with a SAFETY comment, and calls a safe trait the
//! features implement:
//! - directives: [`conf::Directive`] (entry made with [`command`]),
//! - configuration hooks: [`conf::HttpHooks`] ([`conf::module_ctx`] builds nginx's table),
//! - variables: [`variables::Variable`] (trampoline in `content.rs`),
//! - header/body filters: [`content::Filters`],
//! - `init_upstream` / `peer.init` wrappers: [`upstream::InitUpstream`], [`upstream::PeerInit`],
//! - content handlers and request bodies: [`content::ContentHandler`], [`content::BodyReader`],
//! - balancer wrappers: [`balancer::PeerWrapper`]; zone `init` wrappers: [`shm::ZoneInit`];
//!   pool cleanups: [`pool::Cleanup`];
//! - worker start and exit, the probe timer and probe connections (active health checks):
//!   [`prober::ProcessHooks`], [`prober::Ticker`], [`prober::ProbeDone`]; the zone's per-server
//!   record table and the prober's lease: [`health::Health`].
//!
//! Below the trampolines the features work on handles whose methods are safe: [`conf::ConfExt`]
//! on `ngx_conf_t`, [`request::Req`], [`variables::VarSlot`], [`upstream::Upstream`],
//! [`pool::PoolCell`], and for the live API [`shm::ShmZone`], [`zone::LiveUpstream`],
//! [`peers::Peers`] and their lock guards, [`balancer::Wrap`] / [`balancer::PeerConn`]. A feature reaches its part of the module's configuration through
//! [`conf::ConfPart`], which the composition root (`crate::conf`) implements, so no feature names
//! the module's configuration types and the layers have no import cycle:
//! `lib` → `conf` → features → `ffi` → `ngx`/`upstrand_core`.
//!
//! Invariant: outside `ffi/` the module defines no `extern "C" fn` and has no `unsafe {}` block
//! (`scripts/module-layers.py`).
//!
//! Inside `ffi/`, `unsafe` sits where a primitive of nginx is wrapped, each stating its safety
//! argument once (the invariant in the handle type's doc, `// SAFETY:` at the block): this file
//! (nginx's process globals — clocks, the running cycle and its log, the process kind, flags and
//! pid, `random()`, global counters looked up by name, the loaded modules — and `ngx_str_t` bytes);
//! `request.rs` (the request); `pool.rs` (pools and their cleanups, and a zone's slab pool:
//! [`pool::Slab`], its held mutex [`pool::SlabLocked`] with the pool's words, zeroed allocations
//! owned until handed to the zone, [`pool::SlabBox`] of a [`pool::Zeroed`] type, and the freeing of
//! a peer, so `peers/slab.rs` is safe code on them); `conf.rs` and `upstream.rs` (configuration
//! structures, a balancer directive's handler run on scratch configurations and the words it wrote,
//! upstream blocks, and `peer.data` read as the round-robin list for a [`probe::Balancer`] the
//! classification made, so `probe.rs` is safe code on them); `peers/mod.rs` (the zone's lists and
//! peers: a peer is read as a copy of its fields and its set-once bytes, so `peers/peer.rs` is safe
//! code on them, and the write side hands out a peer as `&mut` only under both list write locks, so
//! `peers/write.rs` and `counters.rs` are safe code on it); `shm.rs` (the zone, [`shm::ShmZone`],
//! with its `init` trampoline, the primitives of the module's own blocks in a zone: `ZoneRef`,
//! `RwWord`, `ZoneTable`, `ZoneLink`, on which `zone.rs` and `health.rs` are safe code, and a
//! peer's statistics slot, [`counters::Counters`]); the trampolines and the handles they make in
//! `balancer.rs`, `content.rs` (content handlers, request bodies, output filters, the variable
//! handler and its value slot, variable registration) and `prober.rs` (timers and probe
//! connections). `log.rs`, `probe.rs`, `peers/peer.rs`, `peers/slab.rs`, `plus.rs`, `counters.rs`,
//! `variables.rs`, `zone.rs`, `health.rs` and `peers/write.rs` hold no `unsafe {}` (`zone.rs` and
//! `health.rs` one `unsafe impl ZoneShared` each, `peers/slab.rs` an `unsafe impl Zeroed` for each
//! structure it allocates: the type's own promise).

pub mod balancer;
pub mod conf;
pub mod content;
pub mod counters;
pub mod health;
pub mod log;
pub mod peers;
pub mod plus;
pub mod pool;
pub mod probe;
pub mod prober;
pub mod request;
pub mod shm;
pub mod upstream;
pub mod variables;
pub mod zone;

use core::ffi::CStr;
use core::{ptr, slice};

pub use ngx::core::Status;
use ngx::ffi::{ngx_command_t, ngx_str_t, ngx_uint_t};

use self::conf::Directive;

/// A directive table entry: `name`, its context and argument flags (`type_`), the handler `D`
/// and which configuration nginx passes to it (`conf`: an `NGX_HTTP_*_CONF_OFFSET`, or 0; the
/// handlers reach their configuration through [`conf::ConfPart`]).
pub const fn command<D: Directive>(name: &'static CStr, type_: u32, conf: usize) -> ngx_command_t {
    ngx_command_t {
        name: ngx_str_t {
            len: name.count_bytes(),
            data: name.as_ptr() as *mut u8,
        },
        type_: type_ as ngx_uint_t,
        set: Some(conf::directive::<D>),
        conf: conf as ngx_uint_t,
        offset: 0,
        post: ptr::null_mut(),
    }
}

/// Why a directive handler failed.
#[derive(Debug)]
pub enum ConfFail {
    /// Log this error as `[emerg]` (its `Display` is nginx's wording).
    Conf(upstrand_core::ConfError),
    /// Log this text as `[emerg]`.
    Text(&'static str),
    /// nginx's own short form: nginx logs `"NAME" directive MESSAGE`.
    Nginx(&'static CStr),
    /// Already logged (nginx did it, also for out of memory): only return `NGX_CONF_ERROR`.
    Logged,
}

impl From<upstrand_core::ConfError> for ConfFail {
    fn from(e: upstrand_core::ConfError) -> Self {
        ConfFail::Conf(e)
    }
}

/// The bytes of an `ngx_str_t` (empty for a null pointer).
///
/// # Safety
/// `s.data` must point to `s.len` readable bytes (or `s.len` must be 0) for `'a`.
pub(crate) unsafe fn bytes<'a>(s: &ngx_str_t) -> &'a [u8] {
    if s.len == 0 || s.data.is_null() {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { slice::from_raw_parts(s.data, s.len) }
}

/// An `ngx_str_t` that borrows `s` (for nginx calls that only read it).
pub(crate) fn borrowed(s: &[u8]) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr().cast_mut(),
    }
}

/// nginx's cached clock in milliseconds (`ngx_current_msec`, the same clock in every worker).
#[inline]
pub fn current_msec() -> u64 {
    // SAFETY: a plain integer global nginx updates on its own thread, which this is.
    unsafe { ngx::ffi::ngx_current_msec as u64 }
}

/// nginx's cached wall clock in milliseconds since the Unix epoch (`ngx_timeofday()`).
#[inline]
pub fn wall_msec() -> u64 {
    // SAFETY: `ngx_cached_time` is a pointer global nginx sets at start and updates on its own
    // thread, which this is; it points at one of its cached time slots.
    unsafe {
        let t = ngx::ffi::ngx_cached_time;
        if t.is_null() {
            return 0;
        }
        ((*t).sec.max(0) as u64)
            .saturating_mul(1000)
            .saturating_add((*t).msec as u64)
    }
}

/// The address of nginx's running configuration (`ngx_cycle`; while a new one is read, still the
/// previous one), compared only.
pub fn running_cycle() -> usize {
    // SAFETY: a plain pointer global nginx sets on its own thread, which this is.
    unsafe { ngx::ffi::ngx_cycle as usize }
}

/// Runs `f` with the running cycle's log (None before nginx set up its cycle).
pub(crate) fn with_cycle_log<T>(f: impl FnOnce(&ngx::ffi::ngx_log_t) -> T) -> Option<T> {
    // SAFETY: ngx_cycle and its log live as long as the process runs this configuration; only
    // this thread writes through it, and the reference lives only during `f`.
    unsafe { ngx::ffi::ngx_cycle.as_ref().and_then(|c| c.log.as_ref()) }.map(f)
}

/// A worker (or nginx without a master): not the master, cache manager or loader.
pub fn is_worker() -> bool {
    // SAFETY: a plain integer global nginx sets before it calls `init_process`.
    let p = unsafe { ngx::ffi::ngx_process } as u32;
    p == ngx::ffi::NGX_PROCESS_WORKER || p == ngx::ffi::NGX_PROCESS_SINGLE
}

/// The worker is shutting down (graceful `QUIT` after a reload, or `TERM`).
pub fn exiting() -> bool {
    // SAFETY: plain integer globals nginx sets on its own thread, which this is.
    unsafe { ngx::ffi::ngx_exiting != 0 || ngx::ffi::ngx_terminate != 0 || ngx::ffi::ngx_quit != 0 }
}

/// This process's pid.
pub fn pid() -> u64 {
    // SAFETY: a plain integer global nginx sets at start.
    unsafe { ngx::ffi::ngx_pid as u64 }
}

/// The value of nginx's global counter `name` (a `ngx_atomic_t *` global, such as the stub
/// status module's `ngx_stat_*`), looked up at run time so the module still loads into an nginx
/// built without the module that defines it; None when nginx has no such symbol (or has not
/// set it yet).
pub fn global_counter(name: &CStr) -> Option<u64> {
    // SAFETY: dlsym with RTLD_DEFAULT (null) looks the symbol up in the process (nginx exports
    // its symbols for dynamic modules); the `ngx_stat_*`-style symbols this is called with are
    // nginx's pointer variables, which point at a counter in the shared zone nginx made at
    // start (or are null before that); the counter is read as a plain word, as stub_status
    // reads it.
    unsafe {
        let sym =
            ngx::ffi::dlsym(ptr::null_mut(), name.as_ptr()).cast::<*mut ngx::ffi::ngx_atomic_t>();
        if sym.is_null() {
            return None;
        }
        let p = ptr::read_volatile(sym);
        if p.is_null() {
            return None;
        }
        Some(ptr::read_volatile(p) as u64)
    }
}

/// libc's `random()` (nginx seeds it per worker), for choices nginx's balancers would make the
/// same way.
#[inline]
pub fn random() -> i64 {
    // SAFETY: random() has no preconditions.
    unsafe { ngx::ffi::random() as i64 }
}

/// The module called `name` among those loaded into the configuration being parsed (`cf`).
pub(crate) fn loaded_module(
    cf: &ngx::ffi::ngx_conf_t,
    name: &str,
) -> Option<&'static ngx::ffi::ngx_module_t> {
    // SAFETY: cf->cycle->modules is the cycle's null-terminated array of loaded modules (static
    // module objects, or those of loaded .so files, which stay loaded with the cycle) with
    // their names.
    unsafe {
        let cycle = cf.cycle;
        if cycle.is_null() || (*cycle).modules.is_null() {
            return None;
        }
        let mut i = 0;
        loop {
            let m = *(*cycle).modules.add(i);
            if m.is_null() {
                return None;
            }
            if !(*m).name.is_null() && CStr::from_ptr((*m).name).to_bytes() == name.as_bytes() {
                return Some(&*m);
            }
            i += 1;
        }
    }
}
