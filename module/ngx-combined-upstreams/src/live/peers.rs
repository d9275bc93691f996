//! Every access to nginx's round-robin peer structures (`ngx_http_upstream_rr_peer_t`,
//! `ngx_http_upstream_rr_peers_t`) the live API makes, in one file so that nginx-version
//! conditionals stay in one place.
//!
//! Fields relied on (same layout in nginx 1.22.1 and 1.26.3; 1.27.3+ adds `host`, `zombie`,
//! `refs` to the peer and `config`/`resolve` to the list, none of which this file touches):
//! - peer: `sockaddr`, `socklen`, `name`, `server`, `weight`, `effective_weight`,
//!   `current_weight`, `conns`, `max_conns`, `fails`, `max_fails`, `fail_timeout`, `down`,
//!   `lock` (zone builds), `ssl_session` (NGX_HTTP_SSL or NGX_COMPAT builds: zone copies keep it
//!   in the slab), `next`;
//! - list: `number`, `shpool`, `rwlock`, `total_weight`, `tries`, `single`, `weighted`,
//!   `name`, `next` (the backup list), `peer`.
//!
//! nginx 1.27.3+ (cfg `nginx1_27_3`): the zone module resolves `server NAME resolve` names
//! itself and rewrites the lists from a timer in every worker (`peers->resolve` holds those
//! servers, `peer->host`, `peers->config`), without the live API's gate. An upstream whose
//! configured lists have a `resolve` server is therefore never made live ([`resolves_names`] at
//! configuration time: no wrappers, no zone state, `PUT` answered 409). Peers also carry `refs`
//! (taken by every balancer's `get` with `conns`, dropped by its `free`; nginx frees a `zombie`
//! peer when its last reference goes): a peer is freed by the API only when both `conns` and
//! `refs` are 0 ([`in_use`]). Lists the API creates (the backup list) leave `config` and
//! `resolve` null, which nginx's round robin treats as "no resolver".
//!
//! Other nginx structures the live API reads or writes (stable from 1.22 to 1.30): the slab pool
//! (`mutex`, `min_shift`, `stats`, `pfree`, `start`, `end`, `log_nomem`: `zone.rs`), the peer
//! connection (`get`, `free`, `data`, `set_session`, `save_session`, `tries`, `name`, `sockaddr`,
//! `socklen`: `balancer.rs`), the upstream (`peer`, `shm_zone`, `host`, `srv_conf`) and zone
//! (`init`, `shm.name`, `shm.addr`) configurations (`mod.rs`), modules' `name`/`commands`
//! (`probe.rs`).
//!
//! Memory: every peer of a zone is a slab allocation with its `sockaddr` (size of
//! `ngx_sockaddr_t`), `name.data` (`NGX_SOCKADDR_STRLEN` bytes), `server.data` and, once an SSL
//! session was saved, `ssl_session` as separate slab allocations — the layout
//! `ngx_http_upstream_zone_module` gives the peers it copies, so one [`free_peer_locked`] frees
//! both kinds.

use core::mem::size_of;
use core::ptr;

use ngx::ffi::{
    ngx_http_upstream_rr_peer_t, ngx_http_upstream_rr_peers_t, ngx_rwlock_rlock, ngx_rwlock_unlock,
    ngx_rwlock_wlock, ngx_slab_calloc_locked, ngx_slab_free_locked, ngx_slab_pool_t,
    ngx_sockaddr_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_un,
};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use upstrand_core::live::{Addr, Current, Server};

/// `AF_INET`, `AF_INET6`, `AF_UNIX` as the socket structures store them.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const AF_UNIX: u16 = 1;

/// nginx's `NGX_SOCKADDR_STRLEN` with unix sockets (a macro, not in the bindings):
/// `sizeof("unix:") - 1` + `NGX_UNIX_ADDRSTRLEN` (108 on Linux).
const NGX_SOCKADDR_STRLEN: usize = 5 + 108;

/// Takes the list's read lock.
///
/// # Safety
/// `peers` is a zone list (its `shpool` set).
pub unsafe fn rlock(peers: *mut ngx_http_upstream_rr_peers_t) {
    // SAFETY: the rwlock lives in the zone with the list (caller).
    unsafe { ngx_rwlock_rlock(ptr::addr_of_mut!((*peers).rwlock)) }
}

