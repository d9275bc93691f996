//! How big a zone needs to be for a `PUT` it refused (507): an estimate from the zone's slab
//! figures and the bytes the refused change needed, as `docs/live-api.md` ("Sizing the zone")
//! describes it.
//!
//! What it counts, per new server: the slab allocations a peer takes (the peer structure, its
//! `sockaddr`, its name buffer, its server string, its statistics counters, the `sid` buffer of
//! nginx builds with sticky sessions) and — once a peer of the upstream has a TLS session stored in the zone
//! (`proxy_ssl_session_reuse`, nginx's default for `https` upstreams) — one session of the
//! largest size stored, since every new peer gets one at its first request. Each allocation is
//! rounded as nginx's slab allocator rounds it (a power of two from 8 bytes up to half a page,
//! whole pages above). To the pages in use now (both sets are in the zone while a `PUT` swaps
//! them) it adds those bytes, and turns the pages into a zone size with the zone's own overhead
//! (pool header, size-class table, one page descriptor per page). Not counted: chunks that would
//! fit in partly used pages (so it errs large), and sessions of peers that have none yet.

use super::render::ZoneNeed;

/// The sizes nginx's structures of one peer have in this build (bytes, unrounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLayout {
    /// `ngx_http_upstream_rr_peer_t`
    pub peer: u64,
    /// `ngx_sockaddr_t`
    pub sockaddr: u64,
    /// The name buffer (`NGX_SOCKADDR_STRLEN`).
    pub name_buf: u64,
    /// The `sid` buffer (0: the build has none).
    pub sid: u64,
    /// The peer's statistics counters (the module's slot).
    pub counters: u64,
}

/// A zone's slab figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabShape {
    /// The zone's size (`zone NAME SIZE`).
    pub zone_bytes: u64,
    /// Page size of the slab allocator.
    pub page_size: u64,
    /// Pages the allocator manages.
    pub pages_total: u64,
    /// Pages not handed out.
    pub pages_free: u64,
    /// Size of one page descriptor (`ngx_slab_page_t`).
    pub page_desc_bytes: u64,
}

/// What nginx's slab allocator hands out for a request of `size` bytes (`ngx_slab_alloc`: at
/// least 8 bytes, a power of two up to half a page, whole pages above).
pub fn slab_bytes(size: u64, page: u64) -> u64 {
    let page = page.max(16);
    if size > page / 2 {
        size.div_ceil(page) * page
    } else {
        size.max(8).next_power_of_two()
    }
}

/// Zone bytes one new peer takes: its allocations as the slab rounds them, `server_len` the
/// length of its address string, `tls_session` the TLS session counted for it (0: none).
pub fn peer_bytes(l: &PeerLayout, server_len: u64, tls_session: u64, page: u64) -> u64 {
    let mut b = slab_bytes(l.peer, page)
        + slab_bytes(l.sockaddr, page)
        + slab_bytes(l.name_buf, page)
        + slab_bytes(server_len.max(1), page);
    if l.counters > 0 {
        b += slab_bytes(l.counters, page);
    }
    if l.sid > 0 {
        b += slab_bytes(l.sid, page);
    }
    if tls_session > 0 {
        b += slab_bytes(tls_session, page);
    }
    b
}

