//! The event side of active health checks: the worker's probe timer ([`Ticker`], armed from the
//! module's `init_process`), and one probe connection ([`start_probe`]): a non-blocking
//! `ngx_event_connect_peer`, the request written and the answer read from nginx's event loop,
//! a timer on the connection's read event for the probe's timeout. Nothing here blocks a
//! worker. The judging of answers and the health state are the safe code of `live/health.rs`
//! and the pure crate; this file only moves bytes and reports a
//! `upstrand_core::live::probe::Outcome` to [`ProbeDone::done`].
//!
//! Shutdown: the tick timer and the probes' timers are `cancelable`, so a worker that exits
//! (graceful shutdown, reload) is not kept alive by them; [`exiting`] tells the tick to stop.

use core::ffi::c_void;
use core::mem::zeroed;
use core::ptr;

use ngx::ffi::{
    ngx_add_timer, ngx_close_connection, ngx_connection_t, ngx_cycle_t, ngx_del_timer,
    ngx_event_connect_peer, ngx_event_get_peer, ngx_event_t, ngx_handle_read_event,
    ngx_handle_write_event, ngx_int_t, ngx_msec_t, ngx_peer_connection_t, ngx_str_t,
};
use upstrand_core::live::probe::{Failure, Outcome};

use super::Status;

/// The module's per-process hooks (`init_process`, `exit_process`).
pub trait ProcessHooks {
    /// In a worker (or the single process) once it started.
    fn init_process();
    /// In a worker that exits.
    fn exit_process();
}

/// `init_process` of the module object.
pub extern "C" fn init_process<P: ProcessHooks>(_cycle: *mut ngx_cycle_t) -> ngx_int_t {
    if is_worker() {
        P::init_process();
    }
    Status::NGX_OK.0
}

/// `exit_process` of the module object.
pub extern "C" fn exit_process<P: ProcessHooks>(_cycle: *mut ngx_cycle_t) {
    if is_worker() {
        P::exit_process();
    }
}

pub use super::{exiting, is_worker, pid};

/// What the tick timer runs.
pub trait Ticker {
    /// One tick; the delay to the next in ms, or None to stop.
    fn tick() -> Option<u64>;
}

/// The worker's tick event (one per process; made by [`arm_tick`], never freed: it lives as
/// long as the worker).
static mut TICK: *mut ngx_event_t = ptr::null_mut();

extern "C" fn tick_handler<T: Ticker>(_ev: *mut ngx_event_t) {
    if let Some(ms) = T::tick() {
        arm_tick::<T>(ms);
    }
}

/// Arms (or re-arms) the worker's tick timer `ms` from now (cancelable: it never delays the
/// worker's exit).
pub fn arm_tick<T: Ticker>(ms: u64) {
    // SAFETY: only nginx's thread of this process touches TICK; the event is zeroed, then given
    // a handler, the cycle's log and a data pointer nginx never reads for timers.
    unsafe {
        if TICK.is_null() {
            let ev: Box<ngx_event_t> = Box::new(zeroed());
            TICK = Box::into_raw(ev);
            (*TICK).handler = Some(tick_handler::<T>);
            (*TICK).log = (*ngx::ffi::ngx_cycle).log;
            (*TICK).data = TICK.cast::<c_void>();
            (*TICK).set_cancelable(1);
        }
        if (*TICK).timer_set() != 0 {
            ngx_del_timer(TICK);
        }
        ngx_add_timer(TICK, ms.max(1) as ngx_msec_t);
    }
}

/// Stops the tick timer.
pub fn disarm_tick() {
    // SAFETY: as in `arm_tick`.
    unsafe {
        if !TICK.is_null() && (*TICK).timer_set() != 0 {
            ngx_del_timer(TICK);
        }
    }
}

/// The probes in flight in this process (address, and the function that ends one), so a
/// worker that exits closes their connections first (nginx reports a connection still open at
/// a graceful exit as an `[alert]`).
static IN_FLIGHT: std::sync::Mutex<Vec<InFlight>> = std::sync::Mutex::new(Vec::new());

/// A probe in flight: its address and the function that ends it.
type InFlight = (usize, fn(usize));

fn in_flight() -> std::sync::MutexGuard<'static, Vec<InFlight>> {
    IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner())
}

fn abort_one<D: ProbeDone>(raw: usize) {
    // SAFETY: `raw` was taken out of IN_FLIGHT, where only live, unfinished probes are listed.
    unsafe {
        finish::<D>(
            raw as *mut Probe<D>,
            Outcome::Fail {
                why: Failure::NoResources,
                errno: 0,
                status: 0,
            },
        )
    };
}

/// Ends every probe in flight (the worker exits): their connections are closed, their outcomes
/// reported as not run.
pub fn abort_all() {
    let all = core::mem::take(&mut *in_flight());
    for (raw, end) in all {
        end(raw);
    }
}

