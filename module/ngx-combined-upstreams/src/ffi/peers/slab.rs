//! What a `PUT` allocates in a zone — peers laid out like the zone module's copies
//! ([`peer_layout`]), backup lists and counters' slots — and the slab pool's figures: safe code
//! on `ffi/pool.rs`'s slab primitives ([`Slab`], the held mutex [`SlabLocked`], owned zeroed
//! allocations `SlabBox`); a peer is freed by `SlabLocked::free_peer` there.
//!
//! Memory: every peer of a zone is a slab allocation with its `sockaddr` (`ngx_sockaddr_t`),
//! `name.data` (`NGX_SOCKADDR_STRLEN` bytes), `server.data` and, once an SSL session was saved,
//! `ssl_session` (in nginx builds with sticky sessions, 1.29.6+ by default, cfg `ngx_upstream_sid`:
//! a `sid` buffer of 32 bytes) as separate slab allocations — the layout
//! `ngx_http_upstream_zone_module` gives the peers it copies, so one `SlabLocked::free_peer` frees
//! both kinds — and the module's statistics slot (`start_time`, 120 bytes), given to the copied
//! peers when the zone is made
//! ([`ListsWrite::attach_counters`](super::ListsWrite::attach_counters)).

use core::mem::size_of;
use std::net::SocketAddr;

use ngx::ffi::{
    ngx_http_upstream_rr_peer_t, ngx_http_upstream_rr_peers_t, ngx_slab_page_t, ngx_sockaddr_t,
    ngx_str_t, sockaddr_in, sockaddr_in6, sockaddr_un,
};
use upstrand_core::live::render::SlabView;
use upstrand_core::live::sizing::{PeerLayout, SlabShape};
use upstrand_core::live::{down, Addr, Server};

use super::peer::put_down_bits;
use super::{Peer, Peers, AF_INET, AF_INET6, AF_UNIX};
use crate::ffi::counters::{Counters, Slot, SLOT_BYTES};
pub use crate::ffi::pool::{Slab, SlabLocked};
use crate::ffi::pool::{SlabPages, Zeroed};

/// nginx's `NGX_SOCKADDR_STRLEN` with unix sockets (a macro, not in the bindings):
/// `sizeof("unix:") - 1` + `NGX_UNIX_ADDRSTRLEN` (108 on Linux).
const NGX_SOCKADDR_STRLEN: usize = 5 + 108;

/// nginx's `NGX_HTTP_UPSTREAM_SID_LEN` (an md5 in hex; a macro, not in the bindings).
#[cfg(ngx_upstream_sid)]
const NGX_HTTP_UPSTREAM_SID_LEN: usize = 32;

impl Slab {
    /// The pool's shape for the size estimate of a refused change.
    pub fn shape(self) -> SlabShape {
        let f = self.figures("");
        SlabShape {
            zone_bytes: f.zone_bytes,
            page_size: f.page_size,
            pages_total: f.pages_total,
            pages_free: f.pages_free,
            page_desc_bytes: size_of::<ngx_slab_page_t>() as u64,
        }
    }

    /// The pool's figures, read under its mutex.
    pub fn figures(self, zone: &str) -> SlabView {
        let m = self.lock();
        let (chunks_used, alloc_failures) = m.size_classes(|_, stats| {
            (
                stats.iter().map(|x| x.used as u64).sum(),
                stats.iter().map(|x| x.fails as u64).sum(),
            )
        });
        let SlabPages {
            start,
            end,
            pfree,
            page,
        } = m.pages();
        SlabView {
            zone: zone.to_string(),
            // The pool is at the start of the zone, `end` at its end.
            zone_bytes: end.saturating_sub(self.raw() as usize) as u64,
            page_size: page,
            pages_total: end.saturating_sub(start) as u64 / page.max(1),
            pages_free: pfree,
            chunks_used,
            alloc_failures,
        }
    }
}

