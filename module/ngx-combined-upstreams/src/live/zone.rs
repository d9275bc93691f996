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
//!
//! The fence: [`LiveState`] is a handle on the [`Shared`] block (made by [`LiveState::create`]
//! in the zone); [`LiveUpstream`] pairs it with the upstream's primary list (`unsafe`
//! constructor: they must be the same upstream's). Their methods are safe; the guards
//! ([`GateRead`], `GateWrite`, and `peers`' list and slab guards) release what they hold on drop.

use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};

use ngx::ffi::{ngx_atomic_t, ngx_rwlock_rlock, ngx_rwlock_unlock, ngx_rwlock_wlock};
use upstrand_core::live::plan::totals;
use upstrand_core::live::render::{PutView, ServerView, SlabView, UpstreamView};
use upstrand_core::live::{plan, ApiError, PutRequest};

use super::peers::{Peer, Peers, Retired, RetiredChain, Slab};

/// Per-upstream live state, allocated in the upstream's zone when the zone is created.
#[repr(C)]
pub struct Shared {
    /// See the module comment.
    gate: ngx_atomic_t,
    /// Changes with every applied change; starts at the zone's creation time in milliseconds so
    /// a zone made by a reload never repeats an earlier generation.
    generation: AtomicU64,
    /// Retired peers (out of every list, connections still open). Used only with both list
    /// write locks held.
    retired: Retired,
    /// Number of peers in `retired` (read without lock as a hint).
    retiring: AtomicU64,
    /// Selections that found the set changed since their request's balancer data was made and
    /// made it again (see `balancer.rs`).
    rebalanced: AtomicU64,
}

/// A handle on one upstream's [`Shared`] block in its zone (valid as long as the zone: the
/// configuration's cycle).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LiveState(NonNull<Shared>);

impl LiveState {
    /// Allocates the state in the zone (while nginx creates the zone); None when it is full.
    pub fn create(slab: Slab, now_ms: u64) -> Option<LiveState> {
        // Zeroed memory is a valid Shared (lock free, no retired peers).
        let s = slab.calloc::<Shared>()?;
        let st = LiveState(s);
        st.shared()
            .generation
            .store(now_ms.max(1), Ordering::SeqCst);
        Some(st)
    }

    /// The atomics of the block (a shared reference: every field a worker changes without a
    /// lock is an atomic; `gate` is used only through nginx's lock functions and `retired` only
    /// through [`LiveUpstream`] with the list locks held, both by raw pointer).
    fn shared(&self) -> &Shared {
        // SAFETY: the block lives as long as the zone (handle); see above.
        unsafe { self.0.as_ref() }
    }

    fn gate(self) -> *mut ngx_atomic_t {
        // SAFETY: the block is live (handle); no reference is made.
        unsafe { ptr::addr_of_mut!((*self.0.as_ptr()).gate) }
    }

    /// The current generation.
    pub fn generation(self) -> u64 {
        self.shared().generation.load(Ordering::SeqCst)
    }

    /// Counts one request whose balancer data was made again after a change.
    pub fn count_rebalanced(self) {
        self.shared().rebalanced.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether retired peers wait to be freed (a hint read without lock).
    pub fn has_retiring(self) -> bool {
        self.shared().retiring.load(Ordering::Relaxed) > 0
    }

    /// Takes the gate for reading.
    pub fn gate_read(self) -> GateRead {
        // SAFETY: the lock word lives in the zone (handle).
        unsafe { ngx_rwlock_rlock(self.gate()) };
        GateRead(self)
    }

    fn gate_write(self) -> GateWrite {
        // SAFETY: as in gate_read.
        unsafe { ngx_rwlock_wlock(self.gate()) };
        GateWrite(self)
    }
}

/// A held read side of the gate, released on drop.
pub struct GateRead(LiveState);

impl Drop for GateRead {
    fn drop(&mut self) {
        // SAFETY: taken in `gate_read` by this process.
        unsafe { ngx_rwlock_unlock(self.0.gate()) };
    }
}

/// A held write side of the gate, released on drop.
struct GateWrite(LiveState);

impl Drop for GateWrite {
    fn drop(&mut self) {
        // SAFETY: taken in `gate_write` by this process.
        unsafe { ngx_rwlock_unlock(self.0.gate()) };
    }
}

/// One live upstream: its state and its primary list (in the zone, with its slab pool).
#[derive(Clone, Copy, Debug)]
pub struct LiveUpstream {
    state: LiveState,
    primary: Peers,
    slab: Slab,
}

impl LiveUpstream {
    /// # Safety
    /// `state` was made in the zone of the upstream whose zone list `primary` is (the lists'
    /// locks and the retired chain of `state` then belong together).
    pub unsafe fn new(state: LiveState, primary: Peers) -> Option<LiveUpstream> {
        Some(LiveUpstream {
            state,
            primary,
            slab: primary.slab()?,
        })
    }

