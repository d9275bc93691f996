//! The process side of the seam: nginx's process globals (clocks, the running cycle and its
//! log, the process kind, flags and pid, `random()`, global counters looked up by name, the
//! loaded modules) and the process's own events — the `init_process` / `exit_process`
//! trampolines ([`ProcessHooks`]), the worker's tick timer ([`Ticker`], [`arm_tick`]) and
//! non-blocking probe connections ([`connect`]): an `ngx_event_connect_peer`, its read and
//! write handlers, a timer on the read event for the probe's timeout, and [`Conn`], the handle
//! the handlers lend to the probe's safe code.
//!
//! The event handlers are trampolines: they find the probe from the event, call its
//! [`Probing`] step (`prober.rs`, safe code: what to send, when to read, how to judge) and do
//! what the step answers ([`Next`]); ending a probe (closing its connection, freeing it) is
//! here. Nothing blocks a worker.
//!
//! Shutdown: the tick timer and the probes' timers are `cancelable`, so a worker that exits
//! (graceful shutdown, reload) is not kept alive by them; [`exiting`] tells the tick to stop and
//! [`abort_all`] ends the probes still in flight.

use core::ffi::{c_void, CStr};
use core::mem::zeroed;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_close_connection, ngx_conf_t, ngx_connection_t, ngx_cycle_t, ngx_del_timer,
    ngx_event_connect_peer, ngx_event_get_peer, ngx_event_t, ngx_handle_read_event,
    ngx_handle_write_event, ngx_int_t, ngx_log_t, ngx_module_t, ngx_msec_t, ngx_peer_connection_t,
    ngx_str_t,
};
use upstrand_core::live::probe::{Failure, Outcome};

use super::Status;

// ---- globals -------------------------------------------------------------------------------

/// nginx's cached clock in milliseconds (`ngx_current_msec`, the same clock in every worker).
#[inline]
pub fn current_msec() -> u64 {
    // SAFETY: a plain integer global nginx updates on its own thread, which this is.
    unsafe { ngx::ffi::ngx_current_msec as u64 }
}

/// nginx's cached wall clock in milliseconds since the Unix epoch (`ngx_timeofday()`).
#[inline]
pub fn wall_msec() -> u64 {
    // SAFETY: `ngx_cached_time` is a pointer global nginx sets at start and updates on its own
    // thread, which this is; it points at one of its cached time slots.
    unsafe {
        let t = ngx::ffi::ngx_cached_time;
        if t.is_null() {
            return 0;
        }
        ((*t).sec.max(0) as u64)
            .saturating_mul(1000)
            .saturating_add((*t).msec as u64)
    }
}

/// The address of nginx's running configuration (`ngx_cycle`; while a new one is read, still the
/// previous one), compared only.
pub fn running_cycle() -> usize {
    // SAFETY: a plain pointer global nginx sets on its own thread, which this is.
    unsafe { ngx::ffi::ngx_cycle as usize }
}

/// Runs `f` with the running cycle's log (None before nginx set up its cycle).
pub(crate) fn with_cycle_log<T>(f: impl FnOnce(&ngx_log_t) -> T) -> Option<T> {
    // SAFETY: ngx_cycle and its log live as long as the process runs this configuration; only
    // this thread writes through it, and the reference lives only during `f`.
    unsafe { ngx::ffi::ngx_cycle.as_ref().and_then(|c| c.log.as_ref()) }.map(f)
}

/// The running cycle's log, for nginx structures that keep it (timers, peer connections).
fn cycle_log() -> *mut ngx_log_t {
    // SAFETY: as in `with_cycle_log`; only the pointer is read.
    unsafe {
        ngx::ffi::ngx_cycle
            .as_ref()
            .map_or(ptr::null_mut(), |c| c.log)
    }
}

/// A worker (or nginx without a master): not the master, cache manager or loader.
pub fn is_worker() -> bool {
    // SAFETY: a plain integer global nginx sets before it calls `init_process`.
    let p = unsafe { ngx::ffi::ngx_process } as u32;
    p == ngx::ffi::NGX_PROCESS_WORKER || p == ngx::ffi::NGX_PROCESS_SINGLE
}

