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
//! A peer's `down` holds the reasons it is skipped as bits (`upstrand_core::live::down`): every
//! stock balancer reads it only as "not 0"; `GET` reports the configured bit as `down`, and a
//! `PUT` replaces only the bits it sets, so run-time states survive it.
//!
//! A peer's `slow_start` holds its id (`Peer::id`, the NGINX Plus API's per-peer `id`): a field
//! only NGINX Plus uses (open-source nginx from 1.22 to 1.30 declares it and never reads or
//! writes it; the zone module's copy of a configured peer copies its 0). Ids are given by
//! [`ListsWrite::assign_ids`] when the zone is made and by [`SlabLocked::alloc_peer`] for a
//! peer a `PUT` adds, from the upstream's counter in the zone (`Shared::next_id`), so the
//! upstream never gives an id twice (until a reload makes a new zone).
//!
//! A peer's `start_time` (also NGINX Plus's alone) holds the address of its statistics
//! counters in the zone (`ffi/counters.rs`), made and freed with the peer.
//!
//! A retired peer's `max_conns` holds the time it was retired (`ngx_current_msec`, a monotonic
//! clock shared by the workers): only a selection reads `max_conns`, and a retired peer is in no
//! list, so nothing selects it again ([`ListsWrite::retire`], [`ListsRead::retired`]).
//!
//! nginx 1.27.3+ (cfg `nginx1_27_3`): the zone module resolves `server NAME resolve` names
//! itself and rewrites the lists from a timer in every worker (`peers->resolve` holds those
//! servers, `peer->host`, `peers->config`), without the live API's gate. An upstream whose
//! configured lists have a `resolve` server is therefore never made live ([`resolves_names`] at
//! configuration time: no wrappers, no zone state, `PUT` answered 409). Peers also carry `refs`
//! (taken by every balancer's `get` with `conns`, dropped by its `free`; nginx frees a `zombie`
//! peer when its last reference goes): a peer is freed by the API only when both `conns` and
//! `refs` are 0 ([`in_use`]). Lists the API creates (the backup list) leave `config` and
//! `resolve` null, which nginx's round robin treats as "no resolver".
//!
//! Other nginx structures the live API reads or writes (stable from 1.22 to 1.30): the slab pool
//! (`mutex`, `min_shift`, `stats`, `pfree`, `start`, `end`, `log_nomem`: [`Slab`] here), the peer
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
//! for retired peers, under [`ListsWrite`]. [`SlabLocked::free_peer`] is the one method here that
//! stays `unsafe`: only its caller knows that nobody uses the peer any more.
//!
//! Write locks: nginx's rwlocks have no owner and no recovery (a worker that dies holding one
//! leaves it held), so the API never takes a write side with `ngx_rwlock_wlock`, which spins
//! forever: [`wlock_until`] spins and yields on the same lock word until a deadline and reports
//! failure (the `PUT` then answers 503 and changes nothing, a sweep of retired peers waits for
//! the next chance). Read sides are taken with nginx's own `ngx_rwlock_rlock`, which the lock
//! word format therefore stays compatible with.
//!
//! Panic-free write sections: a write side held when the process aborts (the release profile
//! has `panic = "abort"`) would never be released, stopping every worker's selections for
//! good. So the code that runs with a write side held — [`ListsWrite`]'s and [`SlabLocked`]'s
//! methods here, and `LiveUpstream::swap`/`sweep` in `live/zone.rs` — allocates nothing (no `Vec`,
//! `String`, `format!`: buffers and names are prepared before the locks are taken), indexes
//! nothing, unwraps nothing and does no overflow-checked arithmetic. `clippy` checks the last
//! three (`#[deny(...)]` on those items: `indexing_slicing`, `unwrap_used`, `expect_used`,
//! `panic`, `arithmetic_side_effects`, ...); allocation is a review item of the same list.
//!
//! Memory: every peer of a zone is a slab allocation with its `sockaddr` (size of
//! `ngx_sockaddr_t`), `name.data` (`NGX_SOCKADDR_STRLEN` bytes), `server.data` and, once an SSL
//! session was saved, `ssl_session` (and in nginx builds with sticky sessions, 1.29.6+ by
//! default, cfg `ngx_upstream_sid`: a `sid` buffer of 32 bytes) as separate slab allocations — the layout
//! `ngx_http_upstream_zone_module` gives the peers it copies, so one [`SlabLocked::free_peer`]
//! frees both kinds — and the module's own statistics slot (`start_time`, 120 bytes), given to
//! the copied peers when the zone is made ([`ListsWrite::attach_counters`]).

