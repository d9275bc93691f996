//! Every access to nginx's round-robin peer structures (`ngx_http_upstream_rr_peer_t`,
//! `ngx_http_upstream_rr_peers_t`) the live API makes, in one file so that nginx-version
//! conditionals stay in one place — but for the statistics' own fields of a peer (`slow_start`,
//! `start_time`: its id and its counters; the chosen peer from `pc->name`; `fails`,
//! `max_fails`, `single` for `unavail`), which `ffi/counters.rs` reads and writes through the
//! same handles (no version conditionals there: those fields are the same from 1.22 to 1.30).
//!
//! Fields relied on (same layout in nginx 1.22.1 and 1.26.3; 1.27.3+ adds `host`, `zombie`,
//! `refs` to the peer and `config`/`resolve` to the list, none of which this file touches):
//! - peer: `sockaddr`, `socklen`, `name`, `server`, `weight`, `effective_weight`,
//!   `current_weight`, `conns`, `max_conns`, `fails`, `max_fails`, `fail_timeout`, `down`,
//!   `lock` (zone builds), `ssl_session` (NGX_HTTP_SSL or NGX_COMPAT builds: zone copies keep it
//!   in the slab), `next`;
//! - list: `number`, `shpool`, `rwlock`, `total_weight`, `tries`, `single`, `weighted`,
//!   `name`, `next` (the backup list), `peer`.
//!
//! nginx 1.27.3+ (cfg `nginx1_27_3`): the zone module resolves `server NAME resolve` names
//! itself and rewrites the lists from a timer in every worker (`peers->resolve` holds those
//! servers, `peer->host`, `peers->config`), without the live API's gate. An upstream whose
//! configured lists have a `resolve` server is therefore never made live ([`Peers::resolves_names`] at
//! configuration time: no wrappers, no zone state, `PUT` answered 409). Peers also carry `refs`
//! (taken by every balancer's `get` with `conns`, dropped by its `free`; nginx frees a `zombie`
//! peer when its last reference goes): a peer is freed by the API only when both `conns` and
//! `refs` are 0 ([`Peer::in_use`]). Lists the API creates (the backup list) leave `config` and
//! `resolve` null, which nginx's round robin treats as "no resolver".
//!
//! Other nginx structures the live API reads or writes (stable from 1.22 to 1.30): the slab pool
//! (`mutex`, `min_shift`, `stats`, `pfree`, `start`, `end`, `log_nomem`: `ffi/pool.rs`), the peer
//! connection (`get`, `free`, `data`, `set_session`, `save_session`, `tries`, `name`, `sockaddr`,
//! `socklen`: `live/balancer.rs`), the upstream (`peer`, `shm_zone`, `host`, `srv_conf`) and zone
//! (`init`, `shm.name`, `shm.addr`) configurations (`live/mod.rs`), modules' `name`/`commands`
//! (`ffi/probe.rs`).
//!
//! The fence: [`Peers`] (a list), [`Peer`] (a peer) and [`Slab`] (the zone's slab pool) are
//! copyable handles whose safe methods read or write nginx's structure for the duration of the
//! call, with raw place accesses (no Rust reference into the zone, which other workers write).
//! The handles are made by an `unsafe` constructor ([`Peers::from_ptr`], [`Slab::from_ptr`]) or
//! by another handle, and are valid while the zone lives (the configuration's cycle). What a
//! method needs held is a guard it takes as an argument: [`ListRead`] (a list's read lock),
//! [`ListsWrite`] (both lists' write locks), [`SlabLocked`] (the slab mutex). A [`Peer`] is used
//! only while it cannot be freed: under its list's lock, under the gate's write side (`PUT`), or,
//! for retired peers, under [`ListsWrite`]. Under both list write locks a peer of the lists, of
//! the retired chain or just allocated is this process's alone, so [`ListsWrite`]'s primitives
//! here hand it out as `&mut` for one call (`ListsWrite::peer_mut`) and the write side
//! (`write.rs`, the counters' part in `ffi/counters.rs`) is safe code on them.
//!
//! Files: this one holds the list handle ([`Peers`]) with its read guards, a peer's reads and the
//! write side's primitives; `write.rs` ([`ListsWrite`]'s changes; a retired peer, freeing, the
//! write locks and the panic-free rule of write sections), `peer.rs` ([`Peer`]'s reads; the
//! fields a peer's `down` bits, id and counters are kept in) and `slab.rs` (what a `PUT`
//! allocates; the memory of a peer) are safe code on it and on `ffi/pool.rs` ([`Slab`]).