/// The worker is shutting down (graceful `QUIT` after a reload, or `TERM`).
pub fn exiting() -> bool {
    // SAFETY: plain integer globals nginx sets on its own thread, which this is.
    unsafe { ngx::ffi::ngx_exiting != 0 || ngx::ffi::ngx_terminate != 0 || ngx::ffi::ngx_quit != 0 }
}

/// This process's pid.
pub fn pid() -> u64 {
    // SAFETY: a plain integer global nginx sets at start.
    unsafe { ngx::ffi::ngx_pid as u64 }
}

/// The value of nginx's global counter `name` (a `ngx_atomic_t *` global, such as the stub
/// status module's `ngx_stat_*`), looked up at run time so the module still loads into an nginx
/// built without the module that defines it; None when nginx has no such symbol (or has not
/// set it yet).
pub fn global_counter(name: &CStr) -> Option<u64> {
    // SAFETY: dlsym with RTLD_DEFAULT (null) looks the symbol up in the process (nginx exports
    // its symbols for dynamic modules); the `ngx_stat_*`-style symbols this is called with are
    // nginx's pointer variables, which point at a counter in the shared zone nginx made at
    // start (or are null before that); the counter is read as a plain word, as stub_status
    // reads it.
    unsafe {
        let sym =
            ngx::ffi::dlsym(ptr::null_mut(), name.as_ptr()).cast::<*mut ngx::ffi::ngx_atomic_t>();
        if sym.is_null() {
            return None;
        }
        let p = ptr::read_volatile(sym);
        if p.is_null() {
            return None;
        }
        Some(ptr::read_volatile(p) as u64)
    }
}

/// libc's `random()` (nginx seeds it per worker), for choices nginx's balancers would make the
/// same way.
#[inline]
pub fn random() -> i64 {
    // SAFETY: random() has no preconditions.
    unsafe { ngx::ffi::random() as i64 }
}

/// The module called `name` among those loaded into the configuration being parsed (`cf`).
pub(crate) fn loaded_module(cf: &ngx_conf_t, name: &str) -> Option<&'static ngx_module_t> {
    // SAFETY: cf->cycle->modules is the cycle's null-terminated array of loaded modules (static
    // module objects, or those of loaded .so files, which stay loaded with the cycle) with
    // their names.
    unsafe {
        let cycle = cf.cycle;
        if cycle.is_null() || (*cycle).modules.is_null() {
            return None;
        }
        let mut i = 0;
        loop {
            let m = *(*cycle).modules.add(i);
            if m.is_null() {
                return None;
            }
            if !(*m).name.is_null() && CStr::from_ptr((*m).name).to_bytes() == name.as_bytes() {
                return Some(&*m);
            }
            i += 1;
        }
    }
}

// ---- per-process hooks and the tick timer --------------------------------------------------

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
            (*TICK).log = cycle_log();
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

// ---- probe connections ---------------------------------------------------------------------

/// What a probe's event step asks the trampoline to do next.
pub enum Next {
    /// Wait for the next event.
    Wait,
    /// The probe ended: close its connection, free it, report this.
    Done(Outcome),
    /// Run the read step now (the answer may be there already).
    Read,
    /// Run the write step now (the connect's outcome is known).
    Write,
}

/// A probe's own logic, run by the event trampolines with its connection lent as a [`Conn`].
pub trait Probing: Sized + 'static {
    /// The connection became writable (the connect ended, or room to send).
    fn on_write(&mut self, c: &Conn) -> Next;
    /// The connection became readable (or the probe's timer fired: [`Conn::timed_out`]).
    fn on_read(&mut self, c: &Conn) -> Next;
    /// The probe ended with `outcome` (its connection is closed).
    fn end(&mut self, outcome: Outcome);
}