/// The estimate for a change adding peers whose address strings have the lengths `new_names`,
/// with `tls_session` bytes of TLS session counted per peer (0: none stored in the zone).
pub fn zone_need(
    shape: &SlabShape,
    layout: &PeerLayout,
    new_names: &[u64],
    tls_session: u64,
) -> ZoneNeed {
    let page = shape.page_size.max(1);
    let change: u64 = new_names
        .iter()
        .map(|n| peer_bytes(layout, *n, tls_session, page))
        .sum();
    let in_use = shape.pages_total.saturating_sub(shape.pages_free) * page;
    let pages = (in_use + change).div_ceil(page);
    let per_page = page + shape.page_desc_bytes;
    let fixed = shape
        .zone_bytes
        .saturating_sub(shape.pages_total * per_page);
    let needed = (fixed + pages * per_page).div_ceil(1024) * 1024;
    let added = new_names.len() as u64;
    ZoneNeed {
        zone_bytes: shape.zone_bytes,
        needed_bytes: needed.max(shape.zone_bytes + 1024),
        in_use_bytes: in_use,
        change_bytes: change,
        servers_added: added,
        per_server_bytes: change.checked_div(added).unwrap_or(0),
        tls_session_bytes: if tls_session > 0 {
            slab_bytes(tls_session, page)
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: PeerLayout = PeerLayout {
        peer: 200,
        sockaddr: 112,
        name_buf: 113,
        sid: 0,
        counters: 120,
    };

    #[test]
    fn slab_rounds_like_nginx() {
        assert_eq!(slab_bytes(1, 4096), 8);
        assert_eq!(slab_bytes(9, 4096), 16);
        assert_eq!(slab_bytes(200, 4096), 256);
        assert_eq!(slab_bytes(2048, 4096), 2048);
        assert_eq!(slab_bytes(2049, 4096), 4096);
        assert_eq!(slab_bytes(4097, 4096), 8192);
    }

    #[test]
    fn a_peer_counts_its_allocations_and_its_tls_session() {
        // 256 + 128 + 128 + 16 for "127.0.0.1:10001" (15 bytes) + 128 of counters.
        assert_eq!(peer_bytes(&LAYOUT, 15, 0, 4096), 656);
        // A 1500-byte session takes a 2048-byte chunk; a 2100-byte one a whole page.
        assert_eq!(peer_bytes(&LAYOUT, 15, 1500, 4096), 656 + 2048);
        assert_eq!(peer_bytes(&LAYOUT, 15, 2100, 4096), 656 + 4096);
        let sid = PeerLayout { sid: 32, ..LAYOUT };
        assert_eq!(peer_bytes(&sid, 15, 0, 4096), 656 + 32);
        // Without counters (a layout that has none) the peer is 128 bytes smaller.
        let bare = PeerLayout {
            counters: 0,
            ..LAYOUT
        };
        assert_eq!(peer_bytes(&bare, 15, 0, 4096), 656 - 128);
    }

    #[test]
    fn the_need_adds_the_change_to_the_pages_in_use_with_the_zone_overhead() {
        // A 64 KiB zone: 14 pages of 4096 with 24-byte descriptors, 12 in use.
        let shape = SlabShape {
            zone_bytes: 65536,
            page_size: 4096,
            pages_total: 14,
            pages_free: 2,
            page_desc_bytes: 24,
        };
        let need = zone_need(&shape, &LAYOUT, &[15; 20], 1500);
        assert_eq!(need.change_bytes, 20 * (656 + 2048));
        assert_eq!(need.per_server_bytes, 656 + 2048);
        assert_eq!(need.tls_session_bytes, 2048);
        assert_eq!(need.in_use_bytes, 12 * 4096);
        // 12 × 4096 + 54080 = 103232 bytes: 26 pages; overhead 65536 − 14 × 4120 = 7856.
        let want = (7856u64 + 26 * 4120).div_ceil(1024) * 1024;
        assert_eq!(need.needed_bytes, want);
        assert!(need.needed_bytes > shape.zone_bytes);
        // Without sessions the same change needs less.
        assert!(zone_need(&shape, &LAYOUT, &[15; 20], 0).needed_bytes < want);
    }

    #[test]
    fn the_need_is_always_more_than_the_zone_that_refused() {
        // A change the figures say would fit (other allocations, fragmentation) still asks
        // for more than the zone has.
        let shape = SlabShape {
            zone_bytes: 65536,
            page_size: 4096,
            pages_total: 14,
            pages_free: 10,
            page_desc_bytes: 24,
        };
        assert!(zone_need(&shape, &LAYOUT, &[15], 0).needed_bytes > 65536);
    }
}
