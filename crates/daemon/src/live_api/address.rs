//! The API's address: `--live-api` parsed ([`LiveApi::parse`]) and shown.

use std::path::PathBuf;

use super::{LiveApi, LiveApiError, Target};

impl LiveApi {
    /// Parses `unix:/abs/path[:/loc/]` or `http://127.0.0.1:PORT/loc/` (also `[::1]` and
    /// `localhost`). The location defaults to `/`.
    pub fn parse(s: &str) -> Result<LiveApi, LiveApiError> {
        let bad = |why: &'static str| LiveApiError::Address {
            given: s.to_string(),
            why,
        };
        let fix_prefix = |p: &str| -> Result<String, LiveApiError> {
            let p = if p.is_empty() { "/" } else { p };
            if !p.starts_with('/') || p.contains(['?', '#', ' ']) {
                return Err(bad("the location must be a path like /api/"));
            }
            Ok(if p.ends_with('/') {
                p.to_string()
            } else {
                format!("{p}/")
            })
        };
        if let Some(rest) = s.strip_prefix("unix:") {
            let (path, loc) = match rest.split_once(":/") {
                Some((p, l)) => (p, format!("/{l}")),
                None => (rest, String::new()),
            };
            if !path.starts_with('/') {
                return Err(bad(
                    "the socket path must be absolute (unix:/run/nginx/api.sock)",
                ));
            }
            return Ok(LiveApi {
                target: Target::Unix(PathBuf::from(path)),
                prefix: fix_prefix(&loc)?,
            });
        }
        let Some(rest) = s.strip_prefix("http://") else {
            return Err(bad(
                "expected unix:/path/to.sock[:/location/] or http://127.0.0.1:PORT/location/",
            ));
        };
        let (authority, loc) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad("no user info in the address"));
        }
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| bad("the address needs a port"))?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("bad port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(bad(
                "only a loopback address (127.0.0.1, [::1], localhost) or a unix socket is \
                 accepted; the API is an admin endpoint of the local nginx",
            ));
        }
        Ok(LiveApi {
            target: Target::Tcp {
                host: host.to_string(),
                port,
            },
            prefix: fix_prefix(loc)?,
        })
    }
}

impl std::fmt::Display for LiveApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            Target::Unix(p) => write!(f, "unix:{}:{}", p.display(), self.prefix),
            Target::Tcp { host, port } if host.contains(':') => {
                write!(f, "http://[{host}]:{port}{}", self.prefix)
            }
            Target::Tcp { host, port } => write!(f, "http://{host}:{port}{}", self.prefix),
        }
    }
}