use core::mem::size_of;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ngx::ffi::{
    ngx_atomic_t, ngx_http_upstream_rr_peer_t, ngx_http_upstream_rr_peers_t, ngx_pagesize,
    ngx_pagesize_shift, ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_shmtx_lock, ngx_shmtx_unlock,
    ngx_slab_calloc, ngx_slab_calloc_locked, ngx_slab_free_locked, ngx_slab_page_t,
    ngx_slab_pool_t, ngx_slab_stat_t, ngx_sockaddr_t, sockaddr_in, sockaddr_in6, sockaddr_un,
};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use upstrand_core::live::plan::ListTotals;
use upstrand_core::live::render::{RetiredView, SlabView};
use upstrand_core::live::sizing::{PeerLayout, SlabShape};
use upstrand_core::live::{down, Addr, Current, Server};

use super::counters::SLOT_BYTES;

/// `AF_INET`, `AF_INET6`, `AF_UNIX` as the socket structures store them.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const AF_UNIX: u16 = 1;

/// nginx's `NGX_SOCKADDR_STRLEN` with unix sockets (a macro, not in the bindings):
/// `sizeof("unix:") - 1` + `NGX_UNIX_ADDRSTRLEN` (108 on Linux).
const NGX_SOCKADDR_STRLEN: usize = 5 + 108;

/// nginx's `NGX_HTTP_UPSTREAM_SID_LEN` (an md5 in hex; a macro, not in the bindings).
#[cfg(ngx_upstream_sid)]
const NGX_HTTP_UPSTREAM_SID_LEN: usize = 32;

/// nginx's `NGX_RWLOCK_WLOCK`: the lock word of a write-held `ngx_rwlock` (0: free; otherwise
/// the number of readers).
const RWLOCK_WLOCK: u64 = u64::MAX;

