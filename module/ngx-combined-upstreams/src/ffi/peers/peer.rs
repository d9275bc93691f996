//! One peer of a zone ([`Peer`]): its address, settings and run-time figures as the live API
//! reads them (raw place reads: other workers' balancers write a peer under their list's read
//! lock), its id and statistics slot (`slow_start`, `start_time`: `ffi/counters.rs`), and the
//! `down` bits a `PUT` sets. Writes go through `ListsWrite::peer_mut` (`peers/mod.rs`).

use core::mem::size_of;
use core::ptr::{self, NonNull};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use ngx::ffi::{
    ngx_http_upstream_rr_peer_t, ngx_str_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_un,
};
use upstrand_core::live::{down, Addr, Current, Server};

use super::{Peers, AF_INET, AF_INET6, AF_UNIX};
use crate::ffi::counters::Counters;

/// One peer (`ngx_http_upstream_rr_peer_t`) of a zone: a member of a list or a retired peer.
/// Made only from a list under its lock or by [`SlabLocked::alloc_peer`]; used only while it
/// cannot be freed (see the module comment).
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
        // SAFETY: p is live (handle); name.data holds name.len bytes in the zone (set once).
        unsafe { crate::ffi::bytes(&(*self.raw()).name) == n }
    }

    /// The peer's address; `None` for an address family the API cannot express.
    fn addr(self) -> Option<Addr> {
        // SAFETY: p is live (handle); its `sockaddr` is null or a socket address of `socklen`
        // bytes written by nginx or by `SlabLocked::alloc_peer` (set once, never changed).
        let (sa, len) = unsafe { ((*self.raw()).sockaddr, (*self.raw()).socklen) };
        if sa.is_null() {
            return None;
        }
        // SAFETY: as above; the family field comes first in every variant, and each variant is
        // read only when `len` covers it (a unix address up to `len`).
        unsafe {
            match (*sa).sa_family {
                AF_INET if len as usize >= size_of::<sockaddr_in>() => {
                    let s = &*(sa as *const sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
                    Some(Addr::Inet(SocketAddr::V4(SocketAddrV4::new(
                        ip,
                        u16::from_be(s.sin_port),
                    ))))
                }
                AF_INET6 if len as usize >= size_of::<sockaddr_in6>() => {
                    let s = &*(sa as *const sockaddr_in6);
                    let ip = Ipv6Addr::from(s.sin6_addr.__in6_u.__u6_addr8);
                    Some(Addr::Inet(SocketAddr::V6(SocketAddrV6::new(
                        ip,
                        u16::from_be(s.sin6_port),
                        0,
                        s.sin6_scope_id,
                    ))))
                }
                AF_UNIX => {
                    let path = ptr::addr_of!((*(sa as *const sockaddr_un)).sun_path).cast::<u8>();
                    let max = (len as usize).saturating_sub(2).min(108);
                    let raw: Vec<u8> = core::slice::from_raw_parts(path, max)
                        .iter()
                        .copied()
                        .take_while(|c| *c != 0)
                        .collect();
                    Some(Addr::Unix(String::from_utf8_lossy(&raw).into_owned()))
                }
                _ => None,
            }
        }
    }

    /// The peer's settings as the pure crate sees them; `None` for an address family the API
    /// cannot express. Read under its list's lock or the gate.
    pub fn current(self, backup: bool) -> Option<Current> {
        // SAFETY: p is live (handle); the settings change only under the list's write lock.
        unsafe {
            let p = self.raw();
            Some(Current {
                addr: self.addr()?,
                weight: u32::try_from((*p).weight).unwrap_or(u32::MAX),
                max_fails: u32::try_from((*p).max_fails).unwrap_or(u32::MAX),
                fail_timeout_s: u32::try_from((*p).fail_timeout).unwrap_or(u32::MAX),
                max_conns: u32::try_from((*p).max_conns).unwrap_or(u32::MAX),
                backup,
                down: (*p).down & down::CONFIGURED != 0,
                drain: (*p).down & down::DRAIN != 0,
            })
        }
    }

    /// The peer's name (as nginx wrote it) and its run-time figures (read under its list's read
    /// lock, as nginx's balancers update them under theirs or the peer's lock: a snapshot).
    pub fn name_and_state(self) -> (String, PeerState) {
        // SAFETY: p is live (handle); name.data holds name.len bytes in the zone.
        unsafe {
            let p = self.raw();
            let name = crate::ffi::bytes(&(*p).name);
            (
                String::from_utf8_lossy(name).into_owned(),
                PeerState {
                    conns: (*p).conns as u64,
                    fails: (*p).fails as u64,
                },
            )
        }
    }

    /// What a probe of this peer needs: its name, its socket address (the `sockaddr` bytes) and
    /// its `down` bits. Read under its list's lock.
    pub fn probe_target(self) -> (String, Vec<u8>, usize) {
        // SAFETY: p is live (handle); `sockaddr` is null or `socklen` bytes (set once).
        unsafe {
            let p = self.raw();
            let sa = if (*p).sockaddr.is_null() {
                Vec::new()
            } else {
                core::slice::from_raw_parts((*p).sockaddr.cast::<u8>(), (*p).socklen as usize)
                    .to_vec()
            };
            let name = String::from_utf8_lossy(crate::ffi::bytes(&(*p).name)).into_owned();
            (name, sa, (*p).down)
        }
    }

    /// The size of the TLS session nginx stored in the zone for this peer (0: none). Read under
    /// its list's lock (nginx writes it under the peer's lock; a snapshot).
    pub fn ssl_session_len(self) -> u64 {
        // SAFETY: p is live (handle).
        unsafe {
            if (*self.raw()).ssl_session.is_null() {
                0
            } else {
                u64::try_from((*self.raw()).ssl_session_len).unwrap_or(0)
            }
        }
    }

    /// True while a request holds the peer: connections in use (`conns`), and from nginx 1.27.3
    /// the peer's references (`refs`). Read under both list write locks, so no balancer is
    /// between taking and dropping them.
    pub fn in_use(self) -> bool {
        // SAFETY: p is live (handle).
        unsafe {
            #[cfg(nginx1_27_3)]
            if (*self.raw()).refs > 0 {
                return true;
            }
            (*self.raw()).conns > 0
        }
    }
}

