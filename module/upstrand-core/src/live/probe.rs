//! Active health checks of a live upstream (issue 21): the `probe` directive's parameters
//! ([`ProbeConf::parse`]), the request a probe sends, how a probe's answer is judged
//! ([`judge_status_line`], [`Outcome`]) and the per-server health state machine
//! ([`HealthState::record`]). Pure: the module owns the sockets, the timers and the zone; it
//! keeps one [`HealthState`] per server in the zone and calls these functions.

use serde::Serialize;

use super::access::parse_ms;
use crate::ConfError;

/// What a probe does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeType {
    /// `GET uri HTTP/1.0`, judged by the status line (and a body substring when asked).
    Http,
    /// A TCP connect only.
    Tcp,
}

/// The parameters of `probe ...;` in an `upstream {}` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeConf {
    /// `type=http|tcp` (default http).
    pub kind: ProbeType,
    /// `uri=` (default `/`).
    pub uri: String,
    /// `interval=` in ms (default 5 s).
    pub interval_ms: u64,
    /// `timeout=` in ms (default 1 s; at most the interval).
    pub timeout_ms: u64,
    /// `fails=`: consecutive failed probes that make a server unhealthy (default 1).
    pub fails: u64,
    /// `passes=`: consecutive passed probes that make it healthy again (default 1).
    pub passes: u64,
    /// `status=LO-HI` or `status=N`: the statuses that pass (default 200-399).
    pub status: (u16, u16),
    /// `port=`: probe this port instead of the server's.
    pub port: Option<u16>,
    /// `host=`: the `Host` header (default: the upstream's name).
    pub host: Option<String>,
    /// `body=`: a substring the answer's first [`BODY_WINDOW`] bytes must contain.
    pub body: Option<String>,
    /// `mandatory`: a server that is new (start, reload, `PUT`) gets no traffic until it passed.
    pub mandatory: bool,
    /// `slow_start=` in ms (0: off).
    pub slow_start_ms: u64,
}

/// How many bytes of an answer (status line, headers and body) a probe reads at most.
pub const BODY_WINDOW: usize = 16 * 1024;

/// Longest `interval=` (an hour) and shortest (10 ms).
const INTERVAL_RANGE: (u64, u64) = (10, 3_600_000);

fn bad(param: &str, why: &str) -> ConfError {
    ConfError::Probe(format!(
        "invalid parameter \"{param}\" in \"probe\" directive: {why}"
    ))
}

fn count(param: &str, v: &str) -> Result<u64, ConfError> {
    match v.parse::<u64>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err(bad(param, "takes a number from 1 to 1000")),
    }
}

fn status_code(param: &str, v: &str) -> Result<u16, ConfError> {
    match v.parse::<u16>() {
        Ok(n) if (100..=599).contains(&n) => Ok(n),
        _ => Err(bad(
            param,
            "takes a status from 100 to 599 or a range LOW-HIGH",
        )),
    }
}