/// Where a probe's outcome goes.
pub trait ProbeDone {
    /// What the caller attached to the probe.
    type Token;
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

/// A probe in flight (heap; `c->data` of its connection).
struct Probe<D: ProbeDone> {
    pc: ngx_peer_connection_t,
    name: ngx_str_t,
    spec: ProbeSpec,
    sent: usize,
    connected: bool,
    answer: Vec<u8>,
    token: Option<D::Token>,
}

/// Starts a probe. An immediate failure (connect refused at once, no connection free) is
/// reported through `D::done` before this returns.
pub fn start_probe<D: ProbeDone>(spec: ProbeSpec, token: D::Token) {
    let mut p: Box<Probe<D>> = Box::new(Probe {
        // SAFETY: a zeroed peer connection is nginx's starting state (ngx_memzero in callers).
        pc: unsafe { zeroed() },
        name: ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        },
        spec,
        sent: 0,
        connected: false,
        answer: Vec::new(),
        token: Some(token),
    });
    p.name = ngx_str_t {
        len: p.spec.name.len(),
        data: p.spec.name.as_ptr().cast_mut(),
    };
    let raw = Box::into_raw(p);
    // SAFETY: raw is a live Box (ours until `finish`); the peer connection's pointers (name,
    // sockaddr) point into it and live as long as it; the log is the cycle's.
    unsafe {
        let p = &mut *raw;
        p.pc.sockaddr = p.spec.sockaddr.as_mut_ptr().cast();
        p.pc.socklen = p.spec.sockaddr.len() as _;
        p.pc.name = ptr::addr_of_mut!(p.name);
        p.pc.get = Some(ngx_event_get_peer);
        p.pc.log = (*ngx::ffi::ngx_cycle).log;
        p.pc.set_log_error(ngx::ffi::ngx_connection_log_error_e_NGX_ERROR_INFO);
        p.pc.tries = 1;
        let rc = ngx_event_connect_peer(ptr::addr_of_mut!(p.pc));
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let c = p.pc.connection;
        if c.is_null()
            || rc == ngx::ffi::NGX_ERROR as ngx_int_t
            || rc == ngx::ffi::NGX_BUSY as ngx_int_t
            || rc == ngx::ffi::NGX_DECLINED as ngx_int_t
        {
            let why = if rc == ngx::ffi::NGX_DECLINED as ngx_int_t {
                Failure::Connect
            } else {
                Failure::NoResources
            };
            if !c.is_null() {
                ngx_close_connection(c);
                p.pc.connection = ptr::null_mut();
            }
            finish::<D>(
                raw,
                Outcome::Fail {
                    why,
                    errno,
                    status: 0,
                },
            );
            return;
        }
        (*c).data = raw.cast();
        in_flight().push((raw as usize, abort_one::<D>));
        (*(*c).read).handler = Some(on_read::<D>);
        (*(*c).write).handler = Some(on_write::<D>);
        (*(*c).read).set_cancelable(1);
        (*(*c).write).set_cancelable(1);
        ngx_add_timer((*c).read, p.spec.timeout_ms.max(1) as ngx_msec_t);
        if rc == ngx::ffi::NGX_OK as ngx_int_t {
            on_write::<D>((*c).write);
        }
    }
}

/// Ends the probe: closes its connection (which removes its timers and events), frees it and
/// reports `outcome`.
///
/// # Safety
/// `raw` is a probe made by [`start_probe`] and not finished yet; nothing uses it afterwards.
unsafe fn finish<D: ProbeDone>(raw: *mut Probe<D>, outcome: Outcome) {
    in_flight().retain(|(r, _)| *r != raw as usize);
    // SAFETY: caller.
    let mut p = unsafe { Box::from_raw(raw) };
    if !p.pc.connection.is_null() {
        // SAFETY: the probe's own connection, closed once.
        unsafe { ngx_close_connection(p.pc.connection) };
        p.pc.connection = ptr::null_mut();
    }
    if let Some(t) = p.token.take() {
        D::done(t, outcome);
    }
}

/// The socket's pending error (`SO_ERROR`), 0 when connected.
fn so_error(c: *mut ngx_connection_t) -> i32 {
    let mut err: i32 = 0;
    let mut len = core::mem::size_of::<i32>() as ngx::ffi::socklen_t;
    // SAFETY: c is a live connection (caller); err/len are valid out-parameters.
    let rc = unsafe {
        ngx::ffi::getsockopt(
            (*c).fd,
            ngx::ffi::SOL_SOCKET as i32,
            ngx::ffi::SO_ERROR as i32,
            ptr::addr_of_mut!(err).cast(),
            &mut len,
        )
    };
    if rc == -1 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        err
    }
}

