//! The per-server statistics counters of a live upstream: one [`Slot`] per peer,
//! a slab allocation in the upstream's zone that every worker adds to with atomics (no lock).
//!
//! How a request finds its server's slot without a lookup: the peer's `start_time` field (an
//! `ngx_msec_t` that only NGINX Plus uses; open-source nginx from 1.22 to 1.30 declares it and
//! never reads or writes it) holds the slot's address (`ffi/peers/`: `Peer::counters`). The
//! slot is made with the peer — by [`super::peers::SlabLocked::alloc_peer`] for a server a `PUT`
//! adds, by [`super::peers::ListsWrite::attach_counters`] for the configured servers when the
//! zone is made — and freed with it (`SlabLocked::free_peer`), so a server kept by a `PUT` keeps
//! its counters and a removed one's go when its peer goes. The balancer wrapper
//! (`live/balancer.rs`) takes the chosen peer from the peer connection right after the
//! balancer's `get` (nginx's round robin and least_conn point `pc->name` at the chosen peer's
//! `name`), counts the selection there, and counts the try's end just *before* the balancer's
//! `free`, while the try still holds the peer (`conns`), so the slot cannot be freed under it.
//!
//! What nginx has set when the `free` of a try runs (`ngx_http_upstream.c`, the same in 1.22.1,
//! 1.26.3 and 1.30): `u->state->status` once the status line was read (the proxy module sets it;
//! `ngx_http_upstream_next` sets its own code only after the `free`), `header_time` once the
//! header was processed (else `-1`), `bytes_received` (header and body as read so far; the
//! finalizing path adds the buffered body before the `free`), `bytes_sent` (both paths copy the
//! connection's `sent` before the `free`). `response_time` is set before the `free` only on the
//! finalizing path, so the try's time is taken here as nginx computes it: `ngx_current_msec -
//! u->start_time`.

use core::mem::size_of;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ngx::ffi::{
    ngx_http_upstream_rr_peer_t, ngx_msec_t, ngx_slab_calloc_locked, ngx_str_t, sockaddr,
};
use upstrand_core::live::stats::{status_class, RawCounters};

use super::peers::{ListsWrite, Peer, Peers, SlabLocked};
use super::request::Req;

/// One server's counters in the zone (zeroed memory is a fresh slot). See
/// `upstrand_core::live::stats::RawCounters` for each one's meaning.
#[repr(C)]
pub struct Slot {
    requests: AtomicU64,
    classes: [AtomicU64; 5],
    sent: AtomicU64,
    received: AtomicU64,
    fails: AtomicU64,
    unavail: AtomicU64,
    downtime: AtomicU64,
    downstart_ms: AtomicU64,
    selected_ms: AtomicU64,
    header_ms: AtomicU64,
    response_ms: AtomicU64,
}

/// The slot's size (the zone sizing estimate counts it, `PeerLayout::counters`).
pub const SLOT_BYTES: usize = size_of::<Slot>();
const _: () = assert!(SLOT_BYTES == 15 * 8);

/// What one ended try left, read from the request's upstream before the balancer's `free`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TryEnd {
    /// The status the server answered (0: no status line).
    pub status: u64,
    /// Time to the response header (None: no header).
    pub header_ms: Option<u64>,
    /// Time from the start of the try to now.
    pub response_ms: u64,
    /// Bytes sent to the server.
    pub sent: u64,
    /// Bytes received from the server.
    pub received: u64,
}

impl TryEnd {
    /// The figures of `r`'s current try (zeros without an upstream state).
    pub fn of(r: Req) -> TryEnd {
        r.get(|r| {
            // SAFETY: r->upstream is null or the request's live upstream; its `state` is null
            // or the entry of the current try in `r->upstream_states` (request pool).
            let Some(u) = (unsafe { r.upstream.as_ref() }) else {
                return TryEnd::default();
            };
            // SAFETY: as above.
            let Some(st) = (unsafe { u.state.as_ref() }) else {
                return TryEnd::default();
            };
            let now = super::current_msec();
            TryEnd {
                status: st.status as u64,
                header_ms: (st.header_time != ngx_msec_t::MAX).then_some(st.header_time as u64),
                response_ms: now.saturating_sub(u.start_time as u64),
                sent: st.bytes_sent.max(0) as u64,
                received: st.bytes_received.max(0) as u64,
            }
        })
    }
}