impl ProbeConf {
    /// Parses the directive's parameters (the words after `probe`).
    pub fn parse(params: &[&str]) -> Result<ProbeConf, ConfError> {
        let mut c = ProbeConf {
            kind: ProbeType::Http,
            uri: "/".into(),
            interval_ms: 5000,
            timeout_ms: 1000,
            fails: 1,
            passes: 1,
            status: (200, 399),
            port: None,
            host: None,
            body: None,
            mandatory: false,
            slow_start_ms: 0,
        };
        let mut seen: Vec<&str> = Vec::new();
        let mut timeout_set = false;
        for &p in params {
            let (key, value) = match p.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (p, None),
            };
            if seen.contains(&key) {
                return Err(bad(p, "given twice"));
            }
            seen.push(key);
            match (key, value) {
                ("mandatory", None) => c.mandatory = true,
                ("type", Some("http")) => c.kind = ProbeType::Http,
                ("type", Some("tcp")) => c.kind = ProbeType::Tcp,
                ("type", Some(_)) => return Err(bad(p, "type takes http or tcp")),
                ("uri", Some(v)) => {
                    if !v.starts_with('/') || v.bytes().any(|b| b <= b' ' || b == 0x7f) {
                        return Err(bad(
                            p,
                            "uri takes a path starting with \"/\", without spaces",
                        ));
                    }
                    c.uri = v.into();
                }
                ("interval", Some(v)) => match parse_ms(v) {
                    Some(ms) if (INTERVAL_RANGE.0..=INTERVAL_RANGE.1).contains(&ms) => {
                        c.interval_ms = ms
                    }
                    _ => return Err(bad(p, "interval takes a time from 10ms to 1h")),
                },
                ("timeout", Some(v)) => match parse_ms(v) {
                    Some(ms) => {
                        c.timeout_ms = ms;
                        timeout_set = true;
                    }
                    None => return Err(bad(p, "timeout takes a time")),
                },
                ("fails", Some(v)) => c.fails = count(p, v)?,
                ("passes", Some(v)) => c.passes = count(p, v)?,
                ("status", Some(v)) => {
                    c.status = match v.split_once('-') {
                        Some((lo, hi)) => (status_code(p, lo)?, status_code(p, hi)?),
                        None => {
                            let n = status_code(p, v)?;
                            (n, n)
                        }
                    };
                    if c.status.0 > c.status.1 {
                        return Err(bad(p, "the range's low end is above its high end"));
                    }
                }
                ("port", Some(v)) => match v.parse::<u16>() {
                    Ok(n) if n > 0 => c.port = Some(n),
                    _ => return Err(bad(p, "port takes a port from 1 to 65535")),
                },
                ("host", Some(v)) => {
                    let ok = !v.is_empty()
                        && v.len() <= 255
                        && v.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b".-_:[]".contains(&b));
                    if !ok {
                        return Err(bad(p, "host takes a host name"));
                    }
                    c.host = Some(v.into());
                }
                ("body", Some(v)) => {
                    if v.is_empty() || v.len() > 256 {
                        return Err(bad(p, "body takes a text of 1 to 256 bytes"));
                    }
                    c.body = Some(v.into());
                }
                ("slow_start", Some(v)) => match parse_ms(v) {
                    Some(ms) if ms <= 3_600_000 => c.slow_start_ms = ms,
                    _ => return Err(bad(p, "slow_start takes a time up to 1h")),
                },
                _ => {
                    return Err(bad(
                        p,
                        "the parameters are uri=, interval=, timeout=, fails=, passes=, status=, \
                         type=http|tcp, port=, host=, body=, mandatory and slow_start=",
                    ))
                }
            }
        }
        if c.kind == ProbeType::Tcp {
            for k in ["uri", "status", "host", "body"] {
                if seen.contains(&k) {
                    return Err(bad(k, "only for type=http"));
                }
            }
        }
        if !timeout_set {
            c.timeout_ms = c.timeout_ms.min(c.interval_ms);
        }
        if c.timeout_ms > c.interval_ms {
            return Err(ConfError::Probe(
                "invalid \"probe\" directive: timeout is longer than interval".into(),
            ));
        }
        Ok(c)
    }

    /// The request an HTTP probe sends; `upstream` is the upstream's name (the default `Host`).
    pub fn request(&self, upstream: &str) -> Vec<u8> {
        let host = self.host.as_deref().unwrap_or(upstream);
        format!(
            "GET {} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: tributary-probe\r\nConnection: close\r\n\r\n",
            self.uri
        )
        .into_bytes()
    }

    /// The upstream-level `probe` object of `GET <loc>/NAME`.
    pub fn view(&self) -> ProbeView {
        ProbeView {
            kind: self.kind,
            interval_ms: self.interval_ms,
            timeout_ms: self.timeout_ms,
            fails: self.fails,
            passes: self.passes,
            uri: (self.kind == ProbeType::Http).then(|| self.uri.clone()),
            status: (self.kind == ProbeType::Http)
                .then(|| format!("{}-{}", self.status.0, self.status.1)),
            port: self.port,
            mandatory: self.mandatory,
            slow_start_ms: self.slow_start_ms,
            owner_pid: 0,
            rounds: 0,
            probes: 0,
        }
    }
}

