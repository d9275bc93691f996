//! Free ports on 127.0.0.1, the one place tests get them from: one ([`free_port`]), several at
//! once ([`free_ports`]), one free for TCP and UDP ([`free_tcp_udp_port`]), and a port where
//! nothing listens ([`dead_port`]).

use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Returns a port that was free on 127.0.0.1 a moment ago (bind to port 0, read it, release it).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// A port free for both TCP and UDP on 127.0.0.1 a moment ago (a DNS server listens on both).
pub fn free_tcp_udp_port() -> u16 {
    loop {
        let p = free_port();
        if UdpSocket::bind((Ipv4Addr::LOCALHOST, p)).is_ok() {
            return p;
        }
    }
}

/// `n` distinct free TCP ports on 127.0.0.1 (all listeners are held until every port is picked).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .filter_map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok())
        .collect();
    listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.port())
        .collect()
}

/// A loopback port where nothing listens (a dead server), outside Linux's ephemeral range
/// (32768–60999) from which [`free_port`], [`free_ports`] and other tests' `bind(0)` take their
/// ports, so no concurrently running test can bring it to life.
pub fn dead_port() -> u16 {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let seed = std::process::id() as usize * 7919
        + COUNTER.fetch_add(1, Ordering::Relaxed) * 104_729
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize);
    let mut port = 20_000 + (seed % 12_000) as u16;
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
        port = 20_000 + (port - 20_000 + 1) % 12_000;
    }
    port
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_is_bindable() {
        let p = free_port();
        assert_ne!(p, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("port should be free");
    }

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(10);
        let mut q = p.clone();
        q.sort_unstable();
        q.dedup();
        assert_eq!((p.len(), q.len()), (10, 10));
    }

    #[test]
    fn dead_port_is_below_the_ephemeral_range_and_refuses() {
        let p = dead_port();
        assert!((20_000..32_000).contains(&p), "{p}");
        assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, p)).is_err());
    }

    #[test]
    fn free_tcp_udp_port_is_bindable_for_both() {
        let p = free_tcp_udp_port();
        TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("TCP port should be free");
        UdpSocket::bind((Ipv4Addr::LOCALHOST, p)).expect("UDP port should be free");
    }
}
