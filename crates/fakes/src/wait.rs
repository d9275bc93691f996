//! Polling with a deadline, and what nginx serves for an upstream, for the end-to-end tests.

use std::time::{Duration, Instant};

use tributary_testkit::Nginx;

/// How long [`poll`] and [`wait_backends`] wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// Calls `f` every 100 ms until it returns `Ok`; after `timeout` panics with `what` and the last
/// `Err` seen.
pub fn poll_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: timed out after {timeout:?}; last: {last}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// [`poll_for`] with [`WAIT`].
pub fn poll<T>(what: &str, f: impl FnMut() -> Result<T, String>) -> T {
    poll_for(what, WAIT, f)
}

/// The backend names nginx answers through `/u/<upstream>/` over `rounds` requests (round robin),
/// sorted, without repeats.
pub fn backends_seen(nginx: &Nginx, upstream: &str, rounds: usize) -> Vec<String> {
    let mut seen: Vec<String> = (0..rounds)
        .filter_map(|_| {
            let (status, body) = nginx.get(&Nginx::upstream_path(upstream));
            (status == 200).then_some(body)
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// Polls nginx until the set of backends answering for `upstream` is exactly `want`, also after
/// the workers of older configurations have gone.
pub fn wait_backends(nginx: &Nginx, upstream: &str, want: &[&str]) {
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    let mut check = || {
        let seen = backends_seen(nginx, upstream, want.len() * 4);
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    };
    poll(&format!("nginx serves {want:?} for {upstream}"), &mut check);
    // The worker of the previous configuration may still answer for a moment: wait until it has
    // gone, then check again.
    nginx.wait_settled(WAIT).unwrap();
    poll(
        &format!("nginx serves {want:?} for {upstream} after settling"),
        check,
    );
}