/// Takes the list's write lock.
///
/// # Safety
/// As [`rlock`].
pub unsafe fn wlock(peers: *mut ngx_http_upstream_rr_peers_t) {
    // SAFETY: as rlock.
    unsafe { ngx_rwlock_wlock(ptr::addr_of_mut!((*peers).rwlock)) }
}

/// Releases the list's lock.
///
/// # Safety
/// As [`rlock`], and the lock is held by this process.
pub unsafe fn unlock(peers: *mut ngx_http_upstream_rr_peers_t) {
    // SAFETY: as rlock.
    unsafe { ngx_rwlock_unlock(ptr::addr_of_mut!((*peers).rwlock)) }
}

/// The slab pool of a zone list (null for a list outside any zone).
///
/// # Safety
/// `peers` is a live list.
pub unsafe fn shpool(peers: *mut ngx_http_upstream_rr_peers_t) -> *mut ngx_slab_pool_t {
    // SAFETY: caller.
    unsafe { (*peers).shpool }
}

/// The backup list (null when there is none).
///
/// # Safety
/// `peers` is a live list.
pub unsafe fn backup(
    peers: *mut ngx_http_upstream_rr_peers_t,
) -> *mut ngx_http_upstream_rr_peers_t {
    // SAFETY: caller.
    unsafe { (*peers).next }
}

/// The peers of a list, in order.
///
/// # Safety
/// `peers` is a live list (null: empty) and its lock is held.
pub unsafe fn list(
    peers: *mut ngx_http_upstream_rr_peers_t,
) -> Vec<*mut ngx_http_upstream_rr_peer_t> {
    let mut v = Vec::new();
    if peers.is_null() {
        return v;
    }
    // SAFETY: the list is stable under its lock (caller); `next` links end with null.
    unsafe {
        let mut p = (*peers).peer;
        while !p.is_null() {
            v.push(p);
            p = (*p).next;
        }
    }
    v
}

/// Run-time figures of one peer.
pub struct PeerState {
    /// `conns`
    pub conns: u64,
    /// `fails`
    pub fails: u64,
}

/// A peer's settings as the pure crate sees them; `None` for an address family the API cannot
/// express.
///
/// # Safety
/// `p` is a live peer and its list's lock is held.
pub unsafe fn current(p: *mut ngx_http_upstream_rr_peer_t, backup: bool) -> Option<Current> {
    // SAFETY: caller.
    unsafe {
        Some(Current {
            addr: read_addr((*p).sockaddr, (*p).socklen)?,
            weight: u32::try_from((*p).weight).unwrap_or(u32::MAX),
            max_fails: u32::try_from((*p).max_fails).unwrap_or(u32::MAX),
            fail_timeout_s: u32::try_from((*p).fail_timeout).unwrap_or(u32::MAX),
            backup,
            down: (*p).down != 0,
        })
    }
}

/// The peer's name (as nginx wrote it) and its run-time figures.
///
/// # Safety
/// As [`current`].
pub unsafe fn name_and_state(p: *mut ngx_http_upstream_rr_peer_t) -> (String, PeerState) {
    // SAFETY: caller; name.data holds name.len bytes.
    unsafe {
        let name = crate::ffi_util::bytes(&(*p).name);
        (
            String::from_utf8_lossy(name).into_owned(),
            PeerState {
                conns: (*p).conns as u64,
                fails: (*p).fails as u64,
            },
        )
    }
}

/// True while a request holds the peer: connections in use (`conns`), and from nginx 1.27.3
/// the peer's references (`refs`).
///
/// # Safety
/// As [`current`].
pub unsafe fn in_use(p: *mut ngx_http_upstream_rr_peer_t) -> bool {
    // SAFETY: caller.
    unsafe {
        #[cfg(nginx1_27_3)]
        if (*p).refs > 0 {
            return true;
        }
        (*p).conns > 0
    }
}

/// True when the upstream's lists (`primary` and its backup list) have servers with the
/// `resolve` parameter (always false before nginx 1.27.3, which has no such parameter).
///
/// # Safety
/// `primary` is null or the round-robin peer list of a round-robin or least_conn upstream
/// (`peer.data` after its `init_upstream`), not changed meanwhile.
pub unsafe fn resolves_names(primary: *mut ngx_http_upstream_rr_peers_t) -> bool {
    #[cfg(nginx1_27_3)]
    // SAFETY: caller; `next` is null or the backup list.
    unsafe {
        if !primary.is_null() {
            let b = (*primary).next;
            return !(*primary).resolve.is_null() || (!b.is_null() && !(*b).resolve.is_null());
        }
    }
    let _ = primary;
    false
}

