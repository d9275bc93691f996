//! The per-server record table of a live upstream in its zone ([`HealthShared`], behind the
//! [`Health`] handle), and the prober's lease.
//!
//! The table is the zone's general per-server record: one [`Rec`] per server of the set, keyed
//! by the peer's name (`10.0.0.1:8080`, the same for a server kept across a `PUT`), holding its
//! health (`upstrand_core::live::probe::HealthState`) and the probe's counters (`ProbeCounts`,
//! the `health_checks` of the server's statistics; the other counters and the ids are
//! per peer, `ffi/counters.rs`). It is a slab array with its own rwlock (`lock`), used
//! only by the probe code and `GET` (never by a peer selection): read-held to copy it out,
//! write-held (with a deadline, like every write side in the zone) to change a record in place
//! or to swap in a rebuilt array. Only the prober that holds the lease rebuilds it (once per
//! round: servers added by a `PUT` get a record, removed ones lose theirs).
//!
//! The lease (`owner_pid`, `heartbeat_ms`): the worker whose pid is in `owner_pid` probes the
//! upstream and renews `heartbeat_ms` (nginx's `ngx_current_msec`, shared by the workers) each
//! tick; another worker takes `owner_pid` by compare-and-swap once the heartbeat is older than
//! the stale limit, so a dead owner is replaced within about an interval and two workers never
//! both hold it. A worker that exits gives its leases back.

use core::mem::size_of;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ngx::ffi::{ngx_atomic_t, ngx_rwlock_unlock, ngx_slab_free};
use upstrand_core::live::probe::HealthState;

use super::peers::{wlock_until, Slab};

/// nginx's `NGX_RWLOCK_WLOCK` (the lock word of a write-held rwlock).
const WLOCK: u64 = u64::MAX;

/// How long a reader waits for the table's lock.
const READ_WAIT: core::time::Duration = core::time::Duration::from_millis(50);

/// Longest peer name a record keeps (`NGX_SOCKADDR_STRLEN`).
pub const NAME_MAX: usize = 113;

/// One server's record. No padding: every byte is written (`pad`), so no process ever copies
/// undefined bytes into the zone (valgrind tracks definedness per process, and bytes another
/// process left undefined there would later read as undefined in this one).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Rec {
    name_len: u32,
    name: [u8; NAME_MAX],
    pad: [u8; 3],
    /// Its health.
    pub state: HealthState,
    /// The probe's counters since the server got its record (its statistics'
    /// `health_checks`).
    pub counts: ProbeCounts,
}

/// A server's probe counters (`health_checks` of its statistics).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ProbeCounts {
    /// Probes that ended.
    pub checks: u64,
    /// Of those, failed.
    pub fails: u64,
    /// Times the server became unhealthy.
    pub unhealthy: u64,
}

const _: () = assert!(
    size_of::<Rec>() == 4 + NAME_MAX + 3 + size_of::<HealthState>() + size_of::<ProbeCounts>()
);

impl Rec {
    /// A record for the peer `name` (cut to [`NAME_MAX`] bytes).
    pub fn new(name: &str, state: HealthState) -> Rec {
        let mut r = Rec {
            name_len: 0,
            name: [0; NAME_MAX],
            pad: [0; 3],
            state,
            counts: ProbeCounts::default(),
        };
        let b = name.as_bytes();
        let n = b.len().min(NAME_MAX);
        r.name[..n].copy_from_slice(&b[..n]);
        r.name_len = n as u32;
        r
    }

    /// The peer's name.
    pub fn name(&self) -> &[u8] {
        self.name.get(..self.name_len as usize).unwrap_or_default()
    }
}

/// The block in the zone.
#[repr(C)]
pub struct HealthShared {
    lock: ngx_atomic_t,
    owner_pid: AtomicU64,
    heartbeat_ms: AtomicU64,
    /// Probes started over all workers since the zone was made.
    probes: AtomicU64,
    /// Rounds started.
    rounds: AtomicU64,
    /// The array (slab), its capacity and length: only under `lock`.
    table: *mut Rec,
    cap: usize,
    len: usize,
}