/// The upstream's probe settings in `GET <loc>/NAME` (`"probe": {...}`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProbeView {
    #[serde(rename = "type")]
    pub kind: ProbeType,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub fails: u64,
    pub passes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    pub mandatory: bool,
    pub slow_start_ms: u64,
    /// pid of the worker probing now (0: none), rounds and probes started since the zone was
    /// made (over all workers); filled in by the module.
    pub owner_pid: u64,
    pub rounds: u64,
    pub probes: u64,
}

/// Why a probe failed (kept in the zone as a code and an errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Failure {
    /// No answer within `timeout`.
    Timeout = 1,
    /// The connection could not be made (errno).
    Connect = 2,
    /// A status outside the range.
    Status = 3,
    /// The body lacked the substring.
    BodyMismatch = 4,
    /// The connection closed before a status line.
    NoAnswer = 5,
    /// Not an HTTP status line.
    BadAnswer = 6,
    /// Sending or reading failed (errno).
    Io = 7,
    /// The worker could not start the probe (no memory or connections).
    NoResources = 8,
}

impl Failure {
    /// From the code kept in the zone (0 and unknown codes: none).
    pub fn from_code(code: u32) -> Option<Failure> {
        use Failure::*;
        [
            Timeout,
            Connect,
            Status,
            BodyMismatch,
            NoAnswer,
            BadAnswer,
            Io,
            NoResources,
        ]
        .into_iter()
        .find(|f| *f as u32 == code)
    }

    /// The text of `last_error` (`errno` for `Connect`/`Io`, `status` for `Status`).
    pub fn text(self, errno: i32, status: u16) -> String {
        match self {
            Failure::Timeout => "timeout".into(),
            Failure::Connect => format!("connect: {}", errno_text(errno)),
            Failure::Status => format!("status {status}"),
            Failure::BodyMismatch => "body mismatch".into(),
            Failure::NoAnswer => "closed without an answer".into(),
            Failure::BadAnswer => "not an HTTP answer".into(),
            Failure::Io => format!("io: {}", errno_text(errno)),
            Failure::NoResources => "probe not started: no memory or connections".into(),
        }
    }
}

/// Short lower-case texts of the errors a connect or read commonly ends with (Linux numbers).
fn errno_text(errno: i32) -> String {
    match errno {
        111 => "connection refused".into(),
        110 => "timed out".into(),
        113 => "no route to host".into(),
        101 => "network unreachable".into(),
        104 => "connection reset".into(),
        32 => "broken pipe".into(),
        99 => "cannot assign requested address".into(),
        0 => "failed".into(),
        n => format!("error {n}"),
    }
}

/// The result of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Passed (the status, for HTTP).
    Pass { status: u16 },
    /// Failed: why, the errno (or 0) and the status when one came.
    Fail {
        why: Failure,
        errno: i32,
        status: u16,
    },
}

