//! Free ports on 127.0.0.1, the one place tests get them from.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};

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
    fn free_tcp_udp_port_is_bindable_for_both() {
        let p = free_tcp_udp_port();
        TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("TCP port should be free");
        UdpSocket::bind((Ipv4Addr::LOCALHOST, p)).expect("UDP port should be free");
    }
}
