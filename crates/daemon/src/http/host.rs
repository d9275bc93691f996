//! DNS rebinding protection: every request (API, UI, metrics, health) must name this daemon in its
//! `Host` header, else it is refused with 421 before any handler runs.
//!
//! A page on `http://evil.example/` whose name the attacker re-points at 127.0.0.1 talks to the
//! daemon from the browser as a same-origin page, but its requests still say `Host: evil.example`.
//! So the daemon answers only requests whose host (port ignored, one final `.` ignored, case
//! ignored) is:
//! - an IP address: the listen address, or any address when listening on `0.0.0.0` / `::`
//!   (an IP literal cannot be re-pointed);
//! - `localhost` (or a name under `.localhost`) when listening on a loopback or unspecified address;
//! - a name given with `tributary serve --allowed-host NAME` (repeatable), e.g. the name of a
//!   reverse proxy in front of the daemon.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The names and addresses a request's `Host` may carry.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    listen: IpAddr,
    /// `--allowed-host` names, lower-case, without a final `.`.
    names: Vec<String>,
}

/// Why an `--allowed-host` value was refused.
#[derive(Debug, thiserror::Error)]
#[error("--allowed-host {0:?} is not a host name (letters, digits, `-`, `.`; at most 253 characters; no port, scheme or path)")]
pub struct BadAllowedHost(pub String);

impl AllowedHosts {
    /// Checks each name of `names` (host names or IP addresses; no port).
    pub fn new(listen: SocketAddr, names: &[String]) -> Result<AllowedHosts, BadAllowedHost> {
        let mut out = Vec::new();
        for n in names {
            let norm = normalise(n);
            let valid = !norm.is_empty()
                && norm.len() <= 253
                && norm
                    .split('.')
                    .all(|l| !l.is_empty() && l.len() <= 63 && !l.starts_with('-'))
                && norm
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'));
            if !valid {
                return Err(BadAllowedHost(n.clone()));
            }
            out.push(norm);
        }
        Ok(AllowedHosts {
            listen: listen.ip(),
            names: out,
        })
    }

    /// Whether a request with this `Host` value is for this daemon.
    pub fn allows(&self, host: &str) -> bool {
        let name = normalise(strip_port(host));
        if name.is_empty() {
            return false;
        }
        let ip_text = name.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = ip_text.parse::<IpAddr>() {
            return self.listen.is_unspecified() || ip == self.listen;
        }
        if name == "localhost" || name.ends_with(".localhost") {
            return self.listen.is_loopback() || self.listen.is_unspecified();
        }
        self.names.contains(&name)
    }
}

/// Lower-case, without surrounding spaces and one final `.`.
fn normalise(name: &str) -> String {
    let n = name.trim().to_ascii_lowercase();
    n.strip_suffix('.').map(str::to_string).unwrap_or(n)
}

/// `host[:port]` or `[v6][:port]` → the host part.
fn strip_port(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        // One colon: a port. More: a bare IPv6 address (not valid in Host, compared as is).
        Some((h, p)) if !h.contains(':') && p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

/// The middleware: refuses a request whose `Host` (or absolute URI authority) is not allowed.
pub async fn check(State(allowed): State<Arc<AllowedHosts>>, req: Request, next: Next) -> Response {
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        });
    match host {
        Some(h) if allowed.allows(&h) => next.run(req).await,
        other => refuse(req.uri().path(), other.as_deref()),
    }
}

fn refuse(path: &str, host: Option<&str>) -> Response {
    let message = match host {
        Some(h) => {
            let shown: String = h.chars().take(255).collect();
            let name = normalise(strip_port(&shown));
            format!(
                "Host {shown:?} is not this daemon's address: requests for other names are refused (DNS rebinding protection); to reach the daemon by this name, start it with --allowed-host {name}"
            )
        }
        None => "the request has no Host header: refused (DNS rebinding protection)".to_string(),
    };
    if path.starts_with("/api/") {
        super::error::ApiError::new(StatusCode::MISDIRECTED_REQUEST, message, None).into_response()
    } else {
        (
            StatusCode::MISDIRECTED_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            message,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listen: &str, names: &[&str]) -> AllowedHosts {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        AllowedHosts::new(listen.parse().unwrap(), &names).unwrap()
    }

    #[test]
    fn loopback_listener_takes_its_address_and_localhost_only() {
        let h = hosts("127.0.0.1:9180", &[]);
        for ok in [
            "127.0.0.1:9180",
            "127.0.0.1",
            "localhost:9180",
            "LOCALHOST.",
            "app.localhost:1",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9180",
            "127.0.0.2:9180",
            "[::1]:9180",
            "",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
    }

    #[test]
    fn configured_names_and_any_address_on_a_wildcard_listener() {
        let h = hosts("0.0.0.0:9180", &["Tributary.Example.", "10.1.2.3"]);
        for ok in [
            "tributary.example",
            "TRIBUTARY.example:443",
            "10.9.9.9:9180",
            "[2001:db8::1]:9180",
            "localhost",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        assert!(!h.allows("other.example"));
        assert!(!h.allows("sub.tributary.example"));
        let v6 = hosts("[::1]:9180", &[]);
        assert!(v6.allows("[::1]:9180") && v6.allows("localhost"));
        assert!(!v6.allows("127.0.0.1:9180"));
    }

    #[test]
    fn allowed_host_values_are_checked() {
        for bad in ["", "a b", "http://x", "x:80", "x/y", "-x.example", "a..b"] {
            let e = AllowedHosts::new("127.0.0.1:1".parse().unwrap(), &[bad.to_string()]);
            assert!(e.is_err(), "{bad:?}");
        }
    }
}