/// A probe in flight (heap; `c->data` of its connection): nginx's peer connection, the name and
/// address it points at, and the probe's own state.
struct Probe<P: Probing> {
    pc: ngx_peer_connection_t,
    name: ngx_str_t,
    name_text: String,
    sockaddr: Vec<u8>,
    state: P,
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

fn fail(why: Failure, errno: i32) -> Outcome {
    Outcome::Fail {
        why,
        errno,
        status: 0,
    }
}

fn abort_one<P: Probing>(raw: usize) {
    // SAFETY: `raw` was taken out of IN_FLIGHT, where only live, unfinished probes are listed.
    unsafe { finish::<P>(raw as *mut Probe<P>, fail(Failure::NoResources, 0)) };
}

/// Ends every probe in flight (the worker exits): their connections are closed, their outcomes
/// reported as not run.
pub fn abort_all() {
    let all = core::mem::take(&mut *in_flight());
    for (raw, end) in all {
        end(raw);
    }
}

/// Connects to `sockaddr` (socket address bytes as nginx keeps them; `name` for nginx's log
/// lines) without blocking, with a timer of `timeout_ms` on the whole probe; `state`'s steps run
/// on the connection's events. An immediate failure (connect refused at once, no connection
/// free) ends the probe ([`Probing::end`]) before this returns.
pub fn connect<P: Probing>(sockaddr: Vec<u8>, name: String, timeout_ms: u64, state: P) {
    let p: Box<Probe<P>> = Box::new(Probe {
        // SAFETY: a zeroed peer connection is nginx's starting state (ngx_memzero in callers).
        pc: unsafe { zeroed() },
        name: ngx_str_t {
            len: 0,
            data: ptr::null_mut(),
        },
        name_text: name,
        sockaddr,
        state,
    });
    let raw = Box::into_raw(p);
    // SAFETY: raw is a live Box (ours until `finish`); the peer connection's pointers (name,
    // sockaddr) point into it and live as long as it; the log is the cycle's.
    unsafe {
        let p = &mut *raw;
        p.name = super::borrowed(p.name_text.as_bytes());
        p.pc.sockaddr = p.sockaddr.as_mut_ptr().cast();
        p.pc.socklen = p.sockaddr.len() as _;
        p.pc.name = ptr::addr_of_mut!(p.name);
        p.pc.get = Some(ngx_event_get_peer);
        p.pc.log = cycle_log();
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
            finish::<P>(raw, fail(why, errno));
            return;
        }
        (*c).data = raw.cast();
        in_flight().push((raw as usize, abort_one::<P>));
        (*(*c).read).handler = Some(on_read::<P>);
        (*(*c).write).handler = Some(on_write::<P>);
        (*(*c).read).set_cancelable(1);
        (*(*c).write).set_cancelable(1);
        ngx_add_timer((*c).read, timeout_ms.max(1) as ngx_msec_t);
        if rc == ngx::ffi::NGX_OK as ngx_int_t {
            on_write::<P>((*c).write);
        }
    }
}

/// Ends the probe: closes its connection (which removes its timers and events), frees it and
/// reports `outcome`.
///
/// # Safety
/// `raw` is a probe made by [`connect`] and not finished yet; nothing uses it afterwards.
unsafe fn finish<P: Probing>(raw: *mut Probe<P>, outcome: Outcome) {
    in_flight().retain(|(r, _)| *r != raw as usize);
    // SAFETY: caller.
    let mut p = unsafe { Box::from_raw(raw) };
    if !p.pc.connection.is_null() {
        // SAFETY: the probe's own connection, closed once.
        unsafe { ngx_close_connection(p.pc.connection) };
        p.pc.connection = ptr::null_mut();
    }
    p.state.end(outcome);
}

/// The event handlers' common part: runs `step` on the probe of event `ev` (`read`: the
/// connection's read event, else its write event), then what it answers.
///
/// # Safety
/// `ev` is the read or write event of a probe connection made by [`connect`] whose probe is not
/// finished (nginx calls the handlers only then: `finish` closes the connection).
unsafe fn run_step<P: Probing>(ev: *mut ngx_event_t, step: fn(&mut P, &Conn) -> Next) {
    // SAFETY: caller: `data` of the event is the connection, whose `data` is the probe (live
    // until `finish`); the probe is reached only here while the step runs (nginx calls no other
    // handler of this connection from the calls the step makes through `Conn`).
    unsafe {
        let c = (*ev).data.cast::<ngx_connection_t>();
        let Some(conn) = NonNull::new(c).map(Conn) else {
            return;
        };
        let raw = (*c).data.cast::<Probe<P>>();
        match step(&mut (*raw).state, &conn) {
            Next::Wait => {}
            Next::Done(o) => finish::<P>(raw, o),
            Next::Read => on_read::<P>((*c).read),
            Next::Write => on_write::<P>((*c).write),
        }
    }
}

