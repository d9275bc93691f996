//! Client of the module's live upstreams API (`upstreams_api`, `docs/live-api.md`): list the
//! upstreams that can change live, read a set, replace a set and confirm it by reading it back.
//!
//! The API is reached on a unix socket (`unix:/run/nginx/api.sock`, optionally with the location
//! after a second colon: `unix:/run/nginx/api.sock:/api/`) or on a loopback port
//! (`http://127.0.0.1:8081/api/`). Other hosts are refused: the daemon writes nginx's files on this
//! machine, so its nginx is local, and the API is an admin endpoint. One HTTP/1.1 request per
//! connection (hyper), each bounded by a timeout. Every failure is a [`LiveApiError`] (`error.rs`).

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use upstrand_core::live::render::{ErrorView, ListView, PutView, ServerView, UpstreamView};
use upstrand_core::live::PutBody;

mod address;
mod error;
pub use error::LiveApiError;

/// How long one request to the API may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// How long a read of an upstream's live state for display may take ([`LiveApi::state`]): a page,
/// an API answer or a scrape waits at most this for the module.
pub const READ_TIMEOUT: Duration = Duration::from_millis(800);

/// Where the API answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveApi {
    target: Target,
    /// The location prefix, starting and ending with `/`.
    prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

/// One server as a `PUT` sets it: the module's own type (`upstrand_core::live::ServerSpec`),
/// so the body's field names and the defaults of absent fields are written once for both sides.
pub use upstrand_core::live::ServerSpec as LiveServer;

/// What `GET <loc>/` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The location takes `PUT`s (`upstreams_api write=on;`).
    pub write: bool,
    /// The upstreams the API can change, with their generations.
    pub upstreams: std::collections::HashMap<String, u64>,
}

/// How long the steps of [`LiveApi::replace`] (and [`LiveApi::confirm`]) took.
#[derive(Debug, Clone, Copy)]
pub struct PushTimes {
    /// The `PUT` (sent until answered 200: from then on every worker selects from the new set).
    pub put: Duration,
    /// When the `PUT` was answered: the change is visible.
    pub visible_at: std::time::Instant,
    /// The `GET` that reads the set back for the comparison (zero until it ran).
    pub readback: Duration,
    /// When the read-back found the set equal (the change is confirmed), once it did.
    pub confirmed_at: Option<std::time::Instant>,
    /// The generation after the change: the guard of the next `PUT` of this upstream.
    pub generation: u64,
}

/// A `PUT` the module refused because the upstream's zone has no room (507), with the size it
/// says the zone needs for the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneTooSmall {
    /// About the size the zone needs (bytes).
    pub needed: u64,
    /// The zone's size now (bytes).
    pub zone: u64,
}

impl LiveApi {
    /// What the API's location says about itself and its upstreams (`GET <loc>/`).
    pub async fn probe(&self) -> Result<Listing, LiveApiError> {
        let (status, body) = self.request(Method::GET, &self.prefix, None).await?;
        let list: ListView = parse_answer(status, &body, "GET /")?;
        Ok(Listing {
            write: list.write,
            upstreams: list
                .upstreams
                .into_iter()
                .map(|u| (u.name, u.generation))
                .collect(),
        })
    }

    /// The upstreams the API can change with their generations (`GET <loc>/`); an error when the
    /// location is read-only (its sets cannot be changed).
    pub async fn listing(&self) -> Result<std::collections::HashMap<String, u64>, LiveApiError> {
        let l = self.probe().await?;
        if !l.write {
            return Err(self.read_only());
        }
        Ok(l.upstreams)
    }

    /// Why a read-only location cannot be used, and the fix.
    pub fn read_only(&self) -> LiveApiError {
        LiveApiError::ReadOnly {
            api: self.to_string(),
        }
    }

    /// One upstream's set as the module shows it (`GET <loc>/NAME`).
    pub async fn get(&self, name: &str) -> Result<UpstreamView, LiveApiError> {
        let path = format!("{}{name}", self.prefix);
        let (status, body) = self.request(Method::GET, &path, None).await?;
        parse_answer(status, &body, &format!("GET {name}"))
    }

    /// `GET <loc>/NAME` read as `T`, waiting at most [`READ_TIMEOUT`]: the live state of one
    /// upstream for display (`crate::live_state`). Every failure says why (unreachable, not
    /// answered in time, HTTP status and the module's error, an answer that is not the expected
    /// JSON).
    pub async fn read_set<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<T, LiveApiError> {
        let path = format!("{}{name}", self.prefix);
        let (status, body) = self
            .request_within(READ_TIMEOUT, Method::GET, &path, None)
            .await?;
        parse_answer(status, &body, &format!("GET {name}"))
    }

