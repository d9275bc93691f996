//! One DNS exchange with one nameserver: UDP first (two tries), TCP when the UDP answer is
//! truncated.

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{timeout, Instant};

use crate::wire::{self, Message};

/// How long one try waits for its answer.
pub const TRY_TIMEOUT: Duration = Duration::from_secs(2);
/// UDP tries before giving up.
pub const UDP_TRIES: u32 = 2;

/// Why an exchange failed. Texts never name the nameserver (a config value).
#[derive(Debug)]
pub enum QueryError {
    Timeout,
    Io(std::io::Error),
    Malformed(String),
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Timeout => write!(
                f,
                "the nameserver did not answer ({UDP_TRIES} tries of {} s)",
                TRY_TIMEOUT.as_secs()
            ),
            QueryError::Io(e) => write!(f, "cannot talk to the nameserver: {e}"),
            QueryError::Malformed(why) => write!(f, "the nameserver's answer is malformed: {why}"),
        }
    }
}

fn random_id() -> u16 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u16
}

/// Whether `m` answers the query `id` for `name`/`qtype`.
fn matches(m: &Message, id: u16, name: &str, qtype: u16) -> bool {
    m.is_response
        && m.id == id
        && m.question
            .as_ref()
            .is_none_or(|(n, t)| *t == qtype && n.eq_ignore_ascii_case(name))
}

/// Asks `server` for the `qtype` records of `name`.
pub async fn query(server: SocketAddr, name: &str, qtype: u16) -> Result<Message, QueryError> {
    let id = random_id();
    let q = wire::build_query(id, name, qtype);
    let bind: SocketAddr = if server.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(bind).await.map_err(QueryError::Io)?;
    sock.connect(server).await.map_err(QueryError::Io)?;
    let mut buf = vec![0u8; 65535];
    for _ in 0..UDP_TRIES {
        sock.send(&q).await.map_err(QueryError::Io)?;
        let deadline = Instant::now() + TRY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let n = match timeout(left, sock.recv(&mut buf)).await {
                Err(_) => break,
                Ok(Err(e)) => return Err(QueryError::Io(e)),
                Ok(Ok(n)) => n,
            };
            // Stray or spoofed datagrams (other ids, other questions) are ignored.
            let Ok(m) = wire::parse(&buf[..n]) else {
                continue;
            };
            if !matches(&m, id, name, qtype) {
                continue;
            }
            if m.truncated {
                return query_tcp(server, name, qtype).await;
            }
            return Ok(m);
        }
    }
    Err(QueryError::Timeout)
}

/// The same question over TCP (two-byte length prefix, RFC 1035 §4.2.2).
pub async fn query_tcp(server: SocketAddr, name: &str, qtype: u16) -> Result<Message, QueryError> {
    let id = random_id();
    let q = wire::build_query(id, name, qtype);
    let exchange = async {
        let mut s = TcpStream::connect(server).await?;
        let mut out = Vec::with_capacity(q.len() + 2);
        out.extend_from_slice(&(q.len() as u16).to_be_bytes());
        out.extend_from_slice(&q);
        s.write_all(&out).await?;
        let len = s.read_u16().await? as usize;
        let mut buf = vec![0u8; len];
        s.read_exact(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = timeout(TRY_TIMEOUT * UDP_TRIES, exchange)
        .await
        .map_err(|_| QueryError::Timeout)?
        .map_err(QueryError::Io)?;
    let m = wire::parse(&buf).map_err(QueryError::Malformed)?;
    if !matches(&m, id, name, qtype) {
        return Err(QueryError::Malformed(
            "the TCP answer is for another question".into(),
        ));
    }
    Ok(m)
}