extern "C" fn on_write<P: Probing>(wev: *mut ngx_event_t) {
    // SAFETY: nginx calls the handler with the write event of a probe connection in flight.
    unsafe { run_step::<P>(wev, P::on_write) }
}

extern "C" fn on_read<P: Probing>(rev: *mut ngx_event_t) {
    // SAFETY: nginx calls the handler with the read event of a probe connection in flight.
    unsafe { run_step::<P>(rev, P::on_read) }
}

/// A probe's connection, lent to its [`Probing`] step for the duration of the handler call
/// (made only by the trampolines; not `Copy`, so it cannot outlive the call).
pub struct Conn(NonNull<ngx_connection_t>);

impl Conn {
    fn with<T>(&self, f: impl FnOnce(&ngx_connection_t) -> T) -> T {
        // SAFETY: the probe's live connection (see the type); the reference lives only during
        // `f`, which calls no nginx code.
        f(unsafe { self.0.as_ref() })
    }

    /// The socket's pending error (`SO_ERROR`), 0 when connected.
    pub fn so_error(&self) -> i32 {
        let mut err: i32 = 0;
        let mut len = core::mem::size_of::<i32>() as ngx::ffi::socklen_t;
        let fd = self.with(|c| c.fd);
        // SAFETY: fd is the connection's socket; err/len are valid out-parameters.
        let rc = unsafe {
            ngx::ffi::getsockopt(
                fd,
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

    /// Sends from `data` with the connection's `send`: bytes sent, `NGX_AGAIN` or an error
    /// (None: the connection has no `send`).
    pub fn send(&self, data: &[u8]) -> Option<isize> {
        let send = self.with(|c| c.send)?;
        // SAFETY: nginx's send function of this live connection, reading `data.len()` bytes.
        Some(unsafe { send(self.0.as_ptr(), data.as_ptr().cast_mut(), data.len()) })
    }

    /// Receives into `buf` with the connection's `recv`: bytes read, 0 at the end, `NGX_AGAIN`
    /// or an error (None: the connection has no `recv`).
    pub fn recv(&self, buf: &mut [u8]) -> Option<isize> {
        let recv = self.with(|c| c.recv)?;
        // SAFETY: nginx's recv function of this live connection, writing at most `buf.len()`.
        Some(unsafe { recv(self.0.as_ptr(), buf.as_mut_ptr(), buf.len()) })
    }

    /// True when the connection can receive (it has a `recv`).
    pub fn can_recv(&self) -> bool {
        self.with(|c| c.recv.is_some())
    }

    /// Keeps the write event registered (after `NGX_AGAIN`); false when nginx failed.
    pub fn wait_write(&self) -> bool {
        // SAFETY: the live connection's write event.
        unsafe { ngx_handle_write_event(self.with(|c| c.write), 0) == Status::NGX_OK.0 }
    }

    /// Keeps the read event registered; false when nginx failed.
    pub fn wait_read(&self) -> bool {
        // SAFETY: the live connection's read event.
        unsafe { ngx_handle_read_event(self.with(|c| c.read), 0) == Status::NGX_OK.0 }
    }

    /// True when the read event is ready (data or the end may be there).
    pub fn read_ready(&self) -> bool {
        // SAFETY: the live connection's read event, read by value.
        self.with(|c| unsafe { (*c.read).ready() != 0 })
    }

    /// True when the read event's timer fired (the probe's timeout).
    pub fn timed_out(&self) -> bool {
        // SAFETY: as in `read_ready`.
        self.with(|c| unsafe { (*c.read).timedout() != 0 })
    }
}
