//! One peer of a zone ([`Peer`]): its address, settings and run-time figures as the live API
//! reads them (raw place reads: other workers' balancers write a peer under their list's read
//! lock), its id (`slow_start`), and the `down` bits a `PUT` sets: safe code on the peer's
//! reads in `peers/mod.rs` (`Peer::fields`, `with_name`, `with_sockaddr`; also its counters,
//! `passive` and the chosen peer). Writes go through `ListsWrite::peer_mut` (`peers/mod.rs`).
//!
//! A peer's `down` holds the reasons it is skipped as bits (`upstrand_core::live::down`): every
//! stock balancer reads it only as "not 0"; `GET` reports the configured bit as `down`, and a
//! `PUT` replaces only the bits it sets, so run-time states survive it.
//!
//! A peer's `slow_start` holds its id (`Peer::id`, the NGINX Plus API's per-peer `id`): a field
//! only NGINX Plus uses (open-source nginx from 1.22 to 1.30 declares it and never reads or writes
//! it; the zone module's copy of a configured peer copies its 0). Ids are given by
//! [`ListsWrite::assign_ids`](super::ListsWrite::assign_ids) when the zone is made and by
//! [`SlabLocked::alloc_peer`](super::SlabLocked::alloc_peer) for a peer a `PUT` adds, from the
//! upstream's counter in the zone (`Shared::next_id`), so the upstream never gives an id twice
//! (until a reload makes a new zone).
//!
//! A peer's `start_time` (also NGINX Plus's alone) holds the address of its statistics
//! counters in the zone (`ffi/counters.rs`), made and freed with the peer.

use core::mem::size_of;
use core::ptr::NonNull;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use ngx::ffi::{ngx_http_upstream_rr_peer_t, sockaddr_in, sockaddr_in6};
use upstrand_core::live::{down, Addr, Current, Server};

use super::{AF_INET, AF_INET6, AF_UNIX};

/// One peer (`ngx_http_upstream_rr_peer_t`) of a zone: a member of a list or a retired peer.
/// Made only from a list under its lock or by
/// [`SlabLocked::alloc_peer`](super::SlabLocked::alloc_peer); used only while it cannot be freed
/// (see `peers/mod.rs` and `peers/write.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Peer(pub(in crate::ffi) NonNull<ngx_http_upstream_rr_peer_t>);

/// Run-time figures of one peer.
pub struct PeerState {
    /// `conns`
    pub conns: u64,
    /// `fails`
    pub fails: u64,
}

impl Peer {
    pub(in crate::ffi) fn raw(self) -> *mut ngx_http_upstream_rr_peer_t {
        self.0.as_ptr()
    }

    /// True when the peer's name (as nginx wrote it) is `n`.
    pub(in crate::ffi) fn has_name(self, n: &[u8]) -> bool {
        self.with_name(|name| name == n)
    }

    /// The peer's address; `None` for an address family the API cannot express.
    fn addr(self) -> Option<Addr> {
        self.with_sockaddr(parse_sockaddr)
    }

    /// The peer's settings as the pure crate sees them; `None` for an address family the API
    /// cannot express. Read under its list's lock or the gate (the settings change only under
    /// the list's write lock).
    pub fn current(self, backup: bool) -> Option<Current> {
        let p = self.fields();
        Some(Current {
            addr: self.addr()?,
            weight: u32::try_from(p.weight).unwrap_or(u32::MAX),
            max_fails: u32::try_from(p.max_fails).unwrap_or(u32::MAX),
            fail_timeout_s: u32::try_from(p.fail_timeout).unwrap_or(u32::MAX),
            max_conns: u32::try_from(p.max_conns).unwrap_or(u32::MAX),
            backup,
            down: p.down & down::CONFIGURED != 0,
            drain: p.down & down::DRAIN != 0,
        })
    }

    /// The peer's name (as nginx wrote it) and its run-time figures (read under its list's read
    /// lock, as nginx's balancers update them under theirs or the peer's lock: a snapshot).
    pub fn name_and_state(self) -> (String, PeerState) {
        let p = self.fields();
        (
            self.with_name(|n| String::from_utf8_lossy(n).into_owned()),
            PeerState {
                conns: p.conns as u64,
                fails: p.fails as u64,
            },
        )
    }

    /// What a probe of this peer needs: its name, its socket address (the `sockaddr` bytes) and
    /// its `down` bits. Read under its list's lock.
    pub fn probe_target(self) -> (String, Vec<u8>, usize) {
        let name = self.with_name(|n| String::from_utf8_lossy(n).into_owned());
        (name, self.with_sockaddr(<[u8]>::to_vec), self.fields().down)
    }

    /// The size of the TLS session nginx stored in the zone for this peer (0: none). Read under
    /// its list's lock (nginx writes it under the peer's lock; a snapshot).
    pub fn ssl_session_len(self) -> u64 {
        let p = self.fields();
        if p.ssl_session.is_null() {
            0
        } else {
            u64::try_from(p.ssl_session_len).unwrap_or(0)
        }
    }

    /// True while a request holds the peer: connections in use (`conns`), and from nginx 1.27.3
    /// the peer's references (`refs`). Read under both list write locks, so no balancer is
    /// between taking and dropping them.
    pub fn in_use(self) -> bool {
        let p = self.fields();
        #[cfg(nginx1_27_3)]
        if p.refs > 0 {
            return true;
        }
        p.conns > 0
    }

    /// The server's id in its zone (kept in the peer's `slow_start`, see the module comment).
    /// Set once, before the peer is in a list.
    #[inline]
    pub fn id(self) -> u64 {
        self.fields().slow_start as u64
    }
}

/// The address in `sa` (a socket address of its length, as nginx keeps them); `None` for an
/// address family the API cannot express. The family comes first in every variant (native
/// order); each variant is read only when `sa` covers it (a unix path up to its end).
fn parse_sockaddr(sa: &[u8]) -> Option<Addr> {
    let at = |r: core::ops::Range<usize>| sa.get(r).unwrap_or_default();
    let family = u16::from_ne_bytes(at(0..2).try_into().ok()?);
    let port = || u16::from_be_bytes(at(2..4).try_into().unwrap_or_default());
    match family {
        AF_INET if sa.len() >= size_of::<sockaddr_in>() => {
            let ip = Ipv4Addr::from(<[u8; 4]>::try_from(at(4..8)).ok()?);
            Some(Addr::Inet(SocketAddr::V4(SocketAddrV4::new(ip, port()))))
        }
        AF_INET6 if sa.len() >= size_of::<sockaddr_in6>() => {
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(at(8..24)).ok()?);
            let scope = u32::from_ne_bytes(at(24..28).try_into().ok()?);
            Some(Addr::Inet(SocketAddr::V6(SocketAddrV6::new(
                ip,
                port(),
                0,
                scope,
            ))))
        }
        AF_UNIX => {
            let path = sa.get(2..).unwrap_or_default();
            let path = &path[..path.len().min(108)];
            let raw: Vec<u8> = path.iter().copied().take_while(|c| *c != 0).collect();
            Some(Addr::Unix(String::from_utf8_lossy(&raw).into_owned()))
        }
        _ => None,
    }
}

/// The `down` bits a `PUT` (or a new peer) sets from the server's fields
/// ([`down::SET_BY_PUT`]).
pub(super) fn put_down_bits(s: &Server) -> usize {
    let mut bits = 0;
    if s.down {
        bits |= down::CONFIGURED;
    }
    if s.drain {
        bits |= down::DRAIN;
    }
    bits
}