/// A handle on one peer's [`Slot`] (valid while the peer is: see the module comment).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Counters(NonNull<Slot>);

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl Counters {
    /// # Safety
    /// `p` is null or a [`Slot`] in a zone, alive while the handle is used.
    pub(crate) unsafe fn from_ptr(p: *mut Slot) -> Option<Counters> {
        NonNull::new(p).map(Counters)
    }

    fn s(&self) -> &Slot {
        // SAFETY: the slot is live (handle); every field is an atomic, so a shared reference is
        // sound while other workers add to it.
        unsafe { self.0.as_ref() }
    }

    /// The server was chosen for a try at `now_ms` (epoch ms).
    #[inline]
    pub fn selected(self, now_ms: u64) {
        let s = self.s();
        s.requests.fetch_add(1, Relaxed);
        s.selected_ms.store(now_ms, Relaxed);
    }

    /// A try ended: `failed` (nginx's `NGX_PEER_FAILED`), `became_unavail` (that failure made
    /// the server's `fails` reach `max_fails`), at `now_ms` (epoch ms).
    #[inline]
    pub fn ended(self, t: &TryEnd, failed: bool, became_unavail: bool, now_ms: u64) {
        let s = self.s();
        let response = match (status_class(t.status), t.header_ms) {
            (Some(c), Some(h)) => {
                if let Some(n) = s.classes.get(c) {
                    n.fetch_add(1, Relaxed);
                }
                s.header_ms.fetch_add(h, Relaxed);
                s.response_ms.fetch_add(t.response_ms, Relaxed);
                true
            }
            _ => false,
        };
        if t.sent != 0 {
            s.sent.fetch_add(t.sent, Relaxed);
        }
        if t.received != 0 {
            s.received.fetch_add(t.received, Relaxed);
        }
        if failed {
            s.fails.fetch_add(1, Relaxed);
            if became_unavail {
                s.unavail.fetch_add(1, Relaxed);
                self.down_begins(now_ms);
            }
        } else if response {
            self.down_ends(now_ms);
        }
    }

    /// A down spell begins at `now_ms` (unless one is on).
    pub fn down_begins(self, now_ms: u64) {
        let _ = self
            .s()
            .downstart_ms
            .compare_exchange(0, now_ms.max(1), Relaxed, Relaxed);
    }

    /// The current down spell (if any) ends at `now_ms`: its length goes to `downtime`.
    #[inline]
    pub fn down_ends(self, now_ms: u64) {
        let s = self.s();
        if s.downstart_ms.load(Relaxed) == 0 {
            return;
        }
        let began = s.downstart_ms.swap(0, Relaxed);
        if began != 0 {
            s.downtime.fetch_add(now_ms.saturating_sub(began), Relaxed);
        }
    }

    /// A copy of the counters.
    pub fn read(self) -> RawCounters {
        let s = self.s();
        let mut classes = [0u64; 5];
        for (d, c) in classes.iter_mut().zip(&s.classes) {
            *d = c.load(Relaxed);
        }
        RawCounters {
            requests: s.requests.load(Relaxed),
            classes,
            sent: s.sent.load(Relaxed),
            received: s.received.load(Relaxed),
            fails: s.fails.load(Relaxed),
            unavail: s.unavail.load(Relaxed),
            downtime: s.downtime.load(Relaxed),
            downstart_ms: s.downstart_ms.load(Relaxed),
            selected_ms: s.selected_ms.load(Relaxed),
            header_ms: s.header_ms.load(Relaxed),
            response_ms: s.response_ms.load(Relaxed),
        }
    }
}

