//! Active health checks of a live upstream: the `probe` directive's parameters
//! ([`ProbeConf::parse`]), the request a probe sends, how a probe's answer is judged
//! ([`judge_status_line`], [`Outcome`]) and the per-server health state machine
//! ([`HealthState::record`]). Pure: the module owns the sockets, the timers and the zone; it
//! keeps one [`HealthState`] per server in the zone and calls these functions.
//!
//! Files: this one holds the directive's parameters ([`ProbeConf`], [`ProbeView`]); `judge.rs`
//! how an answer is judged ([`judge_answer`], [`Failure`], [`Outcome`]); `health.rs` the
//! per-server state machine ([`HealthState`], [`HealthView`]) and slow start's [`ramp_slot`];
//! `ramp.rs` a worker's book of its ramps ([`RampBook`]).

mod health;
mod judge;
mod ramp;

pub use health::{ramp_slot, Health, HealthState, HealthView, Transition};
pub use judge::{judge_answer, judge_status_line, Failure, Outcome};
pub use ramp::{BitChange, RampBook, SlotPlan};

use serde::{Deserialize, Serialize};

use super::access::parse_ms;
use crate::ConfError;

/// What a probe does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
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
    #[serde(default)]
    pub mandatory: bool,
    #[serde(default)]
    pub slow_start_ms: u64,
    /// pid of the worker probing now (0: none), rounds and probes started since the zone was
    /// made (over all workers); filled in by the module.
    #[serde(default)]
    pub owner_pid: u64,
    #[serde(default)]
    pub rounds: u64,
    #[serde(default)]
    pub probes: u64,
}

#[cfg(test)]
mod tests;
