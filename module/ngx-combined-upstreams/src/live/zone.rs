//! The live state of one upstream in its zone ([`Shared`]) and the operations on it: reading
//! the set, applying a `PUT`, retiring busy peers and freeing them when idle, slab figures.
//!
//! Locks (all in the zone, so they work across workers):
//! - `Shared::gate` (an `ngx_rwlock`): read-held by every peer selection (the balancer wrapper
//!   in `balancer.rs`) and by `GET`; write-held by a `PUT`. While a `PUT` holds it no worker is
//!   between reading the generation and selecting a peer, so a selection never sees a set that
//!   its per-request `tried` bitmap was not sized for.
//! - the lists' own rwlocks (`ngx_http_upstream_rr_peers_t.rwlock`, primary then backup), which
//!   nginx's balancers take: write-held while lists change and while retired peers are freed.
//! - the slab mutex, taken last.
//!
//! Order: gate → primary list → backup list → slab mutex. nginx's balancers never hold both
//! lists at once, and take the slab mutex only inside a list lock.

use core::mem::size_of;
use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};

use ngx::ffi::{
    ngx_atomic_t, ngx_http_upstream_rr_peer_t, ngx_http_upstream_rr_peers_t, ngx_pagesize,
    ngx_pagesize_shift, ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_rwlock_wlock, ngx_shmtx_lock,
    ngx_shmtx_unlock, ngx_slab_calloc, ngx_slab_pool_t, ngx_slab_stat_t,
};
use upstrand_core::live::plan::totals;
use upstrand_core::live::render::{PutView, ServerView, SlabView, UpstreamView};
use upstrand_core::live::{plan, ApiError, PutRequest};

use super::peers;

/// Per-upstream live state, allocated in the upstream's zone when the zone is created.
#[repr(C)]
pub struct Shared {
    /// See the module comment.
    gate: ngx_atomic_t,
    /// Changes with every applied change; starts at the zone's creation time in milliseconds so
    /// a zone made by a reload never repeats an earlier generation.
    generation: AtomicU64,
    /// Retired peers (out of every list, connections still open), chained through `next`.
    /// Changed only with both list write locks held.
    retired: *mut ngx_http_upstream_rr_peer_t,
    /// Number of peers in `retired` (read without lock as a hint).
    retiring: AtomicU64,
    /// Selections that found the set changed since their request's balancer data was made and
    /// made it again (see `balancer.rs`).
    rebalanced: AtomicU64,
}

/// Allocates the state in the zone.
///
/// # Safety
/// `pool` is the zone's slab pool (called while nginx creates the zone).
pub unsafe fn create(pool: *mut ngx_slab_pool_t, now_ms: u64) -> *mut Shared {
    // SAFETY: ngx_slab_calloc takes the pool's mutex and returns zeroed memory or null; zeroed
    // memory is a valid Shared (lock free, no retired peers).
    unsafe {
        let s = ngx_slab_calloc(pool, size_of::<Shared>()).cast::<Shared>();
        if !s.is_null() {
            (*s).generation.store(now_ms.max(1), Ordering::SeqCst);
        }
        s
    }
}

/// A held read side of the gate, released on drop.
pub struct GateRead(*mut Shared);

impl GateRead {
    /// Takes the gate for reading.
    ///
    /// # Safety
    /// `s` is a live [`Shared`].
    pub unsafe fn take(s: *mut Shared) -> GateRead {
        // SAFETY: caller; the lock word lives in the zone.
        unsafe { ngx_rwlock_rlock(ptr::addr_of_mut!((*s).gate)) };
        GateRead(s)
    }
}

impl Drop for GateRead {
    fn drop(&mut self) {
        // SAFETY: taken in `take` by this process.
        unsafe { ngx_rwlock_unlock(ptr::addr_of_mut!((*self.0).gate)) };
    }
}

struct GateWrite(*mut Shared);

