//! The few helpers every Tributary crate shares, so that none writes its own: the wall clock in
//! milliseconds and a lock that goes on past a poisoned mutex. No dependencies, so that the
//! lowest crates (the store, the plugin host, the plugins) can use it.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it): the time stamps of the
/// records the daemon keeps, and its one reading of the wall clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Locks `m`, going on with the data of a poisoned one: a thread that panicked while holding it
/// does not make every later caller panic too. For mutexes whose every critical section leaves
/// the data consistent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_goes_on_past_a_poisoned_mutex() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let panicked = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
    }

    #[test]
    fn now_ms_is_the_wall_clock() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let now = now_ms();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(before <= now && now <= after, "{before} {now} {after}");
    }
}
