//! The shortest request of the fixtures: `GET` on a loopback port, answered as `(status, body)`
//! ([`crate::client`] does the HTTP).

use std::io;

/// `GET path` on `127.0.0.1:port` (one connection, `Connection: close`); returns `(status, body)`.
/// Errors (no connection, no HTTP answer) as `io::Error`.
pub fn http_get(port: u16, path: &str) -> io::Result<(u16, String)> {
    let r = crate::client::http_request(port, "GET", path, &[("Host", "127.0.0.1")], b"")
        .map_err(|e| io::Error::other(e.message().unwrap_or("no answer").to_string()))?;
    Ok((r.status, r.text()))
}
