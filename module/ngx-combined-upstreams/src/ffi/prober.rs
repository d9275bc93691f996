//! Active health checks' probes: one probe ([`start_probe`]) connects without blocking, writes
//! its request and reads the answer from nginx's event loop, each step judged here as safe code
//! on [`Conn`] (`process.rs` holds the connection, its event trampolines and the worker's tick
//! timer). The judging of answers and the health state are the safe code of `live/health.rs`
//! and the pure crate; this file only moves bytes and reports a
//! `upstrand_core::live::probe::Outcome` to [`ProbeDone::done`].

use upstrand_core::live::probe::{Failure, Outcome};

use super::process::{connect, Conn, Next, Probing};

pub use super::process::{
    abort_all, arm_tick, disarm_tick, exit_process, exiting, init_process, pid, ProcessHooks,
    Ticker,
};

/// Where a probe's outcome goes.
pub trait ProbeDone: 'static {
    /// What the caller attached to the probe.
    type Token: 'static;
    /// The probe ended.
    fn done(token: Self::Token, outcome: Outcome);
    /// Judges an HTTP answer read so far (`complete`: no more will come); None: read more.
    fn judge(token: &Self::Token, data: &[u8], complete: bool) -> Option<Outcome>;
}

/// One probe: what to connect to and what to send.
pub struct ProbeSpec {
    /// The server's socket address (`sockaddr` bytes as nginx keeps them).
    pub sockaddr: Vec<u8>,
    /// Its name (for nginx's log lines).
    pub name: String,
    /// The request (None: `type=tcp`, connect only).
    pub request: Option<Vec<u8>>,
    /// Timeout of the whole probe in ms.
    pub timeout_ms: u64,
    /// Most answer bytes to read.
    pub max_read: usize,
}

/// Starts a probe. An immediate failure (connect refused at once, no connection free) is
/// reported through `D::done` before this returns.
pub fn start_probe<D: ProbeDone>(spec: ProbeSpec, token: D::Token) {
    let ProbeSpec {
        sockaddr,
        name,
        request,
        timeout_ms,
        max_read,
    } = spec;
    let state = Progress::<D> {
        request,
        max_read,
        sent: 0,
        connected: false,
        answer: Vec::new(),
        token: Some(token),
    };
    connect(sockaddr, name, timeout_ms, state);
}

/// A probe's progress: what it sends, what it read, where its outcome goes.
struct Progress<D: ProbeDone> {
    request: Option<Vec<u8>>,
    max_read: usize,
    sent: usize,
    connected: bool,
    answer: Vec<u8>,
    token: Option<D::Token>,
}

fn fail(why: Failure, errno: i32) -> Next {
    Next::Done(Outcome::Fail {
        why,
        errno,
        status: 0,
    })
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

const NGX_AGAIN: isize = ngx::ffi::NGX_AGAIN as isize;

impl<D: ProbeDone> Probing for Progress<D> {
    fn on_write(&mut self, c: &Conn) -> Next {
        if !self.connected {
            let err = c.so_error();
            if err != 0 {
                return fail(Failure::Connect, err);
            }
            self.connected = true;
            if self.request.is_none() {
                return Next::Done(Outcome::Pass { status: 0 });
            }
        }
        let Some(req) = self.request.as_ref() else {
            return Next::Wait;
        };
        while let Some(rest) = req.get(self.sent..).filter(|r| !r.is_empty()) {
            let Some(n) = c.send(rest) else {
                return fail(Failure::NoResources, 0);
            };
            if n > 0 {
                self.sent += n as usize;
            } else if n == NGX_AGAIN {
                if !c.wait_write() {
                    return fail(Failure::NoResources, 0);
                }
                return Next::Wait;
            } else {
                return fail(Failure::Io, last_errno());
            }
        }
        // Sent: the answer comes through the read event (already registered by the connect).
        if !c.wait_read() {
            return fail(Failure::NoResources, 0);
        }
        if c.read_ready() {
            Next::Read
        } else {
            Next::Wait
        }
    }

    fn on_read(&mut self, c: &Conn) -> Next {
        if c.timed_out() {
            return fail(Failure::Timeout, 0);
        }
        if !self.connected {
            // Readiness before the write event told us about the connect: the write step
            // judges it (a failed connect ends the probe there).
            return Next::Write;
        }
        if self.sent < self.request.as_ref().map_or(0, Vec::len) {
            return Next::Wait; // still writing
        }
        if !c.can_recv() {
            return fail(Failure::NoResources, 0);
        }
        let mut buf = [0u8; 4096];
        loop {
            let room = self
                .max_read
                .saturating_sub(self.answer.len())
                .min(buf.len());
            let n = match buf.get_mut(..room) {
                Some(b) if room > 0 => c.recv(b).unwrap_or(0),
                _ => 0,
            };
            if n > 0 {
                self.answer
                    .extend_from_slice(buf.get(..n as usize).unwrap_or_default());
                let full = self.answer.len() >= self.max_read;
                if let Some(t) = self.token.as_ref() {
                    if let Some(o) = D::judge(t, &self.answer, full) {
                        return Next::Done(o);
                    }
                }
                continue;
            }
            if n == 0 {
                let o = self
                    .token
                    .as_ref()
                    .and_then(|t| D::judge(t, &self.answer, true))
                    .unwrap_or(Outcome::Fail {
                        why: Failure::NoAnswer,
                        errno: 0,
                        status: 0,
                    });
                return Next::Done(o);
            }
            if n == NGX_AGAIN {
                if !c.wait_read() {
                    return fail(Failure::NoResources, 0);
                }
                return Next::Wait;
            }
            return fail(Failure::Io, last_errno());
        }
    }

    fn end(&mut self, outcome: Outcome) {
        if let Some(t) = self.token.take() {
            D::done(t, outcome);
        }
    }
}
