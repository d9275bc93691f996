//! Waiting for a child process to be ready ([`wait_ready`]): the start-up loop of every server a
//! test runs (nginx; the fakes: etcd, dnsmasq, moto, the daemon), which polls until the server answers,
//! fails early when the process exits instead, and gives up after a deadline.

use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// How often [`wait_ready`] asks (nginx starts in a few tens of milliseconds; the module tests
/// start it hundreds of times).
const EVERY: Duration = Duration::from_millis(20);

/// Why a child did not become ready.
#[derive(Debug)]
pub enum NotReady {
    /// The process exited first, with this status (reaped).
    Exited(ExitStatus),
    /// It still runs but was not ready within the timeout.
    TimedOut(Duration),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Exited(status) => write!(f, "exited with {status}"),
            NotReady::TimedOut(t) => write!(f, "not ready within {t:?}"),
        }
    }
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
pub fn listening(port: u16) -> bool {
    TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Polls `ready` every 20 ms until it returns true. Fails with [`NotReady::Exited`] as soon as
/// `child` has exited (a server that cannot start says why in its log: the caller adds it), and
/// with [`NotReady::TimedOut`] after `timeout`.
pub fn wait_ready(
    child: &mut Child,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), NotReady> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotReady::Exited(status));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(NotReady::TimedOut(timeout));
        }
        thread::sleep(EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::process::Command;

    #[test]
    fn a_child_that_exits_is_reported_at_once() {
        let mut child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let started = Instant::now();
        match wait_ready(&mut child, Duration::from_secs(30), || false) {
            Err(NotReady::Exited(s)) => assert_eq!(s.code(), Some(3)),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_running_child_is_ready_when_asked_or_times_out() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(wait_ready(&mut child, Duration::from_secs(5), || listening(port)).is_ok());
        drop(l);
        assert!(!listening(port));
        let r = wait_ready(&mut child, Duration::from_millis(200), || listening(port));
        assert!(matches!(r, Err(NotReady::TimedOut(_))), "{r:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