    /// The retired chain (used by [`ListsWrite`]'s methods with the locks held).
    fn retired(self) -> RetiredChain {
        // SAFETY: the block is live and not null (handle): the address of one of its fields is
        // not null either; no reference is made.
        let head =
            unsafe { NonNull::new_unchecked(ptr::addr_of_mut!((*self.state.0.as_ptr()).retired)) };
        RetiredChain::new(head)
    }

    /// The upstream's live state.
    pub fn state(self) -> LiveState {
        self.state
    }

    /// The tries a new request gets now (nginx's `ngx_http_upstream_tries`: the `tries` of the
    /// primary and the backup list).
    pub fn fresh_tries(self) -> usize {
        let primary = self.primary.read().tries();
        primary + self.primary.backup().map_or(0, |b| b.read().tries())
    }

    /// `GET <loc>/NAME`.
    pub fn view(self) -> UpstreamView {
        self.sweep();
        // The gate keeps the lists and the generation still while they are read, the list
        // locks keep the per-peer figures consistent.
        let _g = self.state.gate_read();
        let mut servers = Vec::new();
        for (list, backup) in [(Some(self.primary), false), (self.primary.backup(), true)] {
            let Some(list) = list else { continue };
            let lock = list.read();
            for p in lock.peers() {
                let (name, st) = p.name_and_state();
                let c = p.current(backup);
                servers.push(ServerView {
                    address: name,
                    weight: c.as_ref().map_or(0, |c| u64::from(c.weight)),
                    max_fails: c.as_ref().map_or(0, |c| u64::from(c.max_fails)),
                    fail_timeout_ms: c.as_ref().map_or(0, |c| u64::from(c.fail_timeout_s) * 1000),
                    max_conns: c.as_ref().map_or(0, |c| u64::from(c.max_conns)),
                    backup,
                    down: c.as_ref().is_some_and(|c| c.down),
                    active: st.conns,
                    fails: st.fails,
                });
            }
        }
        let sh = self.state.shared();
        UpstreamView {
            generation: self.state.generation(),
            servers,
            retiring: sh.retiring.load(Ordering::SeqCst),
            rebalanced: sh.rebalanced.load(Ordering::Relaxed),
        }
    }

    /// `GET <loc>/NAME?slab`: the zone's slab figures.
    pub fn slab(self, zone: &str) -> SlabView {
        self.slab.figures(zone)
    }