    /// Replaces the set of `name` guarded by `generation` (from [`Self::listing`]: a reload or
    /// another change since then makes the `PUT` fail with 409). Returns when it was answered
    /// (the change is visible from then on), how long it took and the new generation. Every
    /// failure says which step failed.
    pub async fn replace(
        &self,
        name: &str,
        servers: &[LiveServer],
        generation: u64,
    ) -> Result<PushTimes, LiveApiError> {
        let t0 = std::time::Instant::now();
        let path = format!("{}{name}", self.prefix);
        let body = serde_json::to_vec(&PutBody::new(servers.to_vec(), Some(generation)))
            .map_err(|e| LiveApiError::Encode(e.to_string()))?;
        let (status, answer) = self.request(Method::PUT, &path, Some(body)).await?;
        let put: PutView = parse_answer(status, &answer, &format!("PUT {name}"))?;
        let visible_at = std::time::Instant::now();
        Ok(PushTimes {
            put: visible_at - t0,
            visible_at,
            readback: Duration::ZERO,
            confirmed_at: None,
            generation: put.generation,
        })
    }

    /// Reads the set of `name` back and compares it with `servers` (address, weight, max_fails,
    /// fail_timeout_ms, max_conns, backup, down, drain; order does not matter): only an equal set
    /// counts as applied. Returns the generation read and how long the read took.
    pub async fn confirm(
        &self,
        name: &str,
        servers: &[LiveServer],
    ) -> Result<(u64, Duration), LiveApiError> {
        let t0 = std::time::Instant::now();
        let now = self.get(name).await?;
        if same_set(&now.servers, servers) {
            Ok((now.generation, t0.elapsed()))
        } else {
            Err(LiveApiError::Differs {
                name: name.to_string(),
                got: now.servers.len(),
                expected: servers.len(),
            })
        }
    }

    /// [`Self::replace`], then [`Self::confirm`].
    pub async fn replace_confirmed(
        &self,
        name: &str,
        servers: &[LiveServer],
        generation: u64,
    ) -> Result<PushTimes, LiveApiError> {
        let mut times = self.replace(name, servers, generation).await?;
        let (generation, readback) = self.confirm(name, servers).await?;
        times.generation = generation;
        times.readback = readback;
        times.confirmed_at = Some(std::time::Instant::now());
        Ok(times)
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), LiveApiError> {
        self.request_within(TIMEOUT, method, path, body).await
    }

    async fn request_within(
        &self,
        timeout: Duration,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), LiveApiError> {
        tokio::time::timeout(timeout, self.request_inner(method, path, body))
            .await
            .map_err(|_| LiveApiError::Timeout {
                api: self.to_string(),
                ms: timeout.as_millis(),
            })?
    }

    async fn request_inner(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), LiveApiError> {
        let unreachable = |e: std::io::Error| LiveApiError::Unreachable {
            api: self.to_string(),
            error: e.to_string(),
        };
        let handshake = |e: hyper::Error| LiveApiError::Handshake(e.to_string());
        let (mut sender, host) = match &self.target {
            Target::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(unreachable)?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                    .await
                    .map_err(handshake)?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                (sender, "localhost".to_string())
            }
            Target::Tcp { host, port } => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(unreachable)?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                    .await
                    .map_err(handshake)?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                let h = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                (sender, h)
            }
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, host)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| LiveApiError::Request(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| LiveApiError::Exchange {
                api: self.to_string(),
                error: e.to_string(),
            })?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| LiveApiError::Body(e.to_string()))?
            .to_bytes();
        Ok((status, bytes))
    }
}

fn parse_answer<T: serde::de::DeserializeOwned>(
    status: u16,
    body: &[u8],
    what: &str,
) -> Result<T, LiveApiError> {
    if status != 200 {
        let msg = serde_json::from_slice::<ErrorView>(body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(body).chars().take(200).collect());
        return Err(LiveApiError::Status {
            what: what.to_string(),
            status,
            message: msg.trim().to_string(),
            zone_too_small: (status == 507).then(|| zone_too_small(body)).flatten(),
        });
    }
    serde_json::from_slice(body).map_err(|e| LiveApiError::Answer {
        what: what.to_string(),
        error: e.to_string(),
    })
}