impl GateWrite {
    unsafe fn take(s: *mut Shared) -> GateWrite {
        // SAFETY: caller.
        unsafe { ngx_rwlock_wlock(ptr::addr_of_mut!((*s).gate)) };
        GateWrite(s)
    }
}

impl Drop for GateWrite {
    fn drop(&mut self) {
        // SAFETY: taken in `take` by this process.
        unsafe { ngx_rwlock_unlock(ptr::addr_of_mut!((*self.0).gate)) };
    }
}

/// Both list write locks (primary, then backup when there is one), released on drop.
struct ListsWrite(
    *mut ngx_http_upstream_rr_peers_t,
    *mut ngx_http_upstream_rr_peers_t,
);

impl ListsWrite {
    unsafe fn take(primary: *mut ngx_http_upstream_rr_peers_t) -> ListsWrite {
        // SAFETY: caller passes a zone list; its backup (if any) is a zone list too.
        unsafe {
            peers::wlock(primary);
            let b = peers::backup(primary);
            if !b.is_null() {
                peers::wlock(b);
            }
            ListsWrite(primary, b)
        }
    }
}

impl Drop for ListsWrite {
    fn drop(&mut self) {
        // SAFETY: both taken in `take` by this process (backup first released).
        unsafe {
            if !self.1.is_null() {
                peers::unlock(self.1);
            }
            peers::unlock(self.0);
        }
    }
}

struct SlabLock(*mut ngx_slab_pool_t);

impl SlabLock {
    unsafe fn take(pool: *mut ngx_slab_pool_t) -> SlabLock {
        // SAFETY: caller passes a live slab pool.
        unsafe { ngx_shmtx_lock(ptr::addr_of_mut!((*pool).mutex)) };
        SlabLock(pool)
    }
}

impl Drop for SlabLock {
    fn drop(&mut self) {
        // SAFETY: taken in `take` by this process.
        unsafe { ngx_shmtx_unlock(ptr::addr_of_mut!((*self.0).mutex)) };
    }
}

/// The current generation.
///
/// # Safety
/// `s` is a live [`Shared`].
pub unsafe fn generation(s: *mut Shared) -> u64 {
    // SAFETY: caller.
    unsafe { (*s).generation.load(Ordering::SeqCst) }
}

/// Counts one request whose balancer data was made again after a change.
///
/// # Safety
/// `s` is a live [`Shared`].
pub unsafe fn count_rebalanced(s: *mut Shared) {
    // SAFETY: caller.
    unsafe { (*s).rebalanced.fetch_add(1, Ordering::Relaxed) };
}

/// Whether retired peers wait to be freed (a hint read without lock).
///
/// # Safety
/// `s` is a live [`Shared`].
pub unsafe fn has_retiring(s: *mut Shared) -> bool {
    // SAFETY: caller.
    unsafe { (*s).retiring.load(Ordering::Relaxed) > 0 }
}

/// `GET <loc>/NAME`.
///
/// # Safety
/// `s` and `primary` belong to the same upstream's zone.
pub unsafe fn view(s: *mut Shared, primary: *mut ngx_http_upstream_rr_peers_t) -> UpstreamView {
    // SAFETY: caller; the gate keeps the lists and the generation still while they are read,
    // the list locks keep the per-peer figures consistent.
    unsafe {
        sweep(s, primary);
        let _g = GateRead::take(s);
        let mut servers = Vec::new();
        for (list, backup) in [(primary, false), (peers::backup(primary), true)] {
            if list.is_null() {
                continue;
            }
            peers::rlock(list);
            for p in peers::list(list) {
                let (name, st) = peers::name_and_state(p);
                let c = peers::current(p, backup);
                servers.push(ServerView {
                    address: name,
                    weight: c.as_ref().map_or(0, |c| u64::from(c.weight)),
                    max_fails: c.as_ref().map_or(0, |c| u64::from(c.max_fails)),
                    fail_timeout_ms: c.as_ref().map_or(0, |c| u64::from(c.fail_timeout_s) * 1000),
                    backup,
                    down: c.as_ref().is_some_and(|c| c.down),
                    active: st.conns,
                    fails: st.fails,
                });
            }
            peers::unlock(list);
        }
        UpstreamView {
            generation: generation(s),
            servers,
            retiring: (*s).retiring.load(Ordering::SeqCst),
            rebalanced: (*s).rebalanced.load(Ordering::Relaxed),
        }
    }
}