/// The peer's id and counters fields (`slow_start`, `start_time`; see `ffi/peers/`).
impl Peer {
    /// The peer whose `name` field is at `name`, when the peer's `sockaddr` is `sockaddr`.
    ///
    /// # Safety
    /// `name` is null or `pc->name` right after a successful `get` of nginx's round robin or
    /// least_conn (with or without keepalive) on a list of a zone: those set `pc->name` to the
    /// chosen peer's `&peer->name` and `pc->sockaddr` to its `sockaddr`, and hold the peer
    /// (`conns`) until their `free`.
    pub(crate) unsafe fn chosen(name: *const ngx_str_t, sockaddr: *const sockaddr) -> Option<Peer> {
        if name.is_null() || sockaddr.is_null() {
            return None;
        }
        let off = core::mem::offset_of!(ngx_http_upstream_rr_peer_t, name);
        // SAFETY: caller: `name` is the `name` field of a live peer, so stepping back by its
        // offset gives the peer; its `sockaddr` is read to confirm.
        unsafe {
            let p = name.cast::<u8>().sub(off) as *mut ngx_http_upstream_rr_peer_t;
            if (*p).sockaddr.cast_const() != sockaddr {
                return None;
            }
            NonNull::new(p).map(Peer)
        }
    }

    /// The peer's statistics counters (`start_time` holds their address, see
    /// `ffi/counters.rs`); None for a peer without (the zone was too full to make them).
    #[inline]
    pub fn counters(self) -> Option<Counters> {
        // SAFETY: p is live (handle); the field is written only before the peer is linked (or
        // when the zone is made); it is 0 or a slot of this zone, freed only with the peer.
        unsafe { Counters::from_ptr((*self.raw()).start_time as *mut _) }
    }

    /// `(fails, max_fails)` now (a snapshot: a balancer may be changing `fails`), and whether
    /// its list is `single` (nginx counts no failure then); read while the peer is held.
    pub fn passive(self, list: Peers) -> (u64, u64, bool) {
        // SAFETY: p is live (handle); list is live (handle).
        unsafe {
            let p = self.raw();
            (
                (*p).fails as u64,
                (*p).max_fails as u64,
                (*list.raw()).single() != 0,
            )
        }
    }

    /// The server's id in its zone (kept in the peer's `slow_start`, see the module comment).
    /// Set once, before the peer is in a list.
    pub fn id(self) -> u64 {
        // SAFETY: p is live (handle); the field is written only before the peer is linked.
        unsafe { (*self.raw()).slow_start as u64 }
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
