//! Removed servers that still have requests in flight ("retired" peers, put on the upstream's
//! retired chain by a `PUT` in `zone.rs`): freeing them once idle ([`LiveUpstream::sweep`], from
//! a request's `free` at most once per [`SWEEP_EVERY_MS`], or from a `GET`) and naming the ones
//! still busy `retired_warn` after their removal ([`LiveUpstream::overdue_retired`]).

use core::sync::atomic::Ordering;
use std::time::Instant;

use upstrand_core::live::render::RetiredView;

use super::zone::{now_ms, LiveUpstream};

/// A request's `free` sweeps the retired peers of its upstream at most once per this many
/// milliseconds (over all workers): while a removed server keeps a long connection, a sweep on
/// every `free` would make every request take both list write locks and the slab mutex.
pub const SWEEP_EVERY_MS: u64 = 100;

impl LiveUpstream {
    /// [`Self::sweep`] from a request's `free`: at most once per [`SWEEP_EVERY_MS`] for this
    /// upstream over all workers (a retired peer is freed at most that long after its last
    /// connection ended, or at the next `GET`).
    /// Whether it swept (then [`Self::overdue_retired`] is worth asking).
    pub fn sweep_due(self) -> bool {
        if !self.state.has_retiring() {
            return false;
        }
        let now = now_ms();
        let next = &self.state.shared().next_sweep_ms;
        let due = next.load(Ordering::Relaxed);
        if now < due
            || next
                .compare_exchange(
                    due,
                    now + SWEEP_EVERY_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return false;
        }
        self.sweep();
        true
    }

    /// Retired peers that still have connections `retired_warn` after their removal and no
    /// `warn` line named yet (oldest first); the caller logs them. Each is returned once over all
    /// workers: to the caller that moves the zone's `warned_since` past their removal times.
    pub fn overdue_retired(self) -> Vec<RetiredView> {
        let sh = self.state.shared();
        let warn = sh.retired_warn_ms.load(Ordering::Relaxed);
        if warn == 0 || !self.state.has_retiring() {
            return Vec::new();
        }
        let now = now_ms();
        let warned = sh.warned_since.load(Ordering::SeqCst);
        let due: Vec<RetiredView> = self
            .primary
            .read_both()
            .retired(self.retired(), now)
            .into_iter()
            .filter(|v| v.active > 0 && v.age_ms >= warn && now.saturating_sub(v.age_ms) > warned)
            .collect();
        let Some(newest) = due.iter().map(|v| now.saturating_sub(v.age_ms)).max() else {
            return due;
        };
        match sh
            .warned_since
            .compare_exchange(warned, newest, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => due,
            Err(_) => Vec::new(),
        }
    }

    /// `retired_warn` of the zone in ms (0: off).
    pub fn retired_warn_ms(self) -> u64 {
        self.state.shared().retired_warn_ms.load(Ordering::Relaxed)
    }

    /// Frees retired peers whose last connection ended. Tries the list locks once (no waiting:
    /// they may be held by a dead worker); a later sweep frees what this one could not.
    /// Panic-free while they are held (see `ffi/peers/`).
    #[deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::arithmetic_side_effects
    )]
    pub fn sweep(self) {
        if !self.state.has_retiring() {
            return;
        }
        let Some(lists) = self.primary.write_both(Instant::now()) else {
            return;
        };
        let m = self.slab.lock();
        let freed = lists.free_idle_retired(self.retired(), &m);
        drop(m);
        drop(lists);
        self.state
            .shared()
            .retiring
            .fetch_sub(freed, Ordering::SeqCst);
    }
}