fn read_addr(sa: *const sockaddr, len: u32) -> Option<Addr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: sa points to a socket address of `len` bytes written by nginx or by this file;
    // the family field comes first in every variant.
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
                let s = &*(sa as *const sockaddr_un);
                let max = (len as usize).saturating_sub(2).min(s.sun_path.len());
                let raw: Vec<u8> = s.sun_path[..max]
                    .iter()
                    .map(|c| *c as u8)
                    .take_while(|c| *c != 0)
                    .collect();
                Some(Addr::Unix(String::from_utf8_lossy(&raw).into_owned()))
            }
            _ => None,
        }
    }
}

/// Writes `addr` into `out` (room for an `ngx_sockaddr_t`); returns the socket length.
///
/// # Safety
/// `out` points to zeroed memory of `size_of::<ngx_sockaddr_t>()` bytes.
unsafe fn write_addr(addr: &Addr, out: *mut u8) -> u32 {
    // SAFETY: every variant fits in ngx_sockaddr_t (a union of them); out is zeroed (caller).
    unsafe {
        match addr {
            Addr::Inet(SocketAddr::V4(a)) => {
                let s = &mut *(out as *mut sockaddr_in);
                s.sin_family = AF_INET;
                s.sin_port = a.port().to_be();
                s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                size_of::<sockaddr_in>() as u32
            }
            Addr::Inet(SocketAddr::V6(a)) => {
                let s = &mut *(out as *mut sockaddr_in6);
                s.sin6_family = AF_INET6;
                s.sin6_port = a.port().to_be();
                s.sin6_addr.__in6_u.__u6_addr8 = a.ip().octets();
                size_of::<sockaddr_in6>() as u32
            }
            Addr::Unix(path) => {
                let s = &mut *(out as *mut sockaddr_un);
                s.sun_family = AF_UNIX;
                for (d, b) in s.sun_path.iter_mut().zip(path.as_bytes()) {
                    *d = *b as _;
                }
                size_of::<sockaddr_un>() as u32
            }
        }
    }
}

/// Allocates a new peer for `s` in the zone, laid out like the zone module's copies.
/// `None` when the zone is full (everything allocated so far is freed again).
///
/// # Safety
/// The slab pool's mutex is held by this process.
pub unsafe fn alloc_peer_locked(
    pool: *mut ngx_slab_pool_t,
    s: &Server,
) -> Option<*mut ngx_http_upstream_rr_peer_t> {
    let name = s.addr.name();
    let name_len = name.len().min(NGX_SOCKADDR_STRLEN);
    // SAFETY: the mutex is held (caller); every allocation is checked before use and freed on
    // failure; the peer is zeroed, so unset fields (lock, conns, fails, next...) start at 0.
    unsafe {
        let p = ngx_slab_calloc_locked(pool, size_of::<ngx_http_upstream_rr_peer_t>())
            .cast::<ngx_http_upstream_rr_peer_t>();
        if p.is_null() {
            return None;
        }
        let sa = ngx_slab_calloc_locked(pool, size_of::<ngx_sockaddr_t>()).cast::<u8>();
        let nm = ngx_slab_calloc_locked(pool, NGX_SOCKADDR_STRLEN).cast::<u8>();
        let sv = ngx_slab_calloc_locked(pool, name_len.max(1)).cast::<u8>();
        if sa.is_null() || nm.is_null() || sv.is_null() {
            for q in [sa, nm, sv] {
                if !q.is_null() {
                    ngx_slab_free_locked(pool, q.cast());
                }
            }
            ngx_slab_free_locked(pool, p.cast());
            return None;
        }
        (*p).socklen = write_addr(&s.addr, sa);
        (*p).sockaddr = sa.cast();
        ptr::copy_nonoverlapping(name.as_ptr(), nm, name_len);
        (*p).name.data = nm;
        (*p).name.len = name_len;
        ptr::copy_nonoverlapping(name.as_ptr(), sv, name_len);
        (*p).server.data = sv;
        (*p).server.len = name_len;
        set_settings(p, s);
        (*p).effective_weight = (*p).weight;
        (*p).current_weight = 0;
        Some(p)
    }
}

