//! The module's one FFI layer: everything that touches nginx's C structures or calls into nginx.
//!
//! nginx calls the module through `extern "C"` trampolines that live here; each turns nginx's
//! pointers into a reference or a handle once, with a SAFETY comment, and calls a safe trait the
//! features implement:
//! - directives: [`conf::Directive`] (entry made with [`command`]),
//! - configuration hooks: [`conf::HttpHooks`] ([`conf::module_ctx`] builds nginx's table),
//! - variables: [`variables::Variable`] (trampoline in `request/mod.rs`),
//! - header/body filters: [`request::Filters`],
//! - `init_upstream` / `peer.init` wrappers: [`upstream::InitUpstream`], [`upstream::PeerInit`],
//! - content handlers and request bodies: [`request::ContentHandler`], [`request::BodyReader`],
//! - balancer wrappers: [`balancer::PeerWrapper`]; zone `init` wrappers: [`shm::ZoneInit`];
//!   pool cleanups: [`pool::Cleanup`];
//! - worker start and exit, the probe timer and probe connections (active health checks):
//!   [`process::ProcessHooks`], [`process::Ticker`], [`process::Probing`] (made by
//!   [`prober::start_probe`] for a [`prober::ProbeDone`]); the zone's per-server record table
//!   and the prober's lease: [`health::Health`].
//!
//! Below the trampolines the features work on handles whose methods are safe: [`conf::ConfExt`]
//! on `ngx_conf_t`, [`request::Req`], [`variables::VarSlot`], [`upstream::Upstream`],
//! [`pool::PoolCell`], and for the live API [`shm::ShmZone`], [`zone::LiveUpstream`],
//! [`peers::Peers`] and their lock guards, [`balancer::Wrap`] / [`upstream::PeerConn`]. A feature
//! reaches its part of the module's configuration through [`conf::ConfPart`], which the
//! composition root (`crate::conf`) implements, so no feature names the module's configuration
//! types and the layers have no import cycle:
//! `lib` → `conf` → features → `ffi` → `ngx`/`upstrand_core`.
//!
//! Invariant: outside `ffi/` the module defines no `extern "C" fn` and has no `unsafe {}` block
//! (`scripts/module-layers.py`).
//!
//! Inside `ffi/`, `unsafe` sits where a primitive of nginx is wrapped, each stating its safety
//! argument once (the invariant in the handle type's doc, `// SAFETY:` at the block), in six
//! files, each one kind of nginx structure, with the safe logic that used to sit beside it moved
//! into safe files next to it:
//! - `process.rs`: the process — its globals (clocks, the running cycle and its log, the process
//!   kind, flags and pid, `random()`, global counters looked up by name, the loaded modules), its
//!   per-process hooks, the tick timer and probe connections with their event trampolines
//!   (`prober.rs` is safe code on [`process::Conn`]);
//! - `pool.rs`: nginx-owned memory — `ngx_str_t` bytes, pools and their cleanups, a zone's slab
//!   pool: [`pool::Slab`], its held mutex [`pool::SlabLocked`] with the pool's words, zeroed
//!   allocations owned until handed to the zone, [`pool::SlabBox`] of a [`pool::Zeroed`] type,
//!   and the freeing of a peer (`peers/slab.rs` is safe code on them); the zone,
//!   [`shm::ShmZone`] with its `init` trampoline, the module's own blocks in a zone (`ZoneRef`,
//!   `RwWord`, `ZoneTable`, `ZoneLink`: `zone.rs` and `health.rs` are safe code on them) and a
//!   peer's statistics slot, [`counters::Counters`]. Its safe child `pool/shm.rs` (re-exported
//!   as `ffi::shm`) declares the shared-memory types, with fields only `pool.rs` reaches, and
//!   their safe logic;
//! - `peers/mod.rs`: the zone's lists and peers — a peer is read as a copy of its fields and its
//!   set-once bytes (`peers/peer.rs` is safe code on them), and the write side hands out a peer
//!   as `&mut` only under both list write locks (`peers/write.rs` and `counters.rs`);
//! - `conf/mod.rs`: the configuration being parsed — [`conf::ConfExt`], the directive, hook and
//!   block trampolines, regular expressions, a balancer directive's handler run on scratch
//!   configurations and the words it wrote (`probe.rs` is safe code on them), a new upstream
//!   block (`conf/parts.rs` declares the traits);
//! - `upstream/mod.rs`: upstream configurations, their `init_upstream` / `peer.init` trampolines,
//!   `peer.data` read as the round-robin list for a [`probe::Balancer`], and per request the peer
//!   connection and the balancer wrapper's trampolines (`upstream/list.rs` and `balancer.rs` are
//!   safe code on them);
//! - `request/mod.rs`: the request — [`request::Req`] with its views and the accesses that write
//!   into a request or call nginx (context slot, variables, subrequests, body, a sent answer, its
//!   peer connection), and the trampolines of content handlers, request bodies, output filters
//!   and variables (`request/read.rs`, `request/hooks.rs` and `variables.rs` are safe code on
//!   them).
//!
//! The other files hold no `unsafe {}` (`zone.rs` and `health.rs` one `unsafe impl ZoneShared`
//! each, `peers/slab.rs` an `unsafe impl Zeroed` for each structure it allocates: the type's own
//! promise).

pub mod balancer;
pub mod conf;
pub mod counters;
pub mod health;
pub mod log;
pub mod peers;
pub mod plus;
pub mod pool;
pub mod probe;
pub mod prober;
pub mod process;
pub mod request;
pub mod upstream;
pub mod variables;
pub mod zone;

use core::ffi::CStr;
use core::ptr;

pub use ngx::core::Status;
use ngx::ffi::{ngx_command_t, ngx_str_t, ngx_uint_t};

use self::conf::Directive;
pub(crate) use self::pool::bytes;
pub use self::pool::shm;
pub use self::process::{current_msec, global_counter, random, running_cycle, wall_msec};
pub(crate) use self::process::{loaded_module, with_cycle_log};

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

/// An `ngx_str_t` that borrows `s` (for nginx calls that only read it).
pub(crate) fn borrowed(s: &[u8]) -> ngx_str_t {
    ngx_str_t {
        len: s.len(),
        data: s.as_ptr().cast_mut(),
    }
}
