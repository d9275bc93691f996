//! When a binding refreshes next (spec "Schedule"). Pure maths: the caller owns the clock.
//!
//! - Every `interval` (default [`DEFAULT_INTERVAL`], never below [`MIN_INTERVAL`]).
//! - After an answer with `0 < ttl_seconds < interval`: after `ttl_seconds`, never below
//!   [`MIN_INTERVAL`]. `ttl_seconds == 0` leaves it to the interval.
//! - After failures: back-off starting at [`MIN_INTERVAL`], doubling with each consecutive
//!   failure, capped at the interval.

use std::time::Duration;

/// Refresh interval of a binding when none is given: 60 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// No binding refreshes more often than this: 10 s.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Longest refresh interval a binding accepts: one week.
pub const MAX_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The interval actually used: `interval`, raised to [`MIN_INTERVAL`] when shorter.
pub fn effective_interval(interval: Duration) -> Duration {
    interval.max(MIN_INTERVAL)
}

/// Delay until the next refresh after a successful answer with `ttl_seconds`.
pub fn next_refresh_delay(interval: Duration, ttl_seconds: u64) -> Duration {
    let interval = effective_interval(interval);
    let ttl = Duration::from_secs(ttl_seconds);
    if ttl_seconds > 0 && ttl < interval {
        ttl.max(MIN_INTERVAL)
    } else {
        interval
    }
}

/// Delay until the next attempt after `consecutive_failures` failures in a row (0 and 1 both mean
/// "the first failure"): 10 s, 20 s, 40 s, ... capped at the interval.
pub fn failure_backoff(interval: Duration, consecutive_failures: u32) -> Duration {
    let interval = effective_interval(interval);
    let doublings = consecutive_failures.saturating_sub(1).min(32);
    let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
    MIN_INTERVAL.saturating_mul(factor).min(interval)
}
