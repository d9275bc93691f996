//! Who may change sets through one `upstreams_api` location: the directive's parameters
//! (`write=on|off`, `host=NAME`, and `retired_warn=TIME|off`, when to warn about a removed server
//! whose connections never end) and the `Host` check of a `PUT`.
//!
//! A location is read-only unless it says `write=on`. With writes on, a `PUT` is taken only when
//! the host it names (`Host`, or the host of an absolute request URI; nginx has already removed
//! the port and lowered the case) is `localhost`, the IP address of the socket that accepted the
//! connection, or a `host=` of the location — or when it came in on a unix socket. A browser
//! that was sent to a loopback port by DNS rebinding names the attacker's host there, so it is
//! refused; `host=*` turns the check off (an API behind a proxy that rewrites `Host`).

use std::net::IpAddr;

use super::ApiError;
use crate::ConfError;

/// The access settings of one `upstreams_api` location (its directive's parameters). The
/// default is read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// `retired_warn=TIME`: a removed server that still has connections this long after its
    /// removal is named once in a `warn` line of the error log (`None`: `off`).
    pub retired_warn_ms: Option<u64>,
    /// `write=on`: `PUT` is allowed.
    pub write: bool,
    /// `host=NAME` values (lower case; IP literals parsed), accepted besides the defaults.
    hosts: Vec<HostName>,
    /// `host=*`: every `Host` is accepted.
    any_host: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostName {
    Ip(IpAddr),
    Name(String),
}

/// `retired_warn` when the directive does not say it: one hour.
pub const DEFAULT_RETIRED_WARN_MS: u64 = 3_600_000;

impl Default for Access {
    fn default() -> Self {
        Access {
            retired_warn_ms: Some(DEFAULT_RETIRED_WARN_MS),
            write: false,
            hosts: Vec::new(),
            any_host: false,
        }
    }
}

/// A time as the directive takes it: `N` (seconds) or `N` followed by `ms`, `s`, `m` or `h`; at
/// least 1 ms.
pub(crate) fn parse_ms(text: &str) -> Option<u64> {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits.parse().ok()?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    (ms > 0).then_some(ms)
}

impl HostName {
    /// A host as nginx leaves it in `headers_in.server` (no port, lower case, no trailing dot;
    /// an IPv6 literal keeps its brackets).
    fn parse(text: &str) -> HostName {
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        match bare.parse::<IpAddr>() {
            Ok(ip) => HostName::Ip(ip.to_canonical()),
            Err(_) => HostName::Name(text.trim_end_matches('.').to_ascii_lowercase()),
        }
    }
}

/// The socket a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// A unix socket: only local users with access to its file reach it.
    Unix,
    /// A TCP socket with this local address.
    Inet(IpAddr),
    /// Its address could not be read.
    Unknown,
}

