//! A zone's slab pool ([`Slab`]) and its held mutex ([`SlabLocked`]): allocations, the pool's
//! figures, and the peers, lists and counters' slots a `PUT` makes and frees, laid out like the
//! zone module's copies ([`peer_layout`]).

use core::mem::size_of;
use core::ptr::{self, NonNull};
use std::net::SocketAddr;

use ngx::ffi::{
    ngx_http_upstream_rr_peer_t, ngx_http_upstream_rr_peers_t, ngx_pagesize, ngx_pagesize_shift,
    ngx_shmtx_lock, ngx_shmtx_unlock, ngx_slab_calloc, ngx_slab_calloc_locked,
    ngx_slab_free_locked, ngx_slab_page_t, ngx_slab_pool_t, ngx_slab_stat_t, ngx_sockaddr_t,
    sockaddr_in, sockaddr_in6, sockaddr_un,
};
use upstrand_core::live::render::SlabView;
use upstrand_core::live::sizing::{PeerLayout, SlabShape};
use upstrand_core::live::{down, Addr, Server};

use super::peer::put_down_bits;
use super::{Peer, Peers, AF_INET, AF_INET6, AF_UNIX};
use crate::ffi::counters::{Counters, Slot, SLOT_BYTES};

/// nginx's `NGX_SOCKADDR_STRLEN` with unix sockets (a macro, not in the bindings):
/// `sizeof("unix:") - 1` + `NGX_UNIX_ADDRSTRLEN` (108 on Linux).
const NGX_SOCKADDR_STRLEN: usize = 5 + 108;

/// nginx's `NGX_HTTP_UPSTREAM_SID_LEN` (an md5 in hex; a macro, not in the bindings).
#[cfg(ngx_upstream_sid)]
const NGX_HTTP_UPSTREAM_SID_LEN: usize = 32;

/// The slab pool of a zone.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slab(pub(super) NonNull<ngx_slab_pool_t>);

impl Slab {
    /// # Safety
    /// `p` is null or the slab pool at the start of a live shared-memory zone (`shm.addr`),
    /// alive as long as the handle is used (the configuration's cycle).
    pub unsafe fn from_ptr(p: *mut ngx_slab_pool_t) -> Option<Slab> {
        NonNull::new(p).map(Slab)
    }

    pub(in crate::ffi) fn raw(self) -> *mut ngx_slab_pool_t {
        self.0.as_ptr()
    }

    /// Allocates zeroed memory for a `T` (plain data that zeroed bytes make valid) in the zone;
    /// None when the zone is full. Takes the pool's mutex itself.
    pub fn calloc<T>(self) -> Option<NonNull<T>> {
        // SAFETY: the pool is live (handle); ngx_slab_calloc locks it and returns zeroed memory
        // aligned for any structure or null.
        NonNull::new(unsafe { ngx_slab_calloc(self.raw(), size_of::<T>()) }.cast::<T>())
    }

    /// Allocates `n` bytes in the zone (not zeroed); None when it is full. Takes the mutex.
    pub fn alloc_bytes(self, n: usize) -> Option<NonNull<u8>> {
        // SAFETY: the pool is live (handle); ngx_slab_alloc locks it.
        NonNull::new(unsafe { ngx::ffi::ngx_slab_alloc(self.raw(), n) }.cast::<u8>())
    }

    /// The pool, for `ngx_slab_free` of what [`Self::alloc_bytes`] returned.
    pub(crate) fn raw_pool(self) -> *mut ngx_slab_pool_t {
        self.raw()
    }

    /// True when `addr` is inside the zone (the pool is at its start, `end` at its end).
    pub(in crate::ffi) fn contains(self, addr: usize) -> bool {
        // SAFETY: the pool is live (handle); `end` is set once by ngx_slab_init.
        let end = unsafe { (*self.raw()).end } as usize;
        (self.raw() as usize..end).contains(&addr)
    }