mod peer;
mod slab;
mod write;

use core::ptr::{self, NonNull};
use core::sync::atomic::Ordering;
use std::time::Instant;

use ngx::ffi::{
    ngx_http_upstream_rr_peer_t, ngx_http_upstream_rr_peers_t, ngx_rwlock_rlock, ngx_rwlock_unlock,
    ngx_str_t, sockaddr,
};
use upstrand_core::live::plan::ListTotals;
use upstrand_core::live::render::RetiredView;

pub use peer::Peer;
pub use slab::{peer_layout, Slab, SlabLocked};

use super::counters::Counters;
use super::pool::wlock_until;
pub use write::{ListsWrite, Retired, RetiredChain};

/// `AF_INET`, `AF_INET6`, `AF_UNIX` as the socket structures store them.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const AF_UNIX: u16 = 1;

/// A round-robin peer list (`ngx_http_upstream_rr_peers_t`) of a round-robin or least_conn
/// upstream: its primary list or its backup list.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Peers(NonNull<ngx_http_upstream_rr_peers_t>);

impl Peers {
    /// # Safety
    /// `p` is null or the round-robin list of a round-robin or least_conn upstream of a
    /// configuration (`peer.data` after its `init_upstream`; the zone's copy once the zone
    /// exists), alive as long as the handle is used (the configuration's cycle), used from
    /// nginx's thread.
    pub unsafe fn from_ptr(p: *mut ngx_http_upstream_rr_peers_t) -> Option<Peers> {
        NonNull::new(p).map(Peers)
    }

    pub(in crate::ffi) fn raw(self) -> *mut ngx_http_upstream_rr_peers_t {
        self.0.as_ptr()
    }

    /// The zone's slab pool (None for a list outside any zone: before the zone is made).
    pub fn slab(self) -> Option<Slab> {
        // SAFETY: the list is live (handle); `shpool` is null or the zone's pool, set once.
        unsafe { Slab::from_ptr((*self.raw()).shpool) }
    }

    /// The list's name (`name`, set once when nginx builds the list), for its backup list.
    pub(in crate::ffi) fn name_ptr(self) -> *mut ngx_str_t {
        // SAFETY: the list is live (handle); a plain word.
        unsafe { (*self.raw()).name }
    }

    /// The backup list, when there is one. Read under the primary list's lock or the gate:
    /// only a `PUT` sets it (with both).
    pub fn backup(self) -> Option<Peers> {
        // SAFETY: the list is live (handle); `next` is null or the upstream's backup list,
        // which lives as long as the primary.
        NonNull::new(unsafe { (*self.raw()).next }).map(Peers)
    }

    /// True when this list or its backup list has servers with the `resolve` parameter (never
    /// before nginx 1.27.3, which has no such parameter).
    pub fn resolves_names(self) -> bool {
        #[cfg(nginx1_27_3)]
        {
            // SAFETY: the lists are live (handle); `resolve` is set when nginx builds a list.
            let has = |l: Peers| unsafe { !(*l.raw()).resolve.is_null() };
            has(self) || self.backup().is_some_and(has)
        }
        #[cfg(not(nginx1_27_3))]
        false
    }

    /// Takes the list's read lock (nginx's `rwlock` of the list), released by the guard.
    pub fn read(self) -> ListRead {
        // SAFETY: the lock word lives in the list (handle), in the zone shared by the workers.
        unsafe { ngx_rwlock_rlock(ptr::addr_of_mut!((*self.raw()).rwlock)) };
        ListRead(self)
    }