extern "C" fn on_write<D: ProbeDone>(wev: *mut ngx_event_t) {
    // SAFETY: nginx calls the handler with the probe connection's write event; `data` is the
    // connection, whose `data` is the probe (live until `finish`).
    unsafe {
        let c = (*wev).data.cast::<ngx_connection_t>();
        let raw = (*c).data.cast::<Probe<D>>();
        let p = &mut *raw;
        if !p.connected {
            let err = so_error(c);
            if err != 0 {
                finish::<D>(
                    raw,
                    Outcome::Fail {
                        why: Failure::Connect,
                        errno: err,
                        status: 0,
                    },
                );
                return;
            }
            p.connected = true;
            let Some(_) = p.spec.request else {
                finish::<D>(raw, Outcome::Pass { status: 0 });
                return;
            };
        }
        let Some(req) = p.spec.request.as_ref() else {
            return;
        };
        while p.sent < req.len() {
            let Some(send) = (*c).send else {
                finish::<D>(
                    raw,
                    Outcome::Fail {
                        why: Failure::NoResources,
                        errno: 0,
                        status: 0,
                    },
                );
                return;
            };
            let rest = &req[p.sent..];
            let n = send(c, rest.as_ptr().cast_mut(), rest.len());
            if n > 0 {
                p.sent += n as usize;
            } else if n == ngx::ffi::NGX_AGAIN as isize {
                if ngx_handle_write_event(wev, 0) != ngx::ffi::NGX_OK as ngx_int_t {
                    finish::<D>(
                        raw,
                        Outcome::Fail {
                            why: Failure::NoResources,
                            errno: 0,
                            status: 0,
                        },
                    );
                }
                return;
            } else {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                finish::<D>(
                    raw,
                    Outcome::Fail {
                        why: Failure::Io,
                        errno,
                        status: 0,
                    },
                );
                return;
            }
        }
        // Sent: the answer comes through the read event (already registered by the connect).
        if ngx_handle_read_event((*c).read, 0) != ngx::ffi::NGX_OK as ngx_int_t {
            finish::<D>(
                raw,
                Outcome::Fail {
                    why: Failure::NoResources,
                    errno: 0,
                    status: 0,
                },
            );
            return;
        }
        if (*(*c).read).ready() != 0 {
            on_read::<D>((*c).read);
        }
    }
}

extern "C" fn on_read<D: ProbeDone>(rev: *mut ngx_event_t) {
    // SAFETY: as in `on_write`, with the read event.
    unsafe {
        let c = (*rev).data.cast::<ngx_connection_t>();
        let raw = (*c).data.cast::<Probe<D>>();
        let p = &mut *raw;
        if (*rev).timedout() != 0 {
            finish::<D>(
                raw,
                Outcome::Fail {
                    why: Failure::Timeout,
                    errno: 0,
                    status: 0,
                },
            );
            return;
        }
        if !p.connected {
            // Readiness before the write event told us about the connect: the write handler
            // judges it (a failed connect ends the probe there).
            on_write::<D>((*c).write);
            return;
        }
        if p.sent < p.spec.request.as_ref().map_or(0, Vec::len) {
            return; // still writing
        }
        let Some(recv) = (*c).recv else {
            finish::<D>(
                raw,
                Outcome::Fail {
                    why: Failure::NoResources,
                    errno: 0,
                    status: 0,
                },
            );
            return;
        };
        let mut buf = [0u8; 4096];
        loop {
            let room = p
                .spec
                .max_read
                .saturating_sub(p.answer.len())
                .min(buf.len());
            let n = if room == 0 {
                0
            } else {
                recv(c, buf.as_mut_ptr(), room)
            };
            if n > 0 {
                p.answer.extend_from_slice(&buf[..n as usize]);
                let full = p.answer.len() >= p.spec.max_read;
                if let Some(t) = p.token.as_ref() {
                    if let Some(o) = D::judge(t, &p.answer, full) {
                        finish::<D>(raw, o);
                        return;
                    }
                }
                continue;
            }
            if n == 0 {
                let o = p
                    .token
                    .as_ref()
                    .and_then(|t| D::judge(t, &p.answer, true))
                    .unwrap_or(Outcome::Fail {
                        why: Failure::NoAnswer,
                        errno: 0,
                        status: 0,
                    });
                finish::<D>(raw, o);
                return;
            }
            if n == ngx::ffi::NGX_AGAIN as isize {
                if ngx_handle_read_event(rev, 0) != ngx::ffi::NGX_OK as ngx_int_t {
                    finish::<D>(
                        raw,
                        Outcome::Fail {
                            why: Failure::NoResources,
                            errno: 0,
                            status: 0,
                        },
                    );
                }
                return;
            }
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            finish::<D>(
                raw,
                Outcome::Fail {
                    why: Failure::Io,
                    errno,
                    status: 0,
                },
            );
            return;
        }
    }
}
