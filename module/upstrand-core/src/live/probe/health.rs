//! The per-server health state machine ([`HealthState::record`]), kept in the zone as plain
//! data, what `GET` shows of it ([`HealthView`]), and slow start's time slots ([`ramp_slot`]).

use serde::{Deserialize, Serialize};

use super::{Failure, Outcome, ProbeConf};

/// A server's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// The per-server fields of `GET <loc>/NAME` an upstream with a probe adds. Read back only as a
/// whole: a server whose `health` is absent, or a word this side does not know (a newer module),
/// has none (`ServerView::health` is `None`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HealthView {
    pub health: Health,
    #[serde(default)]
    pub probe_fails: u64,
    #[serde(default)]
    pub probe_passes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_ms_ago: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