/// A handle on an upstream's [`HealthShared`] (valid as long as its zone).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Health {
    block: NonNull<HealthShared>,
    slab: Slab,
}

// SAFETY: used only on nginx's thread of each process; the block is in shared memory.
unsafe impl Send for Health {}

impl Health {
    /// Allocates the block in the zone (while nginx makes it); None when it is full.
    pub fn create(slab: Slab) -> Option<Health> {
        // Zeroed memory is an empty table, unlocked, without owner.
        let block = slab.calloc::<HealthShared>()?;
        Some(Health { block, slab })
    }

    /// The block's address (for [`Self::from_addr`]).
    pub(crate) fn addr(self) -> u64 {
        self.block.as_ptr() as u64
    }

    /// # Safety
    /// `addr` is 0 or the address of a block [`Self::create`] made in the zone of `slab`.
    pub(crate) unsafe fn from_addr(addr: u64, slab: Slab) -> Option<Health> {
        NonNull::new(addr as usize as *mut HealthShared).map(|block| Health { block, slab })
    }

    fn sh(&self) -> &HealthShared {
        // SAFETY: the block lives as long as the zone (handle); the fields read through this
        // reference without the lock are atomics.
        unsafe { self.block.as_ref() }
    }

    fn lock_word(self) -> *mut ngx_atomic_t {
        // SAFETY: the block is live (handle); no reference is made.
        unsafe { ptr::addr_of_mut!((*self.block.as_ptr()).lock) }
    }