    /// Applies a `PUT` (see `docs/live-api.md` for the semantics); `zone` and `name` name the
    /// upstream in error messages.
    pub fn apply(self, name: &str, zone: &str, req: &PutRequest) -> Result<PutView, ApiError> {
        // Lists and the generation change only under the gate's write side, held throughout:
        // the peers read below stay members of their lists until this function changes them.
        let _g = self.state.gate_write();
        let sh = self.state.shared();
        let now = self.state.generation();
        if let Some(want) = req.generation {
            if want != now {
                return Err(ApiError::generation_conflict(want, now));
            }
        }
        // The current set, primary first (its order is the plan's current index order).
        let mut cur_peers: Vec<Peer> = Vec::new();
        let mut current = Vec::new();
        for (list, backup) in [(Some(self.primary), false), (self.primary.backup(), true)] {
            let Some(list) = list else { continue };
            let lock = list.read();
            for p in lock.peers() {
                let Some(c) = p.current(backup) else {
                    return Err(ApiError::new(
                        409,
                        format!("upstream \"{name}\" has a server with an address family the API cannot handle"),
                    ));
                };
                cur_peers.push(p);
                current.push(c);
            }
        }
        let p = plan(&current, &req.servers);
        if p.unchanged {
            return Ok(PutView {
                generation: now,
                changed: false,
                added: 0,
                removed: 0,
                retiring: sh.retiring.load(Ordering::SeqCst),
                names: Default::default(),
            });
        }

        // Allocate everything new first: a full zone changes nothing.
        let need_backup_list =
            req.servers.iter().any(|x| x.backup) && self.primary.backup().is_none();
        let mut fresh: Vec<Option<Peer>> = vec![None; req.servers.len()];
        let mut new_backup = None;
        {
            let m = self.slab.lock();
            // A full zone is answered with 507; nginx's "[crit] ngx_slab_alloc() failed: no
            // memory" line for it would only repeat that, so it is off while these allocate.
            let log_nomem = m.set_log_nomem(false);
            let mut failed = false;
            for &j in &p.add {
                match m.alloc_peer(&req.servers[j]) {
                    Some(np) => fresh[j] = Some(np),
                    None => {
                        failed = true;
                        break;
                    }
                }
            }
            if !failed && need_backup_list {
                match m.alloc_list(self.primary) {
                    Some(b) => new_backup = Some(b),
                    None => failed = true,
                }
            }
            m.set_log_nomem(log_nomem);
            if failed {
                for np in fresh.iter().flatten() {
                    // SAFETY: allocated just above and never linked anywhere.
                    unsafe { m.free_peer(*np) };
                }
                return Err(ApiError::zone_full(name, zone));
            }
        }

        // Swap under the list write locks.
        let lists = self.primary.write_both();
        if let Some(b) = new_backup {
            // A backup list made by this process after the locks were taken is not locked by
            // them, but nobody can use it before the generation changes below, and the gate
            // keeps every selection out until then.
            lists.set_backup(b);
        }
        let mut member: Vec<Option<Peer>> = vec![None; req.servers.len()];
        for &(i, j) in &p.keep {
            lists.set_settings(cur_peers[i], &req.servers[j]);
            member[j] = Some(cur_peers[i]);
        }
        for (j, np) in fresh.iter().enumerate() {
            if np.is_some() {
                member[j] = *np;
            }
        }
        let members = |backup: bool| -> Vec<Peer> {
            req.servers
                .iter()
                .zip(&member)
                .filter(|(x, _)| x.backup == backup)
                .filter_map(|(_, m)| *m)
                .collect()
        };
        lists.set_list(self.primary, &members(false), totals(&req.servers, false));
        if let Some(b) = self.primary.backup() {
            lists.set_list(b, &members(true), totals(&req.servers, true));
        }
        let mut retired = 0u64;
        {
            let m = self.slab.lock();
            let chain = self.retired();
            for &i in &p.remove {
                let old = cur_peers[i];
                if old.in_use() {
                    lists.retire(chain, old);
                    retired += 1;
                } else {
                    // SAFETY: removed from every list above (the lists were rebuilt without
                    // it), not in use, both list write locks held; `old` is not used again.
                    unsafe { m.free_peer(old) };
                }
            }
        }
        let retiring = sh.retiring.fetch_add(retired, Ordering::SeqCst) + retired;
        let g = sh.generation.fetch_add(1, Ordering::SeqCst) + 1;
        drop(lists);
        Ok(PutView {
            generation: g,
            changed: true,
            added: p.add.len() as u64,
            removed: p.remove.len() as u64,
            retiring,
            names: p.names(&current, &req.servers),
        })
    }

    /// Frees retired peers whose last connection ended.
    pub fn sweep(self) {
        if !self.state.has_retiring() {
            return;
        }
        let lists = self.primary.write_both();
        let m = self.slab.lock();
        let freed = lists.free_idle_retired(self.retired(), &m);
        drop(m);
        self.state
            .shared()
            .retiring
            .fetch_sub(freed, Ordering::SeqCst);
    }
}