/// The peer's id and counters fields (`slow_start`, `start_time`; see `ffi/peers/`).
impl Peer {
    /// The peer whose `name` field is at `name`, when the peer's `sockaddr` is `sockaddr`.
    ///
    /// # Safety
    /// `name` is null or `pc->name` right after a successful `get` of nginx's round robin or
    /// least_conn (with or without keepalive) on a list of a zone: those set `pc->name` to the
    /// chosen peer's `&peer->name` and `pc->sockaddr` to its `sockaddr`, and hold the peer
    /// (`conns`) until their `free`.
    pub(crate) unsafe fn chosen(name: *const ngx_str_t, sockaddr: *const sockaddr) -> Option<Peer> {
        if name.is_null() || sockaddr.is_null() {
            return None;
        }
        let off = core::mem::offset_of!(ngx_http_upstream_rr_peer_t, name);
        // SAFETY: caller: `name` is the `name` field of a live peer, so stepping back by its
        // offset gives the peer; its `sockaddr` is read to confirm.
        unsafe {
            let p = name.cast::<u8>().sub(off) as *mut ngx_http_upstream_rr_peer_t;
            if (*p).sockaddr.cast_const() != sockaddr {
                return None;
            }
            NonNull::new(p).map(Peer)
        }
    }

    /// The peer's statistics counters (`start_time` holds their address, see
    /// `ffi/counters.rs`); None for a peer without (the zone was too full to make them).
    #[inline]
    pub fn counters(self) -> Option<Counters> {
        // SAFETY: p is live (handle); the field is written only before the peer is linked (or
        // when the zone is made); it is 0 or a slot of this zone, freed only with the peer.
        unsafe { Counters::from_ptr((*self.raw()).start_time as *mut _) }
    }

    /// `(fails, max_fails)` now (a snapshot: a balancer may be changing `fails`), and whether
    /// its list is `single` (nginx counts no failure then); read while the peer is held.
    pub fn passive(self, list: Peers) -> (u64, u64, bool) {
        // SAFETY: p is live (handle); list is live (handle).
        unsafe {
            let p = self.raw();
            (
                (*p).fails as u64,
                (*p).max_fails as u64,
                (*list.raw()).single() != 0,
            )
        }
    }

    /// The server's id in its zone (kept in the peer's `slow_start`, see the module comment).
    /// Set once, before the peer is in a list.
    pub fn id(self) -> u64 {
        // SAFETY: p is live (handle); the field is written only before the peer is linked.
        unsafe { (*self.raw()).slow_start as u64 }
    }
}

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl ListsWrite {
    /// Gives the peers of these lists ids from `next` on, in list order (primary first), and
    /// returns the next free id: the servers of a zone nginx just made (ids start at 0).
    pub fn assign_ids(&self, mut next: u64) -> u64 {
        for list in [Some(self.primary), self.backup] {
            let Some(list) = list else { continue };
            // SAFETY: the list's write lock is held (guard); its chain of live peers ends with
            // null.
            unsafe {
                let mut p = (*list.raw()).peer;
                while !p.is_null() {
                    (*p).slow_start = next as _;
                    next = next.wrapping_add(1);
                    p = (*p).next;
                }
            }
        }
        next
    }

    /// Gives every peer of these lists that has none its statistics counters (the configured
    /// servers, when the zone is made); false when the zone is full.
    pub fn attach_counters(&self, m: &SlabLocked) -> bool {
        for list in [Some(self.primary), self.backup] {
            let Some(list) = list else { continue };
            // SAFETY: the list's write lock is held (guard) and the slab mutex (m); its chain of
            // live peers ends with null; a zeroed slot is a fresh one.
            unsafe {
                let mut p = (*list.raw()).peer;
                while !p.is_null() {
                    if (*p).start_time == 0 {
                        let ct = ngx_slab_calloc_locked(m.0.raw(), SLOT_BYTES);
                        if ct.is_null() {
                            return false;
                        }
                        (*p).start_time = ct as usize as _;
                    }
                    p = (*p).next;
                }
            }
        }
        true
    }
}
