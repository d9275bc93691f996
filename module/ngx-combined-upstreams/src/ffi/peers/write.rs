//! The write side of a zone's lists: [`ListsWrite`] (both lists' write locks held; every change
//! of a `PUT`, a health or slow start change and the retired chain's upkeep) and the retired
//! chain's head ([`Retired`], [`RetiredChain`]). Panic-free under the locks (see `peers/mod.rs`).

use core::ptr::{self, NonNull};

use ngx::ffi::{ngx_http_upstream_rr_peer_t, ngx_rwlock_unlock};
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
    /// Links `b` as the primary list's backup list (a list made while these locks are held is not
    /// locked by them: the caller keeps every selection out by holding the gate's write side).
    pub fn set_backup(&self, b: Peers) {
        // SAFETY: the primary's write lock is held (guard).
        unsafe { (*self.primary.raw()).next = b.raw() };
    }

    /// Replaces the peers of `list` (the primary or its backup list) by `members`, in order, and
    /// its totals, as `ngx_http_upstream_init_round_robin` computes them; each member is in no
    /// other list.
    pub fn set_list(&self, list: Peers, members: impl Iterator<Item = Peer>, t: ListTotals) {
        // SAFETY: the list's write lock is held (guard; or the gate's write side for a backup
        // list made after it was taken); the members are live peers of this zone, so writing
        // their `next` links and the list's fields races with no reader.
        unsafe {
            let mut first: *mut ngx_http_upstream_rr_peer_t = ptr::null_mut();
            let mut last: *mut ngx_http_upstream_rr_peer_t = ptr::null_mut();
            for m in members {
                if last.is_null() {
                    first = m.raw();
                } else {
                    (*last).next = m.raw();
                }
                last = m.raw();
            }
            if !last.is_null() {
                (*last).next = ptr::null_mut();
            }
            let l = list.raw();
            (*l).peer = first;
            (*l).number = t.number;
            (*l).total_weight = t.total_weight as usize;
            (*l).tries = t.tries;
            (*l).set_single(u32::from(t.single));
            (*l).set_weighted(u32::from(t.weighted));
        }
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
            // SAFETY: the list's write lock is held (guard); its chain of live peers ends with
            // null; each peer's `name` holds `name.len` bytes in the zone.
            unsafe {
                let mut p = (*list.raw()).peer;
                while !p.is_null() {
                    let hit = match name {
                        None => true,
                        Some(n) => crate::ffi::bytes(&(*p).name) == n,
                    };
                    if hit {
                        let new = ((*p).down & !MASK) | (bits & MASK);
                        if new != (*p).down {
                            // Back from unhealthy: the probes saw it answer, so the passive
                            // failures the outage left (`max_fails` within `fail_timeout`) do not
                            // keep it out of rotation any longer.
                            if (*p).down & down::UNHEALTHY != 0 && new & down::UNHEALTHY == 0 {
                                (*p).fails = 0;
                            }
                            // Unhealthy or checking is a down spell of its statistics.
                            if let Some(c) = Peer(NonNull::new_unchecked(p)).counters() {
                                if new & MASK != 0 {
                                    c.down_begins(now);
                                } else {
                                    c.down_ends(now);
                                }
                            }
                            (*p).down = new;
                            changed = changed.wrapping_add(1);
                        }
                    }
                    p = (*p).next;
                }
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
            // SAFETY: as in `set_health_bits`.
            unsafe {
                let mut others_up = false;
                let mut p = (*list.raw()).peer;
                while !p.is_null() {
                    if crate::ffi::bytes(&(*p).name) != name && (*p).down == 0 {
                        others_up = true;
                    }
                    p = (*p).next;
                }
                let mut p = (*list.raw()).peer;
                while !p.is_null() {
                    if crate::ffi::bytes(&(*p).name) == name {
                        if sit_out && others_up {
                            (*p).down |= down::SLOW_START;
                            set = true;
                        } else {
                            (*p).down &= !down::SLOW_START;
                        }
                    }
                    p = (*p).next;
                }
            }
        }
        set
    }

    /// Puts `p` (just removed from these lists, still in use) on the retired chain `chain` of
    /// these lists' upstream, retired at `now_ms` (`ngx_current_msec`; kept in its `max_conns`).
    pub fn retire(&self, chain: RetiredChain, p: Peer, now_ms: u64) {
        // SAFETY: the chain's head lives in the zone (handle) and, like the `next` links of
        // retired peers, changes only with these locks held; p is live (handle) and in no list,
        // so no selection reads its `max_conns` any more.
        unsafe {
            (*p.raw()).max_conns = now_ms as usize;
            let head = ptr::addr_of_mut!((*chain.0.as_ptr()).0);
            (*p.raw()).next = *head;
            *head = p.raw();
        }
    }

    /// Frees the retired peers of `chain` (these lists' upstream's) that are no longer in use;
    /// returns how many.
    pub fn free_idle_retired(&self, chain: RetiredChain, m: &SlabLocked) -> u64 {
        let mut freed: u64 = 0;
        // SAFETY: `link` is the chain's head or the `next` field of a retired peer; every
        // non-null link is a retired peer of this zone; the chain changes only with these
        // locks held. With them held no balancer's `free` is inside its locked section, so a
        // peer not in use is referenced by no request any more (the balancer wrapper copied
        // the peer's name and address into the request).
        unsafe {
            let mut link = ptr::addr_of_mut!((*chain.0.as_ptr()).0);
            while let Some(p) = NonNull::new(*link).map(Peer) {
                if p.in_use() {
                    link = ptr::addr_of_mut!((*p.raw()).next);
                } else {
                    *link = (*p.raw()).next;
                    // Unlinked from the chain (and in no list), not in use, locks held.
                    m.free_peer(p);
                    freed = freed.wrapping_add(1);
                }
            }
        }
        freed
    }

    /// Applies the settings of `s` to a peer of these lists (weights restart when the weight
    /// changes).
    pub fn set_settings(&self, p: Peer, s: &Server) {
        // SAFETY: p is live (handle); its list's write lock is held, so no balancer reads or
        // writes these fields meanwhile.
        unsafe {
            let p = p.raw();
            let w = s.weight as isize;
            if (*p).weight != w {
                (*p).weight = w;
                (*p).effective_weight = w;
                (*p).current_weight = 0;
            }
            (*p).max_fails = s.max_fails as usize;
            (*p).fail_timeout = s.fail_timeout_s as _;
            (*p).max_conns = s.max_conns as usize;
            (*p).down = down::merge((*p).down, put_down_bits(s));
        }
    }
}

impl Drop for ListsWrite {
    fn drop(&mut self) {
        // SAFETY: both taken in `Peers::write_both` by this process; the backup first released.
        unsafe {
            if let Some(b) = self.backup {
                ngx_rwlock_unlock(ptr::addr_of_mut!((*b.raw()).rwlock));
            }
            ngx_rwlock_unlock(ptr::addr_of_mut!((*self.primary.raw()).rwlock));
        }
    }
}

/// The head of an upstream's chain of retired peers (out of every list, still in use), chained
/// through their `next` links; it lives in the upstream's zone, in its live state, and is used
/// only with both list write locks of that upstream held ([`ListsWrite::retire`],
/// [`ListsWrite::free_idle_retired`]). Zeroed memory is an empty chain.
#[repr(transparent)]
pub struct Retired(pub(super) *mut ngx_http_upstream_rr_peer_t);

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