/// Takes the write side of the nginx rwlock at `lock` like `ngx_rwlock_wlock` (the same lock
/// word transitions: 0 → `NGX_RWLOCK_WLOCK` by compare-and-swap, spinning with the CPU's pause
/// hint in rounds of growing length, yielding the CPU between rounds), but gives up once
/// `deadline` has passed (after at least one round): false, nothing held. Released with
/// nginx's `ngx_rwlock_unlock`.
///
/// # Safety
/// `lock` is an `ngx_rwlock` word in memory shared by the workers, live for the call.
#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
pub unsafe fn wlock_until(lock: *mut ngx_atomic_t, deadline: Instant) -> bool {
    // SAFETY: caller; the word is only ever used atomically (nginx's functions use the CPU's
    // atomic instructions on it, as `AtomicU64` does) and is suitably aligned (ngx_atomic_t).
    let word = unsafe { AtomicU64::from_ptr(lock) };
    let try_take = || {
        word.load(Ordering::Relaxed) == 0
            && word
                .compare_exchange(0, RWLOCK_WLOCK, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    };
    loop {
        // nginx's NGX_RWLOCK_SPIN rounds: 1, 2, 4, ... 1024 pauses between attempts.
        let mut n: u32 = 1;
        while n < 2048 {
            if try_take() {
                return true;
            }
            for _ in 0..n {
                core::hint::spin_loop();
            }
            n = n.wrapping_shl(1);
        }
        if try_take() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
}

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

    pub(super) fn raw(self) -> *mut ngx_http_upstream_rr_peers_t {
        self.0.as_ptr()
    }

    /// The zone's slab pool (None for a list outside any zone: before the zone is made).
    pub fn slab(self) -> Option<Slab> {
        // SAFETY: the list is live (handle); `shpool` is set once by the zone module.
        NonNull::new(unsafe { (*self.raw()).shpool }).map(Slab)
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
        // locks); its `max_conns` holds its retirement time (see the module comment).
        unsafe {
            let mut p = (*chain.0.as_ptr()).0;
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

/// The held write locks of a primary list and of the backup list it had when they were taken.
/// Its methods run with the write locks held: panic-free (see the module comment).
pub struct ListsWrite {
    pub(super) primary: Peers,
    pub(super) backup: Option<Peers>,
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
pub struct Retired(*mut ngx_http_upstream_rr_peer_t);

/// A handle on the [`Retired`] head in an upstream's live state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RetiredChain(NonNull<Retired>);

impl RetiredChain {
    /// The handle of the head at `head`, a field of a live state block in a zone (never
    /// dereferenced here: only [`ListsWrite`]'s methods use it, with the locks held).
    pub fn new(head: NonNull<Retired>) -> RetiredChain {
        RetiredChain(head)
    }
}

/// One peer (`ngx_http_upstream_rr_peer_t`) of a zone: a member of a list or a retired peer.
/// Made only from a list under its lock or by [`SlabLocked::alloc_peer`]; used only while it
/// cannot be freed (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Peer(pub(super) NonNull<ngx_http_upstream_rr_peer_t>);

/// Run-time figures of one peer.
pub struct PeerState {
    /// `conns`
    pub conns: u64,
    /// `fails`
    pub fails: u64,
}

impl Peer {
    pub(super) fn raw(self) -> *mut ngx_http_upstream_rr_peer_t {
        self.0.as_ptr()
    }

    /// The peer's address; `None` for an address family the API cannot express.
    fn addr(self) -> Option<Addr> {
        // SAFETY: p is live (handle); its `sockaddr` is null or a socket address of `socklen`
        // bytes written by nginx or by `SlabLocked::alloc_peer` (set once, never changed).
        let (sa, len) = unsafe { ((*self.raw()).sockaddr, (*self.raw()).socklen) };
        if sa.is_null() {
            return None;
        }
        // SAFETY: as above; the family field comes first in every variant, and each variant is
        // read only when `len` covers it (a unix address up to `len`).
        unsafe {
            match (*sa).sa_family {
                AF_INET if len as usize >= size_of::<sockaddr_in>() => {
                    let s = &*(sa as *const sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
                    Some(Addr::Inet(SocketAddr::V4(SocketAddrV4::new(
                        ip,
                        u16::from_be(s.sin_port),
                    ))))
                }
                AF_INET6 if len as usize >= size_of::<sockaddr_in6>() => {
                    let s = &*(sa as *const sockaddr_in6);
                    let ip = Ipv6Addr::from(s.sin6_addr.__in6_u.__u6_addr8);
                    Some(Addr::Inet(SocketAddr::V6(SocketAddrV6::new(
                        ip,
                        u16::from_be(s.sin6_port),
                        0,
                        s.sin6_scope_id,
                    ))))
                }
                AF_UNIX => {
                    let path = ptr::addr_of!((*(sa as *const sockaddr_un)).sun_path).cast::<u8>();
                    let max = (len as usize).saturating_sub(2).min(108);
                    let raw: Vec<u8> = core::slice::from_raw_parts(path, max)
                        .iter()
                        .copied()
                        .take_while(|c| *c != 0)
                        .collect();
                    Some(Addr::Unix(String::from_utf8_lossy(&raw).into_owned()))
                }
                _ => None,
            }
        }
    }

    /// The peer's settings as the pure crate sees them; `None` for an address family the API
    /// cannot express. Read under its list's lock or the gate.
    pub fn current(self, backup: bool) -> Option<Current> {
        // SAFETY: p is live (handle); the settings change only under the list's write lock.
        unsafe {
            let p = self.raw();
            Some(Current {
                addr: self.addr()?,
                weight: u32::try_from((*p).weight).unwrap_or(u32::MAX),
                max_fails: u32::try_from((*p).max_fails).unwrap_or(u32::MAX),
                fail_timeout_s: u32::try_from((*p).fail_timeout).unwrap_or(u32::MAX),
                max_conns: u32::try_from((*p).max_conns).unwrap_or(u32::MAX),
                backup,
                down: (*p).down & down::CONFIGURED != 0,
                drain: (*p).down & down::DRAIN != 0,
            })
        }
    }

    /// The peer's name (as nginx wrote it) and its run-time figures (read under its list's read
    /// lock, as nginx's balancers update them under theirs or the peer's lock: a snapshot).
    pub fn name_and_state(self) -> (String, PeerState) {
        // SAFETY: p is live (handle); name.data holds name.len bytes in the zone.
        unsafe {
            let p = self.raw();
            let name = crate::ffi::bytes(&(*p).name);
            (
                String::from_utf8_lossy(name).into_owned(),
                PeerState {
                    conns: (*p).conns as u64,
                    fails: (*p).fails as u64,
                },
            )
        }
    }

    /// What a probe of this peer needs: its name, its socket address (the `sockaddr` bytes) and
    /// its `down` bits. Read under its list's lock.
    pub fn probe_target(self) -> (String, Vec<u8>, usize) {
        // SAFETY: p is live (handle); `sockaddr` is null or `socklen` bytes (set once).
        unsafe {
            let p = self.raw();
            let sa = if (*p).sockaddr.is_null() {
                Vec::new()
            } else {
                core::slice::from_raw_parts((*p).sockaddr.cast::<u8>(), (*p).socklen as usize)
                    .to_vec()
            };
            let name = String::from_utf8_lossy(crate::ffi::bytes(&(*p).name)).into_owned();
            (name, sa, (*p).down)
        }
    }

    /// The size of the TLS session nginx stored in the zone for this peer (0: none). Read under
    /// its list's lock (nginx writes it under the peer's lock; a snapshot).
    pub fn ssl_session_len(self) -> u64 {
        // SAFETY: p is live (handle).
        unsafe {
            if (*self.raw()).ssl_session.is_null() {
                0
            } else {
                u64::try_from((*self.raw()).ssl_session_len).unwrap_or(0)
            }
        }
    }

    /// True while a request holds the peer: connections in use (`conns`), and from nginx 1.27.3
    /// the peer's references (`refs`). Read under both list write locks, so no balancer is
    /// between taking and dropping them.
    pub fn in_use(self) -> bool {
        // SAFETY: p is live (handle).
        unsafe {
            #[cfg(nginx1_27_3)]
            if (*self.raw()).refs > 0 {
                return true;
            }
            (*self.raw()).conns > 0
        }
    }
}

/// The `down` bits a `PUT` (or a new peer) sets from the server's fields
/// ([`down::SET_BY_PUT`]).
fn put_down_bits(s: &Server) -> usize {
    let mut bits = 0;
    if s.down {
        bits |= down::CONFIGURED;
    }
    if s.drain {
        bits |= down::DRAIN;
    }
    bits
}

/// The slab pool of a zone.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slab(NonNull<ngx_slab_pool_t>);

impl Slab {
    /// # Safety
    /// `p` is null or the slab pool at the start of a live shared-memory zone (`shm.addr`),
    /// alive as long as the handle is used (the configuration's cycle).
    pub unsafe fn from_ptr(p: *mut ngx_slab_pool_t) -> Option<Slab> {
        NonNull::new(p).map(Slab)
    }

    pub(super) fn raw(self) -> *mut ngx_slab_pool_t {
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
        let _m = self.lock();
        // SAFETY: the pool is live and locked; `stats` has one entry per size class,
        // `ngx_pagesize_shift - min_shift` of them (as ngx_slab_init makes it).
        unsafe {
            let pool = self.raw();
            let classes = ngx_pagesize_shift.saturating_sub((*pool).min_shift);
            let stats =
                core::slice::from_raw_parts((*pool).stats as *const ngx_slab_stat_t, classes);
            let page = ngx_pagesize as u64;
            let total = ((*pool).end as usize - (*pool).start as usize) as u64 / page.max(1);
            SlabView {
                zone: zone.to_string(),
                // The pool is at the start of the zone, `end` at its end.
                zone_bytes: ((*pool).end as usize).saturating_sub(pool as usize) as u64,
                page_size: page,
                pages_total: total,
                pages_free: (*pool).pfree as u64,
                chunks_used: stats.iter().map(|x| x.used as u64).sum(),
                alloc_failures: stats.iter().map(|x| x.fails as u64).sum(),
            }
        }
    }
}

/// A held slab mutex.
pub struct SlabLocked(pub(super) Slab);

#[deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects
)]
impl SlabLocked {
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

    /// Frees a peer and the slab allocations it owns.
    ///
    /// # Safety
    /// `p` belongs to this zone and nobody uses it any more: it is in no list, not in use
    /// ([`Peer::in_use`] false), the write locks of every list it was in are held by this
    /// process, and the caller drops every copy of the handle.
    pub unsafe fn free_peer(&self, p: Peer) {
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
