//! When a binding refreshes next (spec "Schedule"). Pure maths: the caller owns the clock.
//!
//! - Every `interval` (default [`DEFAULT_INTERVAL`], never below [`MIN_INTERVAL`]).
//! - After an answer with `0 < ttl_seconds < interval`: after `ttl_seconds`, never below
//!   [`MIN_INTERVAL`]. `ttl_seconds == 0` leaves it to the interval.
//! - After failures: back-off starting at [`MIN_INTERVAL`], doubling with each consecutive
//!   failure, capped at the interval.
//! - Jitter ([`jittered`]): every delay is spread by a random part of it, so bindings saved or
//!   woken together do not refresh in lockstep.

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

/// Default refresh jitter, in percent of each delay.
pub const DEFAULT_JITTER_PCT: u8 = 10;
/// Largest refresh jitter accepted, in percent.
pub const MAX_JITTER_PCT: u8 = 50;

/// The delay actually slept instead of `delay` (one of the delays above), with a jitter of
/// `jitter_pct` % (capped at [`MAX_JITTER_PCT`]); `unit` is a random number in [0, 1).
///
/// - `first` (the first scheduled delay after a binding's task started, or after a run that was
///   not on its schedule: a person's refresh, a claim taken over, a catch-up): drawn from
///   [10 s, max(delay, 10 s + delay / 2)]: the binding's phase is spread over its interval (at
///   least half of it, also at the 10 s minimum).
/// - Every other delay: drawn from a window of `jitter_pct` % of the delay that ends at the delay
///   (up to that much early), moved later when it would start below 10 s (a 10 s delay with 10 %
///   becomes 10-11 s). So the window always has its full width: phases keep drifting apart at
///   every reschedule, whatever the interval.
///
/// Never below [`MIN_INTERVAL`]. A jitter of 0 keeps `delay` exactly.
pub fn jittered(delay: Duration, jitter_pct: u8, first: bool, unit: f64) -> Duration {
    if jitter_pct == 0 {
        return delay;
    }
    let unit = unit.clamp(0.0, 1.0);
    let delay = delay.max(MIN_INTERVAL);
    if first {
        let hi = delay.max(MIN_INTERVAL + delay / 2);
        return MIN_INTERVAL + (hi - MIN_INTERVAL).mul_f64(unit);
    }
    let pct = f64::from(jitter_pct.min(MAX_JITTER_PCT)) / 100.0;
    let width = delay.mul_f64(pct);
    let hi = delay.max(MIN_INTERVAL + width);
    hi.saturating_sub(width.mul_f64(unit)).max(MIN_INTERVAL)
}