/// Applies a `PUT` (see `docs/live-api.md` for the semantics).
///
/// # Safety
/// `s` and `primary` belong to the same upstream's zone; `zone` and `name` name them.
pub unsafe fn apply(
    s: *mut Shared,
    primary: *mut ngx_http_upstream_rr_peers_t,
    name: &str,
    zone: &str,
    req: &PutRequest,
) -> Result<PutView, ApiError> {
    // SAFETY: caller; see the lock order in the module comment. Lists and the generation change
    // only under the gate's write side, which this function holds throughout.
    unsafe {
        let _g = GateWrite::take(s);
        let pool = peers::shpool(primary);
        let now = generation(s);
        if let Some(want) = req.generation {
            if want != now {
                return Err(ApiError::generation_conflict(want, now));
            }
        }
        // The current set, primary first (its order is the plan's current index order).
        let mut cur_peers = Vec::new();
        let mut current = Vec::new();
        for (list, backup) in [(primary, false), (peers::backup(primary), true)] {
            if list.is_null() {
                continue;
            }
            peers::rlock(list);
            for p in peers::list(list) {
                match peers::current(p, backup) {
                    Some(c) => {
                        cur_peers.push(p);
                        current.push(c);
                    }
                    None => {
                        peers::unlock(list);
                        return Err(ApiError::new(
                            409,
                            format!("upstream \"{name}\" has a server with an address family the API cannot handle"),
                        ));
                    }
                }
            }
            peers::unlock(list);
        }
        let p = plan(&current, &req.servers);
        if p.unchanged {
            return Ok(PutView {
                generation: now,
                changed: false,
                added: 0,
                removed: 0,
                retiring: (*s).retiring.load(Ordering::SeqCst),
            });
        }

        // Allocate everything new first: a full zone changes nothing.
        let need_backup_list =
            req.servers.iter().any(|x| x.backup) && peers::backup(primary).is_null();
        let mut fresh: Vec<Option<*mut ngx_http_upstream_rr_peer_t>> =
            vec![None; req.servers.len()];
        let mut new_backup = ptr::null_mut();
        {
            let _m = SlabLock::take(pool);
            // A full zone is answered with 507; nginx's "[crit] ngx_slab_alloc() failed: no
            // memory" line for it would only repeat that, so it is off while these allocate.
            let log_nomem = (*pool).log_nomem();
            (*pool).set_log_nomem(0);
            let mut failed = false;
            for &j in &p.add {
                match peers::alloc_peer_locked(pool, &req.servers[j]) {
                    Some(np) => fresh[j] = Some(np),
                    None => {
                        failed = true;
                        break;
                    }
                }
            }
            if !failed && need_backup_list {
                match peers::alloc_list_locked(pool, primary) {
                    Some(b) => new_backup = b,
                    None => failed = true,
                }
            }
            (*pool).set_log_nomem(log_nomem);
            if failed {
                for np in fresh.iter().flatten() {
                    peers::free_peer_locked(pool, *np);
                }
                return Err(ApiError::zone_full(name, zone));
            }
        }

        // Swap under the list write locks.
        let lists = ListsWrite::take(primary);
        if !new_backup.is_null() {
            peers::set_backup(primary, new_backup);
        }
        let mut member: Vec<*mut ngx_http_upstream_rr_peer_t> =
            vec![ptr::null_mut(); req.servers.len()];
        for &(i, j) in &p.keep {
            peers::set_settings(cur_peers[i], &req.servers[j]);
            member[j] = cur_peers[i];
        }
        for (j, np) in fresh.iter().enumerate() {
            if let Some(np) = np {
                member[j] = *np;
            }
        }
        let primary_members: Vec<_> = req
            .servers
            .iter()
            .zip(&member)
            .filter(|(x, _)| !x.backup)
            .map(|(_, m)| *m)
            .collect();
        let backup_members: Vec<_> = req
            .servers
            .iter()
            .zip(&member)
            .filter(|(x, _)| x.backup)
            .map(|(_, m)| *m)
            .collect();
        peers::set_list(primary, &primary_members, totals(&req.servers, false));
        let b = peers::backup(primary);
        if !b.is_null() {
            // A backup list made by this process after ListsWrite was taken is not locked by it,
            // but nobody can use it before the generation changes below, and the gate keeps
            // every selection out until then.
            peers::set_list(b, &backup_members, totals(&req.servers, true));
        }
        let mut retired = 0u64;
        {
            let _m = SlabLock::take(pool);
            for &i in &p.remove {
                let old = cur_peers[i];
                if !peers::in_use(old) {
                    peers::free_peer_locked(pool, old);
                } else {
                    peers::set_next(old, (*s).retired);
                    (*s).retired = old;
                    retired += 1;
                }
            }
        }
        let retiring = (*s).retiring.fetch_add(retired, Ordering::SeqCst) + retired;
        let g = (*s).generation.fetch_add(1, Ordering::SeqCst) + 1;
        drop(lists);
        Ok(PutView {
            generation: g,
            changed: true,
            added: p.add.len() as u64,
            removed: p.remove.len() as u64,
            retiring,
        })
    }
}