    /// Takes the pool's mutex, released by the guard.
    pub fn lock(self) -> SlabLocked {
        // SAFETY: the mutex lives in the pool (handle).
        unsafe { ngx_shmtx_lock(ptr::addr_of_mut!((*self.raw()).mutex)) };
        SlabLocked(self)
    }

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
        // SAFETY: the pool is live and locked (m); `start`, `end`, `pfree` are plain words;
        // `ngx_pagesize` is a plain global nginx sets at start.
        let (start, end, pfree, page) = unsafe {
            let pool = self.raw();
            let (start, end) = ((*pool).start as usize, (*pool).end as usize);
            (start, end, (*pool).pfree as u64, ngx_pagesize as u64)
        };
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

/// A held slab mutex.
pub struct SlabLocked(pub(in crate::ffi) Slab);

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl SlabLocked {
    /// Runs `f` with the pool's `min_shift` and its statistics per size class (nginx updates
    /// them under the mutex, which is held).
    pub fn size_classes<T>(&self, f: impl FnOnce(usize, &[ngx_slab_stat_t]) -> T) -> T {
        let pool = self.0.raw();
        // SAFETY: the pool is live (handle) and its mutex held (guard), so nothing writes the
        // statistics while `f` reads them; `stats` has one entry per size class,
        // `ngx_pagesize_shift - min_shift` of them (as ngx_slab_init makes it).
        unsafe {
            let shift = (*pool).min_shift;
            let classes = ngx_pagesize_shift.saturating_sub(shift);
            f(
                shift,
                core::slice::from_raw_parts((*pool).stats as *const ngx_slab_stat_t, classes),
            )
        }
    }

    /// Turns nginx's `[crit] ngx_slab_alloc() failed: no memory` line on or off; returns the
    /// previous setting.
    pub fn set_log_nomem(&self, on: bool) -> bool {
        // SAFETY: the pool is live and its mutex held (guard).
        unsafe {
            let pool = self.0.raw();
            let was = (*pool).log_nomem() != 0;
            (*pool).set_log_nomem(u32::from(on));
            was
        }
    }

    /// Allocates a new peer for `s` in the zone, laid out like the zone module's copies; `name`
    /// is `s.addr.name()` (made by the caller before the locks were taken); `run_bits`: the
    /// run-time `down` bits it starts with (`down::CHECKING` under `probe ... mandatory`); `id`:
    /// its id ([`Peer::id`]). `None` when the zone is full (everything allocated so far is freed
    /// again).
    pub fn alloc_peer(&self, s: &Server, name: &str, run_bits: usize, id: u64) -> Option<Peer> {
        let pool = self.0.raw();
        let name_len = name.len().min(NGX_SOCKADDR_STRLEN);
        // SAFETY: the mutex is held (guard); every allocation is checked before use and freed on
        // failure; the peer is zeroed, so unset fields (lock, conns, fails, refs, next...) start
        // at 0.
        unsafe {
            let p = ngx_slab_calloc_locked(pool, size_of::<ngx_http_upstream_rr_peer_t>())
                .cast::<ngx_http_upstream_rr_peer_t>();
            if p.is_null() {
                return None;
            }
            let sa =
                ngx_slab_calloc_locked(pool, size_of::<ngx_sockaddr_t>()).cast::<ngx_sockaddr_t>();
            let nm = ngx_slab_calloc_locked(pool, NGX_SOCKADDR_STRLEN).cast::<u8>();
            let sv = ngx_slab_calloc_locked(pool, name_len.max(1)).cast::<u8>();
            let ct = ngx_slab_calloc_locked(pool, SLOT_BYTES).cast::<u8>();
            if sa.is_null() || nm.is_null() || sv.is_null() || ct.is_null() {
                for q in [sa.cast::<u8>(), nm, sv, ct] {
                    if !q.is_null() {
                        ngx_slab_free_locked(pool, q.cast());
                    }
                }
                ngx_slab_free_locked(pool, p.cast());
                return None;
            }
            (*p).socklen = write_addr(&s.addr, &mut *sa);
            (*p).sockaddr = sa.cast();
            ptr::copy_nonoverlapping(name.as_ptr(), nm, name_len);
            (*p).name.data = nm;
            (*p).name.len = name_len;
            ptr::copy_nonoverlapping(name.as_ptr(), sv, name_len);
            (*p).server.data = sv;
            (*p).server.len = name_len;
            let w = s.weight as isize;
            (*p).weight = w;
            (*p).effective_weight = w;
            (*p).current_weight = 0;
            (*p).max_fails = s.max_fails as usize;
            (*p).fail_timeout = s.fail_timeout_s as _;
            (*p).max_conns = s.max_conns as usize;
            (*p).down = put_down_bits(s) | (run_bits & !down::SET_BY_PUT);
            (*p).slow_start = id as _;
            (*p).start_time = ct as usize as _;
            // nginx builds with sticky sessions (cfg ngx_upstream_sid) give every zone peer a
            // `sid` buffer; an empty one here (only `sticky`, which the API refuses, reads it).
            #[cfg(ngx_upstream_sid)]
            {
                let sid = ngx_slab_calloc_locked(pool, NGX_HTTP_UPSTREAM_SID_LEN).cast::<u8>();
                if sid.is_null() {
                    for q in [sa.cast::<u8>(), nm, sv, ct] {
                        ngx_slab_free_locked(pool, q.cast());
                    }
                    ngx_slab_free_locked(pool, p.cast());
                    return None;
                }
                (*p).sid.data = sid;
                (*p).sid.len = 0;
            }
            // The unlinked mark (`ListsWrite::is_unlinked`): in no list yet.
            (*p).next = p;
            Some(Peer(NonNull::new_unchecked(p)))
        }
    }

    /// A new, empty backup list sharing `primary`'s zone and name.
    pub fn alloc_list(&self, primary: Peers) -> Option<Peers> {
        let pool = self.0.raw();
        // SAFETY: the mutex is held (guard); zeroed memory is a valid empty list (rwlock 0:
        // unlocked); primary is live (handle).
        unsafe {
            let b = ngx_slab_calloc_locked(pool, size_of::<ngx_http_upstream_rr_peers_t>())
                .cast::<ngx_http_upstream_rr_peers_t>();
            if b.is_null() {
                return None;
            }
            (*b).shpool = pool;
            (*b).name = (*primary.raw()).name;
            Some(Peers(NonNull::new_unchecked(b)))
        }
    }

    /// A fresh statistics slot (`ffi/counters.rs`) in the zone; None when it is full.
    pub(in crate::ffi) fn calloc_slot(&self) -> Option<Counters> {
        // SAFETY: the mutex is held (guard); zeroed memory is a fresh slot (all atomics).
        let p = unsafe { ngx_slab_calloc_locked(self.0.raw(), SLOT_BYTES) };
        NonNull::new(p.cast::<Slot>()).map(Counters)
    }

    /// Frees a peer and the slab allocations it owns (through [`super::ListsWrite::free_unlinked`],
    /// which checks what it can of the contract).
    ///
    /// # Safety
    /// `p` belongs to this zone and nobody uses it any more: it is in no list, not in use
    /// ([`Peer::in_use`] false), the write locks of every list it was in are held by this
    /// process, and the caller drops every copy of the handle.
    pub(super) unsafe fn free_peer(&self, p: Peer) {
        let pool = self.0.raw();
        // SAFETY: caller; each pointer is a slab allocation of this pool or null.
        unsafe {
            let p = p.raw();
            if !(*p).ssl_session.is_null() {
                ngx_slab_free_locked(pool, (*p).ssl_session);
            }
            #[cfg(ngx_upstream_sid)]
            if !(*p).sid.data.is_null() {
                ngx_slab_free_locked(pool, (*p).sid.data.cast());
            }
            let ct = (*p).start_time as *mut u8;
            for q in [
                (*p).server.data,
                (*p).name.data,
                (*p).sockaddr.cast::<u8>(),
                ct,
            ] {
                if !q.is_null() {
                    ngx_slab_free_locked(pool, q.cast());
                }
            }
            ngx_slab_free_locked(pool, p.cast());
        }
    }
}

impl Drop for SlabLocked {
    fn drop(&mut self) {
        // SAFETY: taken in `Slab::lock` by this process.
        unsafe { ngx_shmtx_unlock(ptr::addr_of_mut!((*self.0.raw()).mutex)) };
    }
}

impl Counters {
    /// # Safety
    /// `p` is null or a [`Slot`] in a zone (a slab allocation, [`SlabLocked::calloc_slot`] or
    /// [`SlabLocked::alloc_peer`]), alive while the handle is used (it is freed with its peer).
    pub(crate) unsafe fn from_ptr(p: *mut Slot) -> Option<Counters> {
        NonNull::new(p).map(Counters)
    }

    pub(in crate::ffi) fn s(&self) -> &Slot {
        // SAFETY: the slot is live (handle); every field is an atomic, so a shared reference is
        // sound while other workers add to it.
        unsafe { self.0.as_ref() }
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