    /// Renews (owner `pid`) or takes the lease when its heartbeat is older than `stale_ms` at
    /// `now`; whether `pid` holds it now.
    pub fn lease(self, pid: u64, now: u64, stale_ms: u64) -> bool {
        let sh = self.sh();
        let owner = sh.owner_pid.load(Ordering::SeqCst);
        if owner == pid {
            sh.heartbeat_ms.store(now, Ordering::SeqCst);
            return true;
        }
        let beat = sh.heartbeat_ms.load(Ordering::SeqCst);
        if owner != 0 && now.saturating_sub(beat) <= stale_ms {
            return false;
        }
        if sh
            .owner_pid
            .compare_exchange(owner, pid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            sh.heartbeat_ms.store(now, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// Gives the lease back when `pid` holds it.
    pub fn release(self, pid: u64) {
        let _ = self
            .sh()
            .owner_pid
            .compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The pid holding the lease (0: none).
    pub fn owner(self) -> u64 {
        self.sh().owner_pid.load(Ordering::SeqCst)
    }

    /// Counts a round and its `probes`.
    pub fn count_round(self, probes: u64) {
        self.sh().rounds.fetch_add(1, Ordering::Relaxed);
        self.sh().probes.fetch_add(probes, Ordering::Relaxed);
    }

    /// `(rounds, probes)` so far.
    pub fn counts(self) -> (u64, u64) {
        (
            self.sh().rounds.load(Ordering::Relaxed),
            self.sh().probes.load(Ordering::Relaxed),
        )
    }

    /// A copy of the table, read under its read lock, taken within [`READ_WAIT`] (None when it
    /// stays write-held, e.g. a worker died holding it: the caller goes on without the records
    /// rather than stalling its worker).
    pub fn read(self) -> Option<Vec<Rec>> {
        if !self.rlock_until(Instant::now() + READ_WAIT) {
            return None;
        }
        // SAFETY: table/len change only under the write lock, excluded now; the array holds
        // `len` initialised records.
        let out = unsafe {
            let b = self.block.as_ptr();
            if (*b).table.is_null() {
                Vec::new()
            } else {
                core::slice::from_raw_parts((*b).table, (*b).len).to_vec()
            }
        };
        // SAFETY: taken above by this process.
        unsafe { ngx_rwlock_unlock(self.lock_word()) };
        Some(out)
    }

    /// Takes the read side of the table's lock like `ngx_rwlock_rlock` (one more reader unless
    /// it is write-held) but gives up at `deadline`; released with `ngx_rwlock_unlock`.
    fn rlock_until(self, deadline: Instant) -> bool {
        // SAFETY: the word lives in the zone (handle) and is only used atomically (nginx's
        // functions and `wlock_until` use the CPU's atomic instructions on it).
        let word = unsafe { AtomicU64::from_ptr(self.lock_word()) };
        loop {
            for _ in 0..64 {
                let v = word.load(Ordering::Relaxed);
                if v != WLOCK
                    && word
                        .compare_exchange(v, v.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    return true;
                }
                core::hint::spin_loop();
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Runs `f` on the record of `name` (looked for at `hint` first) under the write lock taken
    /// within `deadline`; false when the lock stayed taken or no record has that name. `f` must
    /// not panic or allocate.
    pub fn modify(
        self,
        hint: usize,
        name: &[u8],
        deadline: Instant,
        f: impl FnOnce(&mut Rec),
    ) -> bool {
        // SAFETY: as in `read`.
        if !unsafe { wlock_until(self.lock_word(), deadline) } {
            return false;
        }
        // SAFETY: the write lock is held: nobody else reads or writes the array.
        let found = unsafe {
            let b = self.block.as_ptr();
            if (*b).table.is_null() {
                None
            } else {
                let all = core::slice::from_raw_parts_mut((*b).table, (*b).len);
                if all.get(hint).is_some_and(|r| r.name() == name) {
                    all.get_mut(hint)
                } else {
                    all.iter_mut().find(|r| r.name() == name)
                }
            }
        };
        let hit = found.is_some();
        if let Some(r) = found {
            f(r);
        }
        // SAFETY: taken above by this process.
        unsafe { ngx_rwlock_unlock(self.lock_word()) };
        hit
    }

    /// Makes the table `recs`, where `from[i]` is the index in the table read earlier
    /// ([`Self::read`]) of the record `recs[i]` was made from (its state is taken again from
    /// the table under the lock, so a result recorded meanwhile is kept), None for a new one.
    /// False (nothing changed) when the zone is full or the lock stayed taken.
    pub fn rebuild(self, recs: &[Rec], from: &[Option<usize>], deadline: Instant) -> bool {
        let bytes = size_of::<Rec>() * recs.len().max(1);
        // Allocated before the lock is taken (the slab mutex is not held with it).
        let Some(new) = self.slab.alloc_bytes(bytes) else {
            return false;
        };
        let new = new.cast::<Rec>();
        // SAFETY: `new` has room for recs.len() records and overlaps nothing.
        unsafe { ptr::copy_nonoverlapping(recs.as_ptr(), new.as_ptr(), recs.len()) };
        // SAFETY: as in `read`.
        if !unsafe { wlock_until(self.lock_word(), deadline) } {
            // SAFETY: allocated above from this zone's pool, never shared.
            unsafe { ngx_slab_free(self.slab.raw_pool(), new.as_ptr().cast()) };
            return false;
        }
        // SAFETY: the write lock is held; the old array holds `len` records; `new` holds
        // recs.len(); indexes are checked.
        let old = unsafe {
            let b = self.block.as_ptr();
            let old_table = (*b).table;
            if !old_table.is_null() {
                let old = core::slice::from_raw_parts(old_table, (*b).len);
                let fresh = core::slice::from_raw_parts_mut(new.as_ptr(), recs.len());
                for (r, i) in fresh.iter_mut().zip(from) {
                    if let Some(o) = i.and_then(|i| old.get(i)) {
                        if o.name() == r.name() {
                            r.state = o.state;
                            r.counts = o.counts;
                        }
                    }
                }
            }
            (*b).table = new.as_ptr();
            (*b).cap = recs.len();
            (*b).len = recs.len();
            old_table
        };
        // SAFETY: taken above by this process.
        unsafe { ngx_rwlock_unlock(self.lock_word()) };
        if !old.is_null() {
            // SAFETY: the old array is no longer reachable (swapped under the write lock; every
            // reader copies under the read lock); allocated from this pool.
            unsafe { ngx_slab_free(self.slab.raw_pool(), old.cast()) };
        }
        true
    }
}