    /// Takes the write locks of this (primary) list and of its backup list, in that order, each
    /// within `deadline` ([`wlock_until`]); None (nothing held) when one stays taken.
    pub fn write_both(self, deadline: Instant) -> Option<ListsWrite> {
        let wlock = |l: Peers| {
            // SAFETY: as in `read`.
            unsafe { wlock_until(ptr::addr_of_mut!((*l.raw()).rwlock), deadline) }
        };
        if !wlock(self) {
            return None;
        }
        // Read under the primary's write lock (see `backup`).
        let backup = self.backup();
        if let Some(b) = backup {
            if !wlock(b) {
                // SAFETY: taken just above by this process.
                unsafe { ngx_rwlock_unlock(ptr::addr_of_mut!((*self.raw()).rwlock)) };
                return None;
            }
        }
        Some(ListsWrite {
            primary: self,
            backup,
        })
    }
}

/// Reads of a peer (raw place reads: other workers' balancers write a peer under their list's
/// read lock, so these are snapshots). Sound for a [`Peer`] handle: it is used only while the
/// peer cannot be freed (see the module comment of `write.rs`), and `name`, `sockaddr` and `socklen`, the
/// id (`slow_start`) and the counters' address (`start_time`) are written only before the peer
/// is linked (by nginx or by [`SlabLocked::alloc_peer`]) or when the zone is made.
impl Peer {
    /// A copy of the peer's fields now (its pointers are the zone's; `peer.rs` reads the
    /// pointed-to bytes through [`Self::with_name`] and [`Self::with_sockaddr`]).
    #[inline]
    pub(in crate::ffi) fn fields(self) -> ngx_http_upstream_rr_peer_t {
        // SAFETY: p is live (handle; see the impl's doc); a by-value copy, no reference.
        unsafe { self.raw().read() }
    }

    /// Runs `f` on the peer's name as nginx wrote it (`name.len` bytes at `name.data`).
    pub(in crate::ffi) fn with_name<T>(self, f: impl FnOnce(&[u8]) -> T) -> T {
        // SAFETY: p is live; name.data holds name.len bytes in the zone, set once.
        f(unsafe { crate::ffi::bytes(&(*self.raw()).name) })
    }

    /// Runs `f` on the peer's socket address (`socklen` bytes at `sockaddr`; empty for none).
    pub(in crate::ffi) fn with_sockaddr<T>(self, f: impl FnOnce(&[u8]) -> T) -> T {
        let p = self.fields();
        if p.sockaddr.is_null() {
            return f(&[]);
        }
        // SAFETY: p is live; `sockaddr` is a socket address of `socklen` bytes, set once.
        f(unsafe { core::slice::from_raw_parts(p.sockaddr.cast::<u8>(), p.socklen as usize) })
    }

    /// The peer's statistics counters (`start_time` holds their address, see
    /// `ffi/counters.rs`); None for a peer without (the zone was too full to make them).
    #[inline]
    pub fn counters(self) -> Option<Counters> {
        // SAFETY: p is live; `start_time` is 0 or a slot of this zone, freed only with the peer.
        unsafe { Counters::from_ptr((*self.raw()).start_time as *mut _) }
    }

    /// `(fails, max_fails)` now (a snapshot), and whether `list` is `single`; while held.
    #[inline]
    pub fn passive(self, list: Peers) -> (u64, u64, bool) {
        // SAFETY: p and list are live (handles); plain words read in place (per request).
        unsafe {
            let p = self.raw();
            let single = (*list.raw()).single() != 0;
            ((*p).fails as u64, (*p).max_fails as u64, single)
        }
    }

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
}

/// A held read lock of one list.
pub struct ListRead(Peers);

/// The held read locks of a primary list and of the backup list it had when they were taken
/// (taken in that order, as the write locks are): the retired chain, which changes only under
/// both write locks, is stable while they are held.
pub struct ListsRead {
    _primary: ListRead,
    _backup: Option<ListRead>,
}