/// The sizes of a 507 answer that names them (a module that does not: `None`).
fn zone_too_small(body: &[u8]) -> Option<ZoneTooSmall> {
    let need = serde_json::from_slice::<ErrorView>(body).ok()?.need?;
    Some(ZoneTooSmall {
        needed: need.needed_bytes,
        zone: need.zone_bytes,
    })
}

/// Whether the set the module shows (`now`) is `wanted`, as sets (the API keeps primary then
/// backup servers, each in its own order), comparing every setting a `PUT` sets.
pub fn same_set(now: &[ServerView], wanted: &[LiveServer]) -> bool {
    let shown = |s: &ServerView| {
        (
            s.backup,
            s.address.clone(),
            s.weight,
            s.max_fails,
            s.fail_timeout_ms,
            s.max_conns,
            s.down,
            s.drain,
        )
    };
    let put = |s: &LiveServer| {
        (
            s.backup,
            s.address.clone(),
            u64::from(s.weight),
            u64::from(s.max_fails),
            s.fail_timeout_ms,
            u64::from(s.max_conns),
            s.down,
            s.drain,
        )
    };
    let mut x: Vec<_> = now.iter().map(shown).collect();
    let mut y: Vec<_> = wanted.iter().map(put).collect();
    x.sort();
    y.sort();
    x == y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_remote_hosts_are_refused() {
        let u = LiveApi::parse("unix:/run/nginx/api.sock").unwrap();
        assert_eq!(u.to_string(), "unix:/run/nginx/api.sock:/");
        let u = LiveApi::parse("unix:/run/nginx/api.sock:/api").unwrap();
        assert_eq!(u.prefix, "/api/");
        let h = LiveApi::parse("http://127.0.0.1:8081/api/").unwrap();
        assert_eq!(h.to_string(), "http://127.0.0.1:8081/api/");
        assert_eq!(
            LiveApi::parse("http://[::1]:8081").unwrap().to_string(),
            "http://[::1]:8081/"
        );
        for bad in [
            "http://10.0.0.1:8081/api/",
            "http://example.com:80/",
            "unix:relative.sock",
            "https://127.0.0.1:1/",
            "http://127.0.0.1/",
            "http://127.0.0.1:0/",
            "http://u:p@127.0.0.1:1/",
        ] {
            let e = LiveApi::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_507_naming_the_size_is_typed() {
        let body = br#"{"error":"zone \"a\" too small: about 123904 bytes needed for this set (zone is 65536)","needed_bytes":123904,"zone_bytes":65536,"per_server_bytes":2832}"#;
        assert_eq!(
            zone_too_small(body),
            Some(ZoneTooSmall {
                needed: 123_904,
                zone: 65_536
            })
        );
        // A module that does not name it: no sizes, the text only.
        assert_eq!(
            zone_too_small(br#"{"error":"zone \"a\" has no room"}"#),
            None
        );
        assert_eq!(zone_too_small(b"not json"), None);
    }

    #[test]
    fn sets_compare_without_order_but_with_every_setting() {
        // What the module shows (its own type, read back) against what was PUT.
        let shown = |s: &LiveServer| -> ServerView {
            let mut v: ServerView = serde_json::from_value(serde_json::json!({
                "address": s.address, "weight": s.weight, "id": 1, "active": 2
            }))
            .unwrap();
            v.down = s.down;
            v.drain = s.drain;
            v.max_conns = u64::from(s.max_conns);
            v
        };
        let a = LiveServer::new("10.0.0.1:80".into(), 1);
        let b = LiveServer::new("10.0.0.2:80".into(), 2);
        let now = [shown(&b), shown(&a)];
        assert!(same_set(&now, &[a.clone(), b.clone()]));
        for change in [
            |s: &mut LiveServer| s.weight = 3,
            |s: &mut LiveServer| s.down = true,
            |s: &mut LiveServer| s.drain = true,
            |s: &mut LiveServer| s.max_conns = 5,
            |s: &mut LiveServer| s.max_fails = 0,
            |s: &mut LiveServer| s.fail_timeout_ms = 1000,
            |s: &mut LiveServer| s.backup = true,
        ] {
            let mut b2 = b.clone();
            change(&mut b2);
            assert!(!same_set(&now, &[a.clone(), b2]), "{b:?}");
        }
        assert!(!same_set(&now, std::slice::from_ref(&a)));
    }
}