/// Applies the settings of `s` to a peer (weights restart when the weight changes).
///
/// # Safety
/// `p` is live and the write locks of its list are held.
pub unsafe fn set_settings(p: *mut ngx_http_upstream_rr_peer_t, s: &Server) {
    // SAFETY: caller.
    unsafe {
        let w = s.weight as isize;
        if (*p).weight != w {
            (*p).weight = w;
            (*p).effective_weight = w;
            (*p).current_weight = 0;
        }
        (*p).max_fails = s.max_fails as usize;
        (*p).fail_timeout = s.fail_timeout_s as _;
        (*p).down = usize::from(s.down);
    }
}

/// Frees a peer and the slab allocations it owns.
///
/// # Safety
/// The slab mutex is held; nobody uses the peer any more (it is in no list and has no
/// connections, and the write locks of every list it was in are held by this process).
pub unsafe fn free_peer_locked(pool: *mut ngx_slab_pool_t, p: *mut ngx_http_upstream_rr_peer_t) {
    // SAFETY: caller; each pointer is a slab allocation of this pool or null.
    unsafe {
        if !(*p).ssl_session.is_null() {
            ngx_slab_free_locked(pool, (*p).ssl_session);
        }
        for q in [(*p).server.data, (*p).name.data, (*p).sockaddr.cast::<u8>()] {
            if !q.is_null() {
                ngx_slab_free_locked(pool, q.cast());
            }
        }
        ngx_slab_free_locked(pool, p.cast());
    }
}

/// Next peer in the retired chain (retired peers are chained through `next`).
///
/// # Safety
/// `p` is live and the retired chain's lock is held.
pub unsafe fn next(p: *mut ngx_http_upstream_rr_peer_t) -> *mut ngx_http_upstream_rr_peer_t {
    // SAFETY: caller.
    unsafe { (*p).next }
}

/// Sets a peer's `next` link.
///
/// # Safety
/// As [`next`].
pub unsafe fn set_next(p: *mut ngx_http_upstream_rr_peer_t, n: *mut ngx_http_upstream_rr_peer_t) {
    // SAFETY: caller.
    unsafe { (*p).next = n }
}

/// A new, empty backup list sharing `primary`'s zone and name.
///
/// # Safety
/// The slab mutex is held.
pub unsafe fn alloc_list_locked(
    pool: *mut ngx_slab_pool_t,
    primary: *mut ngx_http_upstream_rr_peers_t,
) -> Option<*mut ngx_http_upstream_rr_peers_t> {
    // SAFETY: caller; zeroed memory is a valid empty list (rwlock 0: unlocked).
    unsafe {
        let b = ngx_slab_calloc_locked(pool, size_of::<ngx_http_upstream_rr_peers_t>())
            .cast::<ngx_http_upstream_rr_peers_t>();
        if b.is_null() {
            return None;
        }
        (*b).shpool = pool;
        (*b).name = (*primary).name;
        Some(b)
    }
}

/// Links `b` as `primary`'s backup list.
///
/// # Safety
/// The write lock of `primary` is held.
pub unsafe fn set_backup(
    primary: *mut ngx_http_upstream_rr_peers_t,
    b: *mut ngx_http_upstream_rr_peers_t,
) {
    // SAFETY: caller.
    unsafe { (*primary).next = b }
}

/// Replaces the peers of a list and its totals (as `ngx_http_upstream_init_round_robin`
/// computes them).
///
/// # Safety
/// The list's write lock is held; every peer is live and in no other list.
pub unsafe fn set_list(
    peers: *mut ngx_http_upstream_rr_peers_t,
    members: &[*mut ngx_http_upstream_rr_peer_t],
    t: upstrand_core::live::plan::ListTotals,
) {
    // SAFETY: caller.
    unsafe {
        for w in members.windows(2) {
            (*w[0]).next = w[1];
        }
        if let Some(last) = members.last() {
            (**last).next = ptr::null_mut();
        }
        (*peers).peer = members.first().copied().unwrap_or(ptr::null_mut());
        (*peers).number = t.number;
        (*peers).total_weight = t.total_weight as usize;
        (*peers).tries = t.tries;
        (*peers).set_single(u32::from(t.single));
        (*peers).set_weighted(u32::from(t.weighted));
    }
}