impl Access {
    /// Parses the directive's parameters (the words after `upstreams_api`).
    pub fn parse(params: &[&str]) -> Result<Access, ConfError> {
        let bad = |p: &str, why: &'static str| ConfError::ApiParameter {
            param: p.to_string(),
            why,
        };
        let mut a = Access::default();
        let mut write_seen = false;
        let mut warn_seen = false;
        for &p in params {
            if let Some(v) = p.strip_prefix("write=") {
                if write_seen {
                    return Err(ConfError::AlreadyDeclared("write"));
                }
                write_seen = true;
                a.write = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(bad(p, "write takes on or off")),
                };
            } else if let Some(v) = p.strip_prefix("host=") {
                if v == "*" {
                    a.any_host = true;
                    continue;
                }
                let h = HostName::parse(v);
                let valid = match &h {
                    HostName::Ip(_) => true,
                    HostName::Name(n) => {
                        !n.is_empty()
                            && n.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                    }
                };
                if !valid {
                    return Err(bad(
                        p,
                        "host takes a host name or an IP address without a port (any port is accepted), or *",
                    ));
                }
                if !a.hosts.contains(&h) {
                    a.hosts.push(h);
                }
            } else if let Some(v) = p.strip_prefix("retired_warn=") {
                if warn_seen {
                    return Err(ConfError::AlreadyDeclared("retired_warn"));
                }
                warn_seen = true;
                a.retired_warn_ms = match v {
                    "off" => None,
                    _ => Some(parse_ms(v).ok_or_else(|| {
                        bad(
                            p,
                            "retired_warn takes a time (such as 500ms, 60s, 10m, 1h; a bare number is seconds) or off",
                        )
                    })?),
                };
            } else {
                return Err(bad(
                    p,
                    "the parameters are write=on|off, host=NAME and retired_warn=TIME|off (after plus, first, for the NGINX Plus-compatible API)",
                ));
            }
        }
        Ok(a)
    }

    /// Checks a `PUT` (only asked when [`Self::write`] is on): `host` is the host the request
    /// names as nginx validated it (`headers_in.server`: no port, lower case; empty when the
    /// request named none), `listener` the socket it came in on. Err: 403 naming the host and
    /// how to allow it.
    pub fn check_host(&self, host: &[u8], listener: Listener) -> Result<(), ApiError> {
        if self.any_host || listener == Listener::Unix {
            return Ok(());
        }
        let text = String::from_utf8_lossy(host);
        if text.is_empty() {
            return Err(ApiError::new(
                403,
                "a PUT must name a Host: localhost or the address it was sent to",
            ));
        }
        let h = HostName::parse(&text);
        let own = match (&h, listener) {
            (HostName::Name(n), _) => n == "localhost",
            (HostName::Ip(ip), Listener::Inet(local)) => *ip == local.to_canonical(),
            (HostName::Ip(_), _) => false,
        };
        if own || self.hosts.contains(&h) {
            return Ok(());
        }
        Err(ApiError::new(
            403,
            format!(
                "Host \"{text}\" is refused for a PUT: send Host localhost or the address the API listens on, or allow that name with \"upstreams_api write=on host={text};\""
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retired_warn_takes_a_time_or_off() {
        let w = |p: &str| Access::parse(&[p]).map(|a| a.retired_warn_ms);
        assert_eq!(
            Access::default().retired_warn_ms,
            Some(DEFAULT_RETIRED_WARN_MS)
        );
        assert_eq!(w("retired_warn=500ms").unwrap(), Some(500));
        assert_eq!(w("retired_warn=90").unwrap(), Some(90_000));
        assert_eq!(w("retired_warn=60s").unwrap(), Some(60_000));
        assert_eq!(w("retired_warn=10m").unwrap(), Some(600_000));
        assert_eq!(w("retired_warn=2h").unwrap(), Some(7_200_000));
        assert_eq!(w("retired_warn=off").unwrap(), None);
        for bad in [
            "retired_warn=",
            "retired_warn=0",
            "retired_warn=1d",
            "retired_warn=-1s",
            "retired_warn=s",
            "retired_warn=99999999999999999999h",
        ] {
            let e = w(bad).unwrap_err().to_string();
            assert!(e.contains("retired_warn takes a time"), "{bad}: {e}");
        }
        let e = Access::parse(&["retired_warn=1s", "retired_warn=off"]).unwrap_err();
        assert_eq!(e, ConfError::AlreadyDeclared("retired_warn"));
    }

    fn inet(s: &str) -> Listener {
        Listener::Inet(s.parse().unwrap())
    }

    #[test]
    fn parameters_parse_and_bad_ones_are_named() {
        assert_eq!(Access::parse(&[]).unwrap(), Access::default());
        assert!(!Access::parse(&[]).unwrap().write);
        assert!(Access::parse(&["write=on"]).unwrap().write);
        assert!(!Access::parse(&["write=off"]).unwrap().write);
        let a = Access::parse(&["write=on", "host=API.Internal.", "host=[::1]"]).unwrap();
        assert_eq!(
            a.hosts,
            vec![
                HostName::Name("api.internal".into()),
                HostName::Ip("::1".parse().unwrap())
            ]
        );
        for (params, text) in [
            (&["write=yes"][..], "invalid parameter \"write=yes\""),
            (
                &["on"][..],
                "write=on|off, host=NAME and retired_warn=TIME|off",
            ),
            (&["write=on", "write=off"][..], "\"write\" has been already"),
            (&["host=a.b:8080"][..], "without a port"),
            (&["host="][..], "without a port"),
        ] {
            let e = Access::parse(params).unwrap_err().to_string();
            assert!(e.contains(text), "{params:?}: {e}");
        }
    }

    #[test]
    fn a_put_is_taken_for_the_listener_localhost_and_unix_sockets_only() {
        let a = Access::parse(&["write=on"]).unwrap();
        for (host, l) in [
            ("localhost", inet("127.0.0.1")),
            ("127.0.0.1", inet("127.0.0.1")),
            ("10.1.2.3", inet("10.1.2.3")),
            ("[::1]", inet("::1")),
            ("127.0.0.1", inet("::ffff:127.0.0.1")),
            ("evil.example", Listener::Unix),
            ("", Listener::Unix),
        ] {
            assert!(a.check_host(host.as_bytes(), l).is_ok(), "{host} {l:?}");
        }
        for (host, l) in [
            ("evil.example", inet("127.0.0.1")),
            ("127.0.0.2", inet("127.0.0.1")),
            ("localhost.evil.example", inet("127.0.0.1")),
            ("127.0.0.1", Listener::Unknown),
        ] {
            let e = a.check_host(host.as_bytes(), l).unwrap_err();
            assert_eq!(e.status, 403, "{host}");
            assert!(e.message.contains(host), "{e}");
            assert!(e.message.contains("host="), "{e}");
        }
        assert_eq!(
            a.check_host(b"", inet("127.0.0.1")).unwrap_err().status,
            403
        );
        let named = Access::parse(&["write=on", "host=api.internal"]).unwrap();
        assert!(named.check_host(b"api.internal", inet("127.0.0.1")).is_ok());
        assert!(named.check_host(b"other", inet("127.0.0.1")).is_err());
        let any = Access::parse(&["write=on", "host=*"]).unwrap();
        assert!(any.check_host(b"anything", inet("127.0.0.1")).is_ok());
    }
}