// SAFETY: C structures of integers and pointers (null when zero), no drop: all-zero bytes are a
// valid peer (no lock, no connections, no `next`), socket address and list (rwlock 0: unlocked).
unsafe impl Zeroed for ngx_http_upstream_rr_peer_t {}
// SAFETY: as above.
unsafe impl Zeroed for ngx_sockaddr_t {}
// SAFETY: as above.
unsafe impl Zeroed for ngx_http_upstream_rr_peers_t {}
// SAFETY: a structure of atomic words (`ffi/counters.rs`): zeroed is a fresh slot.
unsafe impl Zeroed for Slot {}

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl SlabLocked {
    /// Allocates a new peer for `s` in the zone, laid out like the zone module's copies; `name`
    /// is `s.addr.name()` (made by the caller before the locks were taken); `run_bits`: the
    /// run-time `down` bits it starts with (`down::CHECKING` under `probe ... mandatory`); `id`:
    /// its id ([`Peer::id`]). `None` when the zone is full (everything allocated so far is freed
    /// again).
    pub fn alloc_peer(&self, s: &Server, name: &str, run_bits: usize, id: u64) -> Option<Peer> {
        let name_len = name.len().min(NGX_SOCKADDR_STRLEN);
        // Every allocation is a box, freed again when a later one fails; the peer is zeroed, so
        // unset fields (lock, conns, fails, refs...) start at 0.
        let mut p = self.calloc::<ngx_http_upstream_rr_peer_t>()?;
        let (sa, nm, sv, ct) = (
            self.calloc::<ngx_sockaddr_t>(),
            self.calloc_bytes(NGX_SOCKADDR_STRLEN),
            self.calloc_bytes(name_len),
            self.calloc::<Slot>(),
        );
        let (Some(mut sa), Some(mut nm), Some(mut sv), Some(ct)) = (sa, nm, sv, ct) else {
            return None;
        };
        // nginx builds with sticky sessions (cfg ngx_upstream_sid) give every zone peer a
        // `sid` buffer; an empty one here (only `sticky`, which the API refuses, reads it).
        #[cfg(ngx_upstream_sid)]
        let sid = self.calloc_bytes(NGX_HTTP_UPSTREAM_SID_LEN)?;
        p.socklen = write_addr(&s.addr, &mut sa);
        p.sockaddr = sa.into_raw().as_ptr().cast();
        for buf in [&mut nm, &mut sv] {
            for (d, b) in buf.iter_mut().zip(name.as_bytes()) {
                *d = *b;
            }
        }
        p.name = ngx_str_t {
            data: nm.into_raw().cast::<u8>().as_ptr(),
            len: name_len,
        };
        p.server = ngx_str_t {
            data: sv.into_raw().cast::<u8>().as_ptr(),
            len: name_len,
        };
        let w = s.weight as isize;
        p.weight = w;
        p.effective_weight = w;
        p.current_weight = 0;
        p.max_fails = s.max_fails as usize;
        p.fail_timeout = s.fail_timeout_s as _;
        p.max_conns = s.max_conns as usize;
        p.down = put_down_bits(s) | (run_bits & !down::SET_BY_PUT);
        p.slow_start = id as _;
        p.start_time = ct.into_raw().as_ptr() as usize as _;
        #[cfg(ngx_upstream_sid)]
        {
            p.sid = ngx_str_t {
                data: sid.into_raw().cast::<u8>().as_ptr(),
                len: 0,
            };
        }
        // The unlinked mark (`ListsWrite::is_unlinked`): in no list yet.
        p.next = p.as_ptr();
        Some(Peer(p.into_raw()))
    }

    /// A new, empty backup list sharing `primary`'s zone and name.
    pub fn alloc_list(&self, primary: Peers) -> Option<Peers> {
        let mut b = self.calloc::<ngx_http_upstream_rr_peers_t>()?;
        b.shpool = self.slab().raw();
        b.name = primary.name_ptr();
        Some(Peers(b.into_raw()))
    }

    /// A fresh statistics slot (`ffi/counters.rs`) in the zone; None when it is full.
    pub(in crate::ffi) fn calloc_slot(&self) -> Option<Counters> {
        self.calloc::<Slot>().map(|c| Counters(c.into_raw()))
    }
}

/// The sizes of a peer's slab allocations in this build ([`SlabLocked::alloc_peer`]'s layout).
pub fn peer_layout() -> PeerLayout {
    PeerLayout {
        peer: size_of::<ngx_http_upstream_rr_peer_t>() as u64,
        sockaddr: size_of::<ngx_sockaddr_t>() as u64,
        name_buf: NGX_SOCKADDR_STRLEN as u64,
        #[cfg(ngx_upstream_sid)]
        sid: NGX_HTTP_UPSTREAM_SID_LEN as u64,
        #[cfg(not(ngx_upstream_sid))]
        sid: 0,
        counters: SLOT_BYTES as u64,
    }
}

/// Writes `addr` into `out` (zeroed); returns the socket length.
#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
fn write_addr(addr: &Addr, out: &mut ngx_sockaddr_t) -> u32 {
    match addr {
        Addr::Inet(SocketAddr::V4(a)) => {
            out.sockaddr_in.sin_family = AF_INET;
            out.sockaddr_in.sin_port = a.port().to_be();
            out.sockaddr_in.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<sockaddr_in>() as u32
        }
        Addr::Inet(SocketAddr::V6(a)) => {
            out.sockaddr_in6.sin6_family = AF_INET6;
            out.sockaddr_in6.sin6_port = a.port().to_be();
            out.sockaddr_in6.sin6_addr.__in6_u.__u6_addr8 = a.ip().octets();
            size_of::<sockaddr_in6>() as u32
        }
        Addr::Unix(path) => {
            out.sockaddr_un.sun_family = AF_UNIX;
            let mut p = [0; 108];
            for (d, b) in p.iter_mut().zip(path.as_bytes()) {
                *d = *b as _;
            }
            out.sockaddr_un.sun_path = p;
            size_of::<sockaddr_un>() as u32
        }
    }
}