/// Judges an HTTP probe's answer from the bytes read so far. `complete`: the peer closed the
/// connection or [`BODY_WINDOW`] bytes were read (no more will come). None: read more.
pub fn judge_answer(conf: &ProbeConf, data: &[u8], complete: bool) -> Option<Outcome> {
    let line_end = data.iter().position(|&b| b == b'\n');
    let Some(end) = line_end else {
        return complete.then_some(Outcome::Fail {
            why: if data.is_empty() {
                Failure::NoAnswer
            } else {
                Failure::BadAnswer
            },
            errno: 0,
            status: 0,
        });
    };
    let Some(status) = judge_status_line(data.get(..end).unwrap_or_default()) else {
        return Some(Outcome::Fail {
            why: Failure::BadAnswer,
            errno: 0,
            status: 0,
        });
    };
    if status < conf.status.0 || status > conf.status.1 {
        return Some(Outcome::Fail {
            why: Failure::Status,
            errno: 0,
            status,
        });
    }
    let Some(want) = conf.body.as_deref() else {
        return Some(Outcome::Pass { status });
    };
    let body_start = find(data, b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| find(data, b"\n\n").map(|i| i + 2));
    if let Some(start) = body_start {
        if find(data.get(start..).unwrap_or_default(), want.as_bytes()).is_some() {
            return Some(Outcome::Pass { status });
        }
    }
    complete.then_some(Outcome::Fail {
        why: Failure::BodyMismatch,
        errno: 0,
        status,
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status of an HTTP status line (`HTTP/1.x NNN ...`, with or without `\r`).
pub fn judge_status_line(line: &[u8]) -> Option<u16> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"HTTP/")?;
    let sp = rest.iter().position(|&b| b == b' ')?;
    let code = rest.get(sp + 1..sp + 4)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if rest.get(sp + 4).is_some_and(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// A server's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Healthy,
    Unhealthy,
    /// `mandatory`: not yet passed its first probe.
    Checking,
}

/// The health state of one server, as kept in the zone (plain data: the module copies it in and
/// out under the zone's health lock). Times are nginx's monotonic `ngx_current_msec`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthState {
    /// 0 healthy, 1 unhealthy, 2 checking.
    pub health: u32,
    /// [`Failure`] code of the last probe (0: it passed or none yet).
    pub last_error: u32,
    /// errno of the last failure (0: none).
    pub last_errno: i32,
    /// HTTP status of the last probe (0: none).
    pub last_status: u32,
    /// Consecutive failed probes now.
    pub fails: u64,
    /// Consecutive passed probes now.
    pub passes: u64,
    /// When the last probe ended (0: none yet).
    pub last_probe_ms: u64,
    /// When the health last changed (0: never).
    pub last_change_ms: u64,
    /// When slow start began (0: not ramping).
    pub slow_start_since_ms: u64,
}

/// What a probe's result changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing the balancers see.
    None,
    /// Out of rotation now (`down::UNHEALTHY`).
    BecameUnhealthy,
    /// Back in rotation (clear `UNHEALTHY` and `CHECKING`).
    BecameHealthy,
}

impl HealthState {
    /// A new server's state: `checking` under `mandatory`, else healthy.
    pub fn new_server(mandatory: bool) -> HealthState {
        HealthState {
            health: if mandatory { 2 } else { 0 },
            ..HealthState::default()
        }
    }

    /// The state of a server a `PUT` added (not one of a new zone's first servers): a new
    /// server's, ramping from `now_ms` under `slow_start=` unless `mandatory` holds it out (its
    /// ramp then begins at its first pass).
    pub fn added(conf: &ProbeConf, now_ms: u64) -> HealthState {
        let mut s = HealthState::new_server(conf.mandatory);
        if conf.slow_start_ms > 0 && !conf.mandatory {
            s.slow_start_since_ms = now_ms.max(1);
        }
        s
    }

    /// While the server ramps up (`slow_start=`): the share of its weight it should get at
    /// `now_ms`, from 0 to 1; None when it does not ramp (not healthy, no ramp, or done).
    pub fn ramp_fraction(&self, conf: &ProbeConf, now_ms: u64) -> Option<f64> {
        if self.health() != Health::Healthy || self.slow_start_since_ms == 0 {
            return None;
        }
        let left = self.slow_start_remaining(conf, now_ms);
        if left == 0 {
            return None;
        }
        let done = conf.slow_start_ms.saturating_sub(left);
        Some(done as f64 / conf.slow_start_ms.max(1) as f64)
    }