impl Peers {
    /// Takes the read locks of this (primary) list and of its backup list, in that order.
    pub fn read_both(self) -> ListsRead {
        let primary = self.read();
        // Read under the primary's lock (see `backup`).
        let backup = self.backup().map(Peers::read);
        ListsRead {
            _primary: primary,
            _backup: backup,
        }
    }
}

impl ListsRead {
    /// The retired peers of `chain` (these lists' upstream's), oldest first: name, connections
    /// and age at `now_ms` (`ngx_current_msec`).
    pub fn retired(&self, chain: RetiredChain, now_ms: u64) -> Vec<RetiredView> {
        let mut out = Vec::new();
        // SAFETY: the chain changes only under both write locks, excluded by these read locks;
        // every non-null link is a retired peer of this zone (live until freed under the write
        // locks); its `max_conns` holds its retirement time (see `write.rs`).
        unsafe {
            let mut p = (*chain.0.as_ptr()).0.load(Ordering::Relaxed);
            while let Some(peer) = NonNull::new(p).map(Peer) {
                let (address, st) = peer.name_and_state();
                let since = (*peer.raw()).max_conns as u64;
                out.push(RetiredView {
                    address,
                    active: st.conns,
                    age_ms: now_ms.saturating_sub(since),
                });
                p = (*peer.raw()).next;
            }
        }
        // The chain is newest first.
        out.reverse();
        out
    }
}

impl ListRead {
    /// The peers of the list, in order.
    pub fn peers(&self) -> Vec<Peer> {
        let mut v = Vec::new();
        // SAFETY: the list and its `next` chain of peers are stable under its lock (held); the
        // chain ends with null.
        let mut p = unsafe { (*self.0.raw()).peer };
        while let Some(peer) = NonNull::new(p) {
            v.push(Peer(peer));
            // SAFETY: as above; peer is a live member of the list.
            p = unsafe { (*peer.as_ptr()).next };
        }
        v
    }
}

impl ListRead {
    /// How many of `tried` (socket addresses as nginx keeps them: `sockaddr` bytes of
    /// `socklen`) are addresses of servers of the list that are not `down`; each entry counts.
    pub fn count_up<'a>(&self, tried: impl Iterator<Item = &'a [u8]> + Clone) -> usize {
        let mut n = 0;
        // SAFETY: the list and its chain of peers are stable under its lock (held); each
        // peer's `sockaddr` holds `socklen` bytes (set once, never changed).
        unsafe {
            let mut p = (*self.0.raw()).peer;
            while let Some(peer) = NonNull::new(p) {
                let q = peer.as_ptr();
                if (*q).down == 0 && !(*q).sockaddr.is_null() {
                    let sa = core::slice::from_raw_parts(
                        (*q).sockaddr.cast::<u8>(),
                        (*q).socklen as usize,
                    );
                    n += tried.clone().filter(|t| *t == sa).count();
                }
                p = (*q).next;
            }
        }
        n
    }

    /// The list's `tries` (its servers not marked `down`).
    pub fn tries(&self) -> usize {
        // SAFETY: the list is live and its lock held (guard).
        unsafe { (*self.0.raw()).tries }
    }
}

impl Drop for ListRead {
    fn drop(&mut self) {
        // SAFETY: taken in `Peers::read` by this process.
        unsafe { ngx_rwlock_unlock(ptr::addr_of_mut!((*self.0.raw()).rwlock)) };
    }
}

