//! The per-server record table of a live upstream in its zone ([`HealthShared`], behind the
//! [`Health`] handle), and the prober's lease.
//!
//! The table is the zone's general per-server record: one [`Rec`] per server of the set, keyed
//! by the peer's name (`10.0.0.1:8080`, the same for a server kept across a `PUT`), holding its
//! health (`upstrand_core::live::probe::HealthState`) and the probe's counters (`ProbeCounts`,
//! the `health_checks` of the server's statistics; the other counters and the ids are
//! per peer, `ffi/counters.rs`). It is a slab array with its own rwlock (a
//! `ffi/pool/shm.rs` [`ZoneTable`]: this file is safe code on the zone primitives there), used
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
use core::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use upstrand_core::live::probe::HealthState;

use super::peers::Slab;
use super::shm::{ZoneLink, ZoneRef, ZoneShared, ZoneTable};

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
    owner_pid: AtomicU64,
    heartbeat_ms: AtomicU64,
    /// Probes started over all workers since the zone was made.
    probes: AtomicU64,
    /// Rounds started.
    rounds: AtomicU64,
    /// The records, behind their own rwlock.
    table: ZoneTable<Rec>,
}

// SAFETY: zeroed memory is an empty table, unlocked, without owner; every field is an atomic
// or a `ZoneTable`.
unsafe impl ZoneShared for HealthShared {}

/// A handle on an upstream's [`HealthShared`] (valid as long as its zone).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Health {
    block: ZoneRef<HealthShared>,
    slab: Slab,
}

// SAFETY: used only on nginx's thread of each process; the block is in shared memory.
unsafe impl Send for Health {}

impl Health {
    /// Allocates the block in the zone (while nginx makes it) and links it from `link` (a field
    /// of a block in the same zone); None when the zone is full.
    pub fn create(slab: Slab, link: &ZoneLink<HealthShared>) -> Option<Health> {
        let block = ZoneRef::calloc(slab)?;
        link.set(slab, block).then_some(Health { block, slab })
    }

    /// The block `link` points at (made by [`Self::create`] in the zone of `slab`).
    pub fn linked(link: &ZoneLink<HealthShared>, slab: Slab) -> Option<Health> {
        link.get().map(|block| Health { block, slab })
    }

    fn sh(&self) -> &HealthShared {
        self.block.get()
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
        self.sh().table.read_until(Instant::now() + READ_WAIT)
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
        self.sh()
            .table
            .modify_until(deadline, |all| {
                let found = if all.get(hint).is_some_and(|r| r.name() == name) {
                    all.get_mut(hint)
                } else {
                    all.iter_mut().find(|r| r.name() == name)
                };
                let hit = found.is_some();
                if let Some(r) = found {
                    f(r);
                }
                hit
            })
            .unwrap_or(false)
    }

    /// Makes the table `recs`, where `from[i]` is the index in the table read earlier
    /// ([`Self::read`]) of the record `recs[i]` was made from (its state is taken again from
    /// the table under the lock, so a result recorded meanwhile is kept), None for a new one.
    /// False (nothing changed) when the zone is full or the lock stayed taken.
    pub fn rebuild(self, recs: &[Rec], from: &[Option<usize>], deadline: Instant) -> bool {
        self.sh()
            .table
            .replace_until(self.slab, recs, deadline, |old, fresh| {
                for (r, i) in fresh.iter_mut().zip(from) {
                    if let Some(o) = i.and_then(|i| old.get(i)) {
                        if o.name() == r.name() {
                            r.state = o.state;
                            r.counts = o.counts;
                        }
                    }
                }
            })
    }
}