/// Frees retired peers whose last connection ended.
///
/// # Safety
/// `s` and `primary` belong to the same upstream's zone.
pub unsafe fn sweep(s: *mut Shared, primary: *mut ngx_http_upstream_rr_peers_t) {
    // SAFETY: caller. With both list write locks held no `free` of a balancer is inside its
    // locked section, so a peer whose `conns` is 0 is referenced by no request any more (the
    // balancer wrapper copied the peer's name and address into the request).
    unsafe {
        if !has_retiring(s) {
            return;
        }
        let _lists = ListsWrite::take(primary);
        let pool = peers::shpool(primary);
        let _m = SlabLock::take(pool);
        let mut link: *mut *mut ngx_http_upstream_rr_peer_t = ptr::addr_of_mut!((*s).retired);
        let mut freed = 0;
        while !(*link).is_null() {
            let p = *link;
            if !peers::in_use(p) {
                *link = peers::next(p);
                peers::free_peer_locked(pool, p);
                freed += 1;
            } else {
                link = ptr::addr_of_mut!((*p).next);
            }
        }
        (*s).retiring.fetch_sub(freed, Ordering::SeqCst);
    }
}

/// The zone's slab figures.
///
/// # Safety
/// `pool` is a live slab pool.
pub unsafe fn slab(pool: *mut ngx_slab_pool_t, zone: &str) -> SlabView {
    // SAFETY: caller; the figures are read under the pool's mutex; `stats` has one entry per
    // size class, `ngx_pagesize_shift - min_shift` of them (as ngx_slab_init makes it).
    unsafe {
        let _m = SlabLock::take(pool);
        let classes = ngx_pagesize_shift.saturating_sub((*pool).min_shift);
        let stats = core::slice::from_raw_parts((*pool).stats as *const ngx_slab_stat_t, classes);
        let page = ngx_pagesize as u64;
        let total = ((*pool).end as usize - (*pool).start as usize) as u64 / page.max(1);
        SlabView {
            zone: zone.to_string(),
            page_size: page,
            pages_total: total,
            pages_free: (*pool).pfree as u64,
            chunks_used: stats.iter().map(|x| x.used as u64).sum(),
            alloc_failures: stats.iter().map(|x| x.fails as u64).sum(),
        }
    }
}