/// The write side's primitives: with both write locks held, every peer of these lists, of their
/// retired chain and every peer this process allocated and has not linked yet is this process's
/// alone (a balancer of any worker reads or writes a peer only inside its list's read lock, and
/// every other writer holds these write locks), so a `&mut` to it is sound for the duration of
/// a call. The lists themselves are written as raw places: other workers spin on their lock
/// words meanwhile. The methods of `write.rs` and `counters.rs` are safe code on these.
#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl ListsWrite {
    /// Runs `f` on peer `p` (of these lists, of their retired chain, or allocated and not yet
    /// linked), which calls no nginx code.
    pub(in crate::ffi) fn peer_mut<T>(
        &self,
        p: Peer,
        f: impl FnOnce(&mut ngx_http_upstream_rr_peer_t) -> T,
    ) -> T {
        // SAFETY: p is live (handle); both write locks are held (guard), so nothing else reads
        // or writes the peer while `f` runs (see the impl's doc).
        f(unsafe { &mut *p.raw() })
    }

    /// The peers of `list` (the primary or its backup list), in order.
    pub(in crate::ffi) fn members(&self, list: Peers) -> impl Iterator<Item = Peer> + '_ {
        // SAFETY: the list is live (handle) and its write lock held (guard; or the gate's write
        // side for a backup list made after it was taken).
        let first = NonNull::new(unsafe { (*list.raw()).peer }).map(Peer);
        core::iter::successors(first, move |p| self.next(*p))
    }

    /// Links `b` as the primary list's backup list (a list made while these locks are held is not
    /// locked by them: the caller keeps every selection out by holding the gate's write side).
    pub fn set_backup(&self, b: Peers) {
        // SAFETY: the primary's write lock is held (guard).
        unsafe { (*self.primary.raw()).next = b.raw() };
    }

    /// Sets `list`'s first peer and its totals, as `ngx_http_upstream_init_round_robin`
    /// computes them.
    pub(in crate::ffi) fn set_head(&self, list: Peers, first: Option<Peer>, t: ListTotals) {
        // SAFETY: the list's write lock is held (guard; or the gate's write side for a backup
        // list made after it was taken), so no selection reads these fields meanwhile.
        unsafe {
            let l = list.raw();
            (*l).peer = first.map_or(ptr::null_mut(), Peer::raw);
            (*l).number = t.number;
            (*l).total_weight = t.total_weight as usize;
            (*l).tries = t.tries;
            (*l).set_single(u32::from(t.single));
            (*l).set_weighted(u32::from(t.weighted));
        }
    }

    /// The newest peer of the retired chain `chain` (these lists' upstream's).
    pub(in crate::ffi) fn retired_head(&self, chain: RetiredChain) -> Option<Peer> {
        // SAFETY: the chain's head lives in the zone (handle) and changes only with these locks
        // held.
        NonNull::new(unsafe { chain.0.as_ref() }.0.load(Ordering::Relaxed)).map(Peer)
    }

    /// Makes `p` the newest peer of the retired chain `chain` (its `next` link is the caller's).
    pub(in crate::ffi) fn set_retired_head(&self, chain: RetiredChain, p: Option<Peer>) {
        let head = p.map_or(ptr::null_mut(), Peer::raw);
        // SAFETY: as in `retired_head`.
        unsafe { chain.0.as_ref() }.0.store(head, Ordering::Relaxed);
    }

    /// Marks every peer of `list` unlinked (see [`Self::is_unlinked`]); the list is empty
    /// until it is linked again.
    pub(in crate::ffi) fn mark_unlinked(&self, list: Peers) {
        // SAFETY: the list is live (handle) and its write lock held (guard; or the gate's write
        // side for a backup list made after it was taken).
        let mut cur = NonNull::new(unsafe { (*list.raw()).peer }).map(Peer);
        while let Some(p) = cur {
            cur = self.next(p);
            self.peer_mut(p, |q| q.next = p.raw());
        }
        self.set_head(list, None, ListTotals::default());
    }

    /// Frees `p` and its slab allocations when it is marked unlinked (in no list and no chain,
    /// see [`Self::is_unlinked`]) and not in use ([`Peer::in_use`]); whether it did. The caller
    /// uses no copy of the handle afterwards (the rule of every handle here: used only while it
    /// cannot be freed).
    pub fn free_unlinked(&self, m: &SlabLocked, p: Peer) -> bool {
        if !self.is_unlinked(p) || p.in_use() {
            return false;
        }
        // SAFETY: in no list and no chain (mark), not in use, both write locks held, so no
        // balancer's `free` is inside its locked section and no request refers to the peer any
        // more (the balancer wrapper copied the peer's name and address into the request).
        unsafe { m.free_peer(p) };
        true
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
