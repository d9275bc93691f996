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

/// Asks `server` for the `qtype` records of `name`: with EDNS(0) first, and again without it when
/// the server answers FORMERR (a server that does not know OPT records, RFC 6891 §7).
pub async fn query(server: SocketAddr, name: &str, qtype: u16) -> Result<Message, QueryError> {
    let m = query_udp(server, name, qtype, true).await?;
    if m.rcode == wire::RCODE_FORMERR {
        return query_udp(server, name, qtype, false).await;
    }
    Ok(m)
}

async fn query_udp(
    server: SocketAddr,
    name: &str,
    qtype: u16,
    edns: bool,
) -> Result<Message, QueryError> {
    let id = random_id();
    let q = wire::build_query(id, name, qtype, edns);
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
                return query_tcp(server, name, qtype, edns).await;
            }
            return Ok(m);
        }
    }
    Err(QueryError::Timeout)
}

/// The same question over TCP (two-byte length prefix, RFC 1035 §4.2.2).
pub async fn query_tcp(
    server: SocketAddr,
    name: &str,
    qtype: u16,
    edns: bool,
) -> Result<Message, QueryError> {
    let id = random_id();
    let q = wire::build_query(id, name, qtype, edns);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A nameserver from before EDNS: FORMERR for any query with an additional record, else one
    /// A record. Serves `n` queries.
    async fn old_server(n: usize) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            for _ in 0..n {
                let (len, from) = sock.recv_from(&mut buf).await.unwrap();
                let q = &buf[..len];
                let has_opt = q[10] != 0 || q[11] != 0;
                let mut a = q[..12].to_vec();
                a[2] = 0x81; // QR, RD
                a[3] = if has_opt { 0x81 } else { 0x80 }; // RA, rcode FORMERR / NOERROR
                a[10] = 0;
                a[11] = 0; // no additional records
                let question_end = if has_opt { len - 11 } else { len };
                if has_opt {
                    a.extend_from_slice(&q[12..question_end]);
                } else {
                    a[7] = 1; // one answer
                    a.extend_from_slice(&q[12..question_end]);
                    a.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 192, 0, 2, 1]);
                }
                sock.send_to(&a, from).await.unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn falls_back_to_plain_dns_on_formerr() {
        let server = old_server(2).await;
        let m = query(server, "old.example", wire::TYPE_A).await.unwrap();
        assert_eq!(m.rcode, wire::RCODE_NOERROR);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.answers[0].ttl, 9);
        assert_eq!(
            m.answers[0].data,
            wire::RData::A(std::net::Ipv4Addr::new(192, 0, 2, 1))
        );
    }

    #[tokio::test]
    async fn a_silent_server_times_out_and_the_text_names_no_address() {
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let e = query(addr, "x.example", wire::TYPE_A).await.unwrap_err();
        assert!(matches!(e, QueryError::Timeout), "{e}");
        assert!(!e.to_string().contains("127.0.0.1"), "{e}");
    }
}
