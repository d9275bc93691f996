//! From a plugin's raw answer to the canonical list of servers.
//!
//! Rules (spec "From answer to file", 1–2): `address` is an IPv4 address, an IPv6 address without
//! brackets or zone id, or an RFC 1123 host name (≤ 253 characters, no port, scheme, path or space);
//! `port` an integer 1–65535; `weight` absent, `null` or `0` (→ 1) or an integer 1–1000. Everything
//! else is dropped with a reason. Tags and unknown fields are ignored: only address, port and weight
//! ever reach the configuration. Host names are lower-cased; a second target with the same address
//! and port is dropped as a duplicate (the first one wins); the rest is sorted IPv4 (numeric), IPv6
//! (numeric), host names, then port, so the same set always renders the same bytes.

use std::collections::HashSet;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// Longest accepted host name, in characters.
pub const MAX_HOST_LEN: usize = 253;
/// Highest accepted weight.
pub const MAX_WEIGHT: u16 = 1000;

/// A server address. The variant order is the canonical order: IPv4, then IPv6, then host names;
/// within a variant, numeric for addresses and by text for host names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Address {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    /// A valid host name, lower-cased.
    Host(String),
}

impl Address {
    /// Parses an address as a plugin gives it: IPv4, IPv6 without brackets and zone id, or a host
    /// name (lower-cased).
    pub fn parse(s: &str) -> Result<Address, DropReason> {
        if let Ok(v4) = s.parse::<Ipv4Addr>() {
            return Ok(Address::V4(v4));
        }
        if let Ok(v6) = s.parse::<Ipv6Addr>() {
            return Ok(Address::V6(v6));
        }
        if is_host_name(s) {
            return Ok(Address::Host(s.to_ascii_lowercase()));
        }
        Err(DropReason::BadAddress)
    }
}

/// RFC 1123 host name: dot-separated labels of 1–63 letters, digits and `-`, not starting or ending
/// with `-`; at most 253 characters; the last label not all digits (so `10.0.0.256` is no host).
fn is_host_name(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_HOST_LEN {
        return false;
    }
    let labels: Vec<&str> = s.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    labels.iter().all(label_ok)
        && !labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

impl fmt::Display for Address {
    /// The address alone, IPv6 without brackets (as in the plugin protocol).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::V4(a) => write!(f, "{a}"),
            Address::V6(a) => write!(f, "{a}"),
            Address::Host(h) => f.write_str(h),
        }
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Address::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One valid server. `Ord` is the canonical order (address, then port, then weight).
/// Deserializing runs the same checks as [`validate`] (so a stored target cannot bypass them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct Target {
    pub address: Address,
    pub port: u16,
    pub weight: u16,
}

impl Target {
    /// `host:port` as nginx's `server` directive takes it (IPv6 in brackets).
    pub fn host_port(&self) -> String {
        match &self.address {
            Address::V6(a) => format!("[{a}]:{}", self.port),
            other => format!("{other}:{}", self.port),
        }
    }

    /// Validates one raw target (without dedupe).
    pub fn from_json(raw: &Value) -> Result<Target, DropReason> {
        let obj = raw.as_object().ok_or(DropReason::NotAnObject)?;
        let address = match obj.get("address") {
            None | Some(Value::Null) => return Err(DropReason::MissingAddress),
            Some(Value::String(s)) => Address::parse(s)?,
            Some(_) => return Err(DropReason::BadAddress),
        };
        let port = match obj.get("port") {
            None | Some(Value::Null) => return Err(DropReason::MissingPort),
            Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
                (Some(p), _) if (1..=65535).contains(&p) => p as u16,
                (Some(_), _) | (None, Some(_)) => return Err(DropReason::PortOutOfRange),
                (None, None) => return Err(DropReason::PortNotInteger),
            },
            Some(_) => return Err(DropReason::PortNotInteger),
        };
        let weight = match obj.get("weight") {
            None | Some(Value::Null) => 1,
            Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
                (Some(0), _) => 1,
                (Some(w), _) if w <= u64::from(MAX_WEIGHT) => w as u16,
                (Some(_), _) | (None, Some(_)) => return Err(DropReason::WeightOutOfRange),
                (None, None) => return Err(DropReason::WeightNotInteger),
            },
            Some(_) => return Err(DropReason::WeightNotInteger),
        };
        Ok(Target {
            address,
            port,
            weight,
        })
    }
}

impl TryFrom<Value> for Target {
    type Error = DropReason;
    fn try_from(v: Value) -> Result<Target, DropReason> {
        Target::from_json(&v)
    }
}

/// Why a target was dropped. `Display` is the short text shown to the person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum DropReason {
    #[error("not an object")]
    NotAnObject,
    #[error("missing address")]
    MissingAddress,
    #[error("bad address")]
    BadAddress,
    #[error("missing port")]
    MissingPort,
    #[error("port not an integer")]
    PortNotInteger,
    #[error("port out of range")]
    PortOutOfRange,
    #[error("weight not an integer")]
    WeightNotInteger,
    #[error("weight out of range")]
    WeightOutOfRange,
    #[error("duplicate")]
    Duplicate,
}

impl Serialize for DropReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A target that did not make it, as the plugin sent it, with the reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dropped {
    pub target: Value,
    pub reason: DropReason,
}

/// The result of [`validate`]: the canonical servers and what was dropped (in answer order).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Validated {
    pub targets: Vec<Target>,
    pub dropped: Vec<Dropped>,
}

/// Validates a plugin's raw targets: keeps the valid ones in canonical order (host names
/// lower-cased, duplicates by address and port dropped, first one kept) and reports the rest.
/// An empty `targets` means nothing usable: the caller keeps the current file and records a failure.
pub fn validate(raw: &[Value]) -> Validated {
    let mut out = Validated::default();
    let mut seen: HashSet<(Address, u16)> = HashSet::new();
    for item in raw {
        match Target::from_json(item) {
            Ok(t) => {
                if seen.insert((t.address.clone(), t.port)) {
                    out.targets.push(t);
                } else {
                    out.dropped.push(Dropped {
                        target: item.clone(),
                        reason: DropReason::Duplicate,
                    });
                }
            }
            Err(reason) => out.dropped.push(Dropped {
                target: item.clone(),
                reason,
            }),
        }
    }
    out.targets.sort();
    out
}

/// One line for the status: `"2 dropped: port out of range, bad address"`; each distinct reason
/// once, in first-seen order, with `×N` when it occurred N > 1 times. Empty when nothing dropped.
pub fn summarize_dropped(dropped: &[Dropped]) -> String {
    if dropped.is_empty() {
        return String::new();
    }
    let mut reasons: Vec<(DropReason, usize)> = Vec::new();
    for d in dropped {
        match reasons.iter_mut().find(|(r, _)| *r == d.reason) {
            Some((_, n)) => *n += 1,
            None => reasons.push((d.reason, 1)),
        }
    }
    let parts: Vec<String> = reasons
        .iter()
        .map(|(r, n)| {
            if *n > 1 {
                format!("{r} ×{n}")
            } else {
                r.to_string()
            }
        })
        .collect();
    format!("{} dropped: {}", dropped.len(), parts.join(", "))
}
