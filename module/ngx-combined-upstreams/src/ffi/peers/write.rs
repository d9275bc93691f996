//! The write side of a zone's lists: [`ListsWrite`] (both lists' write locks held; every change
//! of a `PUT`, a health or slow start change and the retired chain's upkeep) and the retired
//! chain's head ([`Retired`], [`RetiredChain`]). Panic-free under the locks (below).
//! Safe code on the write side's primitives in `peers/mod.rs` (`ListsWrite::peer_mut`, ...).
//!
//! A retired peer's `max_conns` holds the time it was retired (`ngx_current_msec`, a monotonic
//! clock shared by the workers): only a selection reads `max_conns`, and a retired peer is in no
//! list, so nothing selects it again ([`ListsWrite::retire`],
//! [`ListsRead::retired`](super::ListsRead::retired)).
//!
//! Freeing: a peer leaves the zone only through [`ListsWrite::free_unlinked`], which checks the
//! unlinked mark (the peer's `next` points at itself: set when
//! [`SlabLocked::alloc_peer`](super::SlabLocked::alloc_peer) makes it, when
//! [`ListsWrite::set_lists`] takes it out of the lists and when the sweep takes it off the retired
//! chain; overwritten whenever it is linked) and that it is not in use. So no safe call frees a
//! peer that a list or the chain still holds; `SlabLocked::free_peer` itself stays `unsafe` (in
//! `ffi/pool.rs`).
//!
//! Write locks: nginx's rwlocks have no owner and no recovery (a worker that dies holding one
//! leaves it held), so the API never takes a write side with `ngx_rwlock_wlock`, which spins
//! forever: [`wlock_until`](crate::ffi::pool::wlock_until) spins and yields on the same lock word
//! until a deadline and reports failure (the `PUT` then answers 503 and changes nothing, a sweep of
//! retired peers waits for the next chance). Read sides are taken with nginx's own
//! `ngx_rwlock_rlock`, which the lock word format therefore stays compatible with.
//!
//! Panic-free write sections: a write side held when the process aborts (the release profile has
//! `panic = "abort"`) would never be released, stopping every worker's selections for good. So the
//! code that runs with a write side held — [`ListsWrite`]'s and [`SlabLocked`]'s methods (here, in
//! `peers/mod.rs`, `slab.rs` and `ffi/pool.rs`) and `LiveUpstream::swap`/`sweep` in `live/zone.rs`
//! — allocates nothing (no `Vec`, `String`, `format!`: buffers and names are prepared before the
//! locks are taken), indexes nothing, unwraps nothing and does no overflow-checked arithmetic.
//! `clippy` checks the last three (`#[deny(...)]` on those items: `indexing_slicing`,
//! `unwrap_used`, `expect_used`, `panic`, `arithmetic_side_effects`, ...); allocation is a review
//! item.

use core::ptr::{self, NonNull};
use core::sync::atomic::AtomicPtr;

use ngx::ffi::ngx_http_upstream_rr_peer_t;
use upstrand_core::live::plan::ListTotals;
use upstrand_core::live::{down, Server};

use super::peer::put_down_bits;
use super::{Peer, Peers, SlabLocked};