    pub fn health(&self) -> Health {
        match self.health {
            1 => Health::Unhealthy,
            2 => Health::Checking,
            _ => Health::Healthy,
        }
    }

    /// Records one probe's outcome at `now_ms`; what changed for the balancers.
    pub fn record(&mut self, conf: &ProbeConf, outcome: Outcome, now_ms: u64) -> Transition {
        self.last_probe_ms = now_ms.max(1);
        match outcome {
            Outcome::Pass { status } => {
                self.last_status = u32::from(status);
                self.last_error = 0;
                self.last_errno = 0;
                self.fails = 0;
                self.passes = self.passes.saturating_add(1);
                let back = match self.health() {
                    Health::Healthy => false,
                    // Plus's semantics: a checking server is in after its first pass.
                    Health::Checking => true,
                    Health::Unhealthy => self.passes >= conf.passes,
                };
                if back {
                    let was = self.health();
                    self.health = 0;
                    self.last_change_ms = now_ms.max(1);
                    if conf.slow_start_ms > 0 && (was == Health::Unhealthy || conf.mandatory) {
                        self.slow_start_since_ms = now_ms.max(1);
                    }
                    return Transition::BecameHealthy;
                }
                Transition::None
            }
            Outcome::Fail { why, errno, status } => {
                self.last_status = u32::from(status);
                self.last_error = why as u32;
                self.last_errno = errno;
                self.passes = 0;
                self.fails = self.fails.saturating_add(1);
                if self.health() == Health::Healthy && self.fails >= conf.fails {
                    self.health = 1;
                    self.last_change_ms = now_ms.max(1);
                    self.slow_start_since_ms = 0;
                    return Transition::BecameUnhealthy;
                }
                Transition::None
            }
        }
    }

    /// `last_error` as text (None when the last probe passed or none ran).
    pub fn error_text(&self) -> Option<String> {
        Failure::from_code(self.last_error).map(|f| {
            f.text(
                self.last_errno,
                u16::try_from(self.last_status).unwrap_or(0),
            )
        })
    }

    /// Milliseconds of slow start left at `now_ms` (0: not ramping).
    pub fn slow_start_remaining(&self, conf: &ProbeConf, now_ms: u64) -> u64 {
        if self.slow_start_since_ms == 0 || conf.slow_start_ms == 0 {
            return 0;
        }
        let end = self.slow_start_since_ms.saturating_add(conf.slow_start_ms);
        end.saturating_sub(now_ms)
    }
}

/// Slow start as time slots: a ramping server is available in a slot when its credit (which
/// grows by `fraction` per slot) reaches 1, so over many slots it is available `fraction` of the
/// time and gets that share of what its weight gives it. Returns whether it is available now.
pub fn ramp_slot(credit: &mut f64, fraction: f64) -> bool {
    *credit += fraction.clamp(0.0, 1.0);
    if *credit >= 1.0 {
        *credit -= 1.0;
        true
    } else {
        false
    }
}

/// The per-server fields of `GET <loc>/NAME` an upstream with a probe adds.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HealthView {
    pub health: Health,
    pub probe_fails: u64,
    pub probe_passes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe_ms_ago: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_start_remaining_ms: Option<u64>,
}

impl HealthState {
    /// This state as `GET` shows it at `now_ms`.
    pub fn view(&self, conf: &ProbeConf, now_ms: u64) -> HealthView {
        HealthView {
            health: self.health(),
            probe_fails: self.fails,
            probe_passes: self.passes,
            last_probe_ms_ago: (self.last_probe_ms != 0)
                .then(|| now_ms.saturating_sub(self.last_probe_ms)),
            last_status: u16::try_from(self.last_status).ok().filter(|s| *s != 0),
            last_error: self.error_text(),
            slow_start_remaining_ms: (conf.slow_start_ms > 0)
                .then(|| self.slow_start_remaining(conf, now_ms)),
        }
    }
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
