//! The per-server statistics counters of a live upstream: one [`Slot`] per peer,
//! a slab allocation in the upstream's zone that every worker adds to with atomics (no lock).
//!
//! How a request finds its server's slot without a lookup: the peer's `start_time` field (an
//! `ngx_msec_t` that only NGINX Plus uses; open-source nginx from 1.22 to 1.30 declares it and
//! never reads or writes it) holds the slot's address (`ffi/peers/`: `Peer::counters`). The
//! slot is made with the peer — by [`super::peers::SlabLocked::alloc_peer`] for a server a `PUT`
//! adds, by [`super::peers::ListsWrite::attach_counters`] for the configured servers when the
//! zone is made — and freed with it (`ListsWrite::free_unlinked`), so a server kept by a `PUT` keeps
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

use upstrand_core::live::stats::{status_class, RawCounters};

use super::peers::{ListsWrite, SlabLocked};

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

/// A handle on one peer's [`Slot`] (valid while the peer is: see the module comment).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Counters(pub(in crate::ffi) NonNull<Slot>);

impl Counters {
    /// # Safety
    /// `p` is null or a [`Slot`] in a zone (a slab allocation, `SlabLocked::calloc_slot` or
    /// `SlabLocked::alloc_peer`), alive while the handle is used (it is freed with its peer).
    #[inline]
    pub(crate) unsafe fn from_ptr(p: *mut Slot) -> Option<Counters> {
        NonNull::new(p).map(Counters)
    }
}

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl Counters {
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
        for list in [Some(self.primary), self.backup].into_iter().flatten() {
            for p in self.members(list) {
                self.peer_mut(p, |q| q.slow_start = next as _);
                next = next.wrapping_add(1);
            }
        }
        next
    }

    /// Gives every peer of these lists that has none its statistics counters (the configured
    /// servers, when the zone is made); false when the zone is full.
    pub fn attach_counters(&self, m: &SlabLocked) -> bool {
        for list in [Some(self.primary), self.backup].into_iter().flatten() {
            for p in self.members(list) {
                if self.peer_mut(p, |q| q.start_time) == 0 {
                    let Some(ct) = m.calloc_slot() else {
                        return false;
                    };
                    self.peer_mut(p, |q| q.start_time = ct.0.as_ptr() as usize as _);
                }
            }
        }
        true
    }
}
