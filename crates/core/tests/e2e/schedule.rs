//! Schedule maths (spec "Schedule").
use std::time::Duration;
use tributary_core::schedule::{
    effective_interval, failure_backoff, next_refresh_delay, DEFAULT_INTERVAL, MIN_INTERVAL,
};

const fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[test]
fn constants() {
    assert_eq!(DEFAULT_INTERVAL, s(60));
    assert_eq!(MIN_INTERVAL, s(10));
}

#[test]
fn next_refresh_table() {
    // (interval, ttl_seconds, expected delay)
    let cases = [
        (s(60), 0, s(60)),  // ttl 0: the interval
        (s(60), 30, s(30)), // shorter ttl wins
        (s(60), 59, s(59)),
        (s(60), 60, s(60)),  // equal: the interval
        (s(60), 600, s(60)), // longer ttl: the interval
        (s(60), 5, s(10)),   // never sooner than 10 s
        (s(60), 1, s(10)),
        (s(60), 10, s(10)),
        (s(5), 0, s(10)), // interval below the floor is raised
        (s(5), 3, s(10)),
        (s(0), 0, s(10)),
        (s(300), 120, s(120)),
        (s(15), 12, s(12)),
        (s(60), u64::MAX, s(60)),
    ];
    for (interval, ttl, expected) in cases {
        assert_eq!(
            next_refresh_delay(interval, ttl),
            expected,
            "interval {interval:?} ttl {ttl}"
        );
    }
}

#[test]
fn failure_backoff_table() {
    let cases = [
        (s(60), 0, s(10)),
        (s(60), 1, s(10)),
        (s(60), 2, s(20)),
        (s(60), 3, s(40)),
        (s(60), 4, s(60)), // capped at the interval
        (s(60), 50, s(60)),
        (s(60), u32::MAX, s(60)),
        (s(600), 5, s(160)),
        (s(600), 7, s(600)),
        (s(10), 3, s(10)),
        (s(1), 1, s(10)), // floor applies to the cap too
        (
            Duration::from_secs(u64::MAX / 2),
            200,
            Duration::from_secs(10).saturating_mul(u32::MAX),
        ),
    ];
    for (interval, n, expected) in cases {
        assert_eq!(
            failure_backoff(interval, n),
            expected,
            "interval {interval:?} failures {n}"
        );
    }
}

#[test]
fn backoff_never_shrinks_and_stays_in_bounds() {
    for interval in [s(10), s(11), s(60), s(61), s(3600)] {
        let mut prev = Duration::ZERO;
        for n in 0..40 {
            let d = failure_backoff(interval, n);
            assert!(d >= prev && d >= MIN_INTERVAL && d <= effective_interval(interval));
            prev = d;
        }
    }
}

#[test]
fn bindings_in_lockstep_at_the_minimum_interval_drift_apart_every_round() {
    use tributary_core::schedule::{jittered, DEFAULT_JITTER_PCT};
    // 30 bindings resolved at the same moment, 10 s interval, the default jitter: the spread of
    // each round's refresh times (pure simulation with a fixed sequence of random numbers).
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut unit = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut at = [Duration::ZERO; 30];
    for round in 0..5 {
        for t in &mut at {
            *t += jittered(s(10), DEFAULT_JITTER_PCT, round == 0, unit());
            assert!(*t >= s(10) * (round + 1));
        }
        let spread = *at.iter().max().unwrap() - *at.iter().min().unwrap();
        assert!(spread >= s(2), "round {round}: spread {spread:?}");
    }
}