/// The held write locks of a primary list and of the backup list it had when they were taken.
/// Its methods run with the write locks held: panic-free (see the module comment).
pub struct ListsWrite {
    pub(in crate::ffi) primary: Peers,
    pub(in crate::ffi) backup: Option<Peers>,
}

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl ListsWrite {
    /// Replaces the peers of the primary list and of its backup list (when it has one, which
    /// may be a list linked by [`Self::set_backup`] under these locks) by `primary` and `backup`,
    /// in order, with their totals, as `ngx_http_upstream_init_round_robin` computes them; each
    /// peer is a member of at most one of them. Every peer of the old lists is marked unlinked
    /// first (`peers/mod.rs`), so afterwards exactly the peers of neither new list carry the
    /// mark and may be retired or freed ([`Self::retire`], [`Self::free_unlinked`]).
    pub fn set_lists(
        &self,
        primary: (impl Iterator<Item = Peer>, ListTotals),
        backup: (impl Iterator<Item = Peer>, ListTotals),
    ) {
        let backup_list = self.primary.backup();
        for list in [Some(self.primary), backup_list].into_iter().flatten() {
            self.mark_unlinked(list);
        }
        self.link(self.primary, primary.0, primary.1);
        if let Some(b) = backup_list {
            self.link(b, backup.0, backup.1);
        }
    }

    /// Links `members` in order as the peers of `list` and sets its totals.
    fn link(&self, list: Peers, members: impl Iterator<Item = Peer>, t: ListTotals) {
        let mut first = None;
        let mut last: Option<Peer> = None;
        for m in members {
            match last {
                None => first = Some(m),
                Some(l) => self.peer_mut(l, |l| l.next = m.raw()),
            }
            last = Some(m);
        }
        if let Some(l) = last {
            self.peer_mut(l, |l| l.next = ptr::null_mut());
        }
        self.set_head(list, first, t);
    }

    /// Sets the run-time health bits (`down::UNHEALTHY | down::CHECKING`) of the peers named
    /// `name` (or of every peer when `name` is None) in these lists to `bits`, keeping the other
    /// bits; how many peers changed. A peer that leaves `UNHEALTHY` also has its passive `fails`
    /// reset.
    pub fn set_health_bits(&self, name: Option<&[u8]>, bits: usize) -> usize {
        const MASK: usize = down::UNHEALTHY | down::CHECKING;
        let mut changed: usize = 0;
        let now = crate::ffi::wall_msec();
        for list in [Some(self.primary), self.backup] {
            let Some(list) = list else { continue };
            for p in self.members(list) {
                let hit = name.is_none_or(|n| p.has_name(n));
                let (old, new) = self.peer_mut(p, |q| (q.down, (q.down & !MASK) | (bits & MASK)));
                if !hit || new == old {
                    continue;
                }
                // Unhealthy or checking is a down spell of its statistics.
                if let Some(c) = p.counters() {
                    if new & MASK != 0 {
                        c.down_begins(now);
                    } else {
                        c.down_ends(now);
                    }
                }
                self.peer_mut(p, |q| {
                    // Back from unhealthy: the probes saw it answer, so the passive failures
                    // the outage left (`max_fails` within `fail_timeout`) do not keep it out of
                    // rotation any longer.
                    if old & down::UNHEALTHY != 0 && new & down::UNHEALTHY == 0 {
                        q.fails = 0;
                    }
                    q.down = new;
                });
                changed = changed.wrapping_add(1);
            }
        }
        changed
    }

    /// Slow start: sets (`sit_out`) or clears `down::SLOW_START` of the peers named `name`. The
    /// bit is set only while another peer of the same list is not skipped for any reason, so a
    /// ramp never leaves a list without a server to use. Whether the bit is set now.
    pub fn set_slow_start(&self, name: &[u8], sit_out: bool) -> bool {
        let mut set = false;
        for list in [Some(self.primary), self.backup] {
            let Some(list) = list else { continue };
            let others_up = self
                .members(list)
                .any(|p| !p.has_name(name) && self.peer_mut(p, |q| q.down == 0));
            for p in self.members(list).filter(|p| p.has_name(name)) {
                self.peer_mut(p, |q| {
                    if sit_out && others_up {
                        q.down |= down::SLOW_START;
                        set = true;
                    } else {
                        q.down &= !down::SLOW_START;
                    }
                });
            }
        }
        set
    }

    /// Puts `p` (just removed from these lists by [`Self::set_lists`], still in use) on the
    /// retired chain `chain` of these lists' upstream, retired at `now_ms` (`ngx_current_msec`;
    /// kept in its `max_conns`): `p` is in no list, so no selection reads its `max_conns` any
    /// more. False (nothing done) when `p` is not marked unlinked (it is in a list or a chain).
    pub fn retire(&self, chain: RetiredChain, p: Peer, now_ms: u64) -> bool {
        if !self.is_unlinked(p) {
            return false;
        }
        let head = self.retired_head(chain);
        self.peer_mut(p, |q| {
            q.max_conns = now_ms as usize;
            q.next = head.map_or(ptr::null_mut(), Peer::raw);
        });
        self.set_retired_head(chain, Some(p));
        true
    }

    /// Applies the settings of `s` to a peer of these lists (weights restart when the weight
    /// changes).
    pub fn set_settings(&self, p: Peer, s: &Server) {
        self.peer_mut(p, |p| {
            let w = s.weight as isize;
            if p.weight != w {
                p.weight = w;
                p.effective_weight = w;
                p.current_weight = 0;
            }
            p.max_fails = s.max_fails as usize;
            p.fail_timeout = s.fail_timeout_s as _;
            p.max_conns = s.max_conns as usize;
            p.down = down::merge(p.down, put_down_bits(s));
        });
    }

    /// Frees the retired peers of `chain` (these lists' upstream's) that are no longer in use;
    /// returns how many.
    pub fn free_idle_retired(&self, chain: RetiredChain, m: &SlabLocked) -> u64 {
        let mut freed: u64 = 0;
        let mut prev: Option<Peer> = None;
        let mut cur = self.retired_head(chain);
        while let Some(p) = cur {
            cur = self.next(p);
            if p.in_use() {
                prev = Some(p);
                continue;
            }
            match prev {
                None => self.set_retired_head(chain, cur),
                Some(q) => self.peer_mut(q, |q| q.next = cur.map_or(ptr::null_mut(), Peer::raw)),
            }
            self.peer_mut(p, |q| q.next = p.raw());
            if self.free_unlinked(m, p) {
                freed = freed.wrapping_add(1);
            }
        }
        freed
    }

    /// The peer after `p` in its list or chain.
    pub(in crate::ffi) fn next(&self, p: Peer) -> Option<Peer> {
        NonNull::new(self.peer_mut(p, |q| q.next)).map(Peer)
    }

    /// True when `p` carries the unlinked mark: its `next` is itself. A peer's `next` is
    /// written when it is linked into a list ([`Self::set_lists`]) or onto the retired chain
    /// ([`Self::retire`]), and set to the mark when it leaves them
    /// ([`Self::set_lists`], [`Self::free_idle_retired`]) or is made
    /// ([`SlabLocked::alloc_peer`]); no list or chain holds a peer that points at itself (nginx
    /// never makes one), so a marked peer is in none of them.
    pub(in crate::ffi) fn is_unlinked(&self, p: Peer) -> bool {
        self.peer_mut(p, |q| q.next) == p.raw()
    }
}

/// The head of an upstream's chain of retired peers (out of every list, still in use), chained
/// through their `next` links; it lives in the upstream's zone, in its live state, and is used
/// only with both list write locks of that upstream held ([`ListsWrite::retire`],
/// [`ListsWrite::free_idle_retired`]). Zeroed memory is an empty chain.
#[repr(transparent)]
pub struct Retired(pub(super) AtomicPtr<ngx_http_upstream_rr_peer_t>);

/// A handle on the [`Retired`] head in an upstream's live state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RetiredChain(pub(super) NonNull<Retired>);

impl RetiredChain {
    /// The handle of the head at `head`, a field of a live state block in a zone (never
    /// dereferenced here: only [`ListsWrite`]'s methods use it, with the locks held).
    pub fn new(head: NonNull<Retired>) -> RetiredChain {
        RetiredChain(head)
    }
}
