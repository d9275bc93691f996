//! What a request says, as safe code on the handle's views of `mod.rs` (`Req::string`,
//! `Req::upstream`): its method, status, URI, host and arguments, who produced the answer,
//! the figures of the current try ([`TryEnd::of`]), and the `error_page` bit.

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_http_request_t, ngx_http_upstream_conf_t, ngx_list_part_t, ngx_list_t, ngx_msec_t,
    ngx_str_t, ngx_uint_t, NGX_HTTP_LOCK, NGX_HTTP_PATCH, NGX_HTTP_POST,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use upstrand_core::live::Listener;
use upstrand_core::upstrand::status::Origin;

use super::{Req, UpstreamConf};
use crate::ffi::counters::TryEnd;
use crate::ffi::{borrowed, pool};

impl Req {
    /// The main configuration of module `M` of the request (the cycle's).
    #[inline]
    pub fn main_conf<M: HttpModuleMainConf>(self) -> Option<&'static M::MainConf> {
        self.get(M::main_conf)
    }

    /// The location configuration of module `M` of the request.
    #[inline]
    pub fn loc_conf<M: HttpModuleLocationConf>(self) -> Option<&'static M::LocationConf> {
        self.get(M::location_conf)
    }

    /// Copies `data` into the request's pool (shared by the request tree).
    #[inline]
    pub fn copy(self, data: &[u8]) -> Option<ngx_str_t> {
        pool::copy_str(&self.pool(), data)
    }

    /// The request method (`NGX_HTTP_GET`, ...).
    pub fn method(self) -> u32 {
        self.get(|r| r.method as u32)
    }

    /// POST, LOCK or PATCH (nginx's non-idempotent methods).
    pub fn non_idempotent_method(self) -> bool {
        self.get(|r| r.method & (NGX_HTTP_POST | NGX_HTTP_LOCK | NGX_HTTP_PATCH) as ngx_uint_t != 0)
    }

    /// `Content-Length` of the request (-1 when absent).
    pub fn content_length(self) -> i64 {
        self.get(|r| r.headers_in.content_length_n)
    }

    /// The status of the header being sent.
    pub fn status(self) -> u16 {
        self.get(|r| u16::try_from(r.headers_out.status).unwrap_or(0))
    }

    /// A copy of the request's URI.
    pub fn uri(self) -> Vec<u8> {
        self.string(|r| &r.uri, <[u8]>::to_vec)
    }

    /// The URI after the location's prefix (`/#` when it does not start with it).
    pub fn rest_of_uri(self) -> Vec<u8> {
        let Some(clcf) = self.loc_conf::<NgxHttpCoreModule>() else {
            return b"/#".to_vec();
        };
        let loc = self.string(|_| &clcf.name, <[u8]>::to_vec);
        let loc = loc.strip_prefix(b"=").unwrap_or(&loc);
        let loc = loc.strip_suffix(b"/").unwrap_or(loc);
        self.string(
            |r| &r.uri,
            |uri| uri.strip_prefix(loc).unwrap_or(b"/#").to_vec(),
        )
    }

    /// The host the request names, as nginx validated it (`headers_in.server`: from `Host` or
    /// an absolute URI, without port, in lower case; empty when it names none).
    pub fn host(self) -> Vec<u8> {
        self.string(|r| &r.headers_in.server, <[u8]>::to_vec)
    }

    /// The request's arguments (pointing into the tree's pool, for nginx calls).
    pub fn args(self) -> ngx_str_t {
        self.get(|r| r.args)
    }

    /// True when the query string has the argument `name` (without value).
    pub fn has_arg(self, name: &[u8]) -> bool {
        self.string(|r| &r.args, |a| a.split(|b| *b == b'&').any(|a| a == name))
    }

    /// Who produced the answer being sent: nginx itself (`error`/`timeout` words) when the
    /// request has no upstream, when no status line came, or when nginx finalised the request
    /// with an error status of its own (`ngx_http_special_response_handler` sets `err_status`)
    /// — also after the backend sent a status line and then failed or timed out before the
    /// header ended.
    pub fn origin(self) -> Origin {
        let status_n = self.upstream(|u| u.u.headers_in.status_n).unwrap_or(0);
        if status_n == 0 || self.get(|r| r.err_status) != 0 {
            Origin::Generated
        } else {
            Origin::Backend
        }
    }

    /// When nginx first contacted an upstream for this request (`peer.start_time`, ms), if it did.
    pub fn upstream_start_time(self) -> Option<u64> {
        let t = self.upstream(|u| u.u.peer.start_time).unwrap_or(0);
        (t != 0).then_some(t as u64)
    }

    /// `proxy_next_upstream_tries` (and the like) of the request's upstream (0: no limit, or
    /// no upstream).
    pub fn next_upstream_tries(self) -> ngx_uint_t {
        self.upstream(|u| u.conf.map_or(0, |c| c.next_upstream_tries))
            .unwrap_or(0)
    }

    /// The socket the request came in on (from Linux's `sockaddr_un`, `sockaddr_in` and
    /// `sockaddr_in6` layouts: the family in native order, then the port and address).
    pub fn listener(self) -> Listener {
        self.local_sockaddr(|sa| match u16::from_ne_bytes(at(sa, 0)?) {
            1 => Some(Listener::Unix),
            2 if sa.len() >= 16 => Some(Listener::Inet(at::<4>(sa, 4)?.into())),
            10 if sa.len() >= 28 => Some(Listener::Inet(at::<16>(sa, 8)?.into())),
            _ => None,
        })
        .flatten()
        .unwrap_or(Listener::Unknown)
    }

    /// Replaces the request's upstream configuration through `f` (in `peer.init`, before nginx
    /// reads it); nothing happens without an upstream. `f` calls no nginx code and returns a
    /// configuration that lives as long as the cycle.
    pub fn map_upstream_conf(self, f: impl FnOnce(UpstreamConf) -> *mut ngx_http_upstream_conf_t) {
        self.upstream(|v| {
            if let Some(conf) = NonNull::new(v.u.conf) {
                v.u.conf = f(UpstreamConf(conf));
            }
        });
    }

    /// Clears the upstream's `out_bufs` when it does not buffer (`proxy_buffering off`): what
    /// a swallowed answer had queued is dropped too.
    pub fn drop_unbuffered_output(self) {
        self.upstream(|v| {
            if v.u.buffering() == 0 {
                v.u.out_bufs = ptr::null_mut();
            }
        });
    }

    /// Makes `src`'s response headers this request's (a struct copy whose header lists are
    /// re-pointed at this request's copy) and clears this request's error status.
    pub fn take_headers_out(self, src: Req) {
        let (h, parts) = src.get(|s| {
            let ho = &s.headers_out;
            (
                *ho,
                [&ho.headers.part, &ho.trailers.part].map(|p| p as *const _),
            )
        });
        self.get_mut(|r| {
            r.headers_out = h;
            fix_last(&mut r.headers_out.headers, parts[0]);
            fix_last(&mut r.headers_out.trailers, parts[1]);
            r.err_status = 0;
        });
    }

    /// Sets the response header of an `application/json` answer of `len` bytes.
    pub(super) fn set_json_header(self, status: u16, len: usize) {
        self.get_mut(|r| {
            let ho = &mut r.headers_out;
            ho.status = status as usize;
            ho.content_length_n = len as i64;
            ho.content_type = borrowed(b"application/json");
            ho.content_type_len = ho.content_type.len;
        });
    }

    /// Keeps `error_page` from applying to the request.
    pub fn set_error_page(self) {
        self.get_mut(set_error_page);
    }
}

impl TryEnd {
    /// The figures of `r`'s current try (zeros without an upstream state).
    pub fn of(r: Req) -> TryEnd {
        r.upstream(|u| {
            let st = u.state?;
            Some(TryEnd {
                status: st.status as u64,
                header_ms: (st.header_time != ngx_msec_t::MAX).then_some(st.header_time as u64),
                response_ms: crate::ffi::current_msec().saturating_sub(u.u.start_time as u64),
                sent: st.bytes_sent.max(0) as u64,
                received: st.bytes_received.max(0) as u64,
            })
        })
        .flatten()
        .unwrap_or_default()
    }
}

/// Re-points `l.last` at `l`'s own first part when it still points at `src_part`, the first
/// part of the list `l` is a struct copy of.
pub(super) fn fix_last(l: &mut ngx_list_t, src_part: *const ngx_list_part_t) {
    if ptr::eq(l.last, src_part) {
        l.last = &mut l.part;
    }
}

/// The `N` bytes of `sa` from `from` on.
fn at<const N: usize>(sa: &[u8], from: usize) -> Option<[u8; N]> {
    sa.get(from..from + N)?.try_into().ok()
}

/// Sets `r->error_page` (the request then ignores the location's `error_page` redirects).
///
/// nginx 1.29.3 put `in_port_t port` right before the request's bit fields, so they start two bytes
/// past a 4-byte boundary. C moves `uri_changes:4` to the next 32-bit unit rather than let it
/// straddle one; bindgen 0.72 (nginx-sys 0.5) does not, so from `uri_changes` on its setters are
/// two bits low, and `set_error_page` would set `reading_body` (nginx then closes the keep-alive
/// connection after the answer). From 1.29.3 on the bit is set where C has it: two above the one
/// bindgen's own setter uses (`error_page_bit` in `mod.rs`). Checked against nginx 1.30 by
/// `scripts/test-nginx-versions.sh`.
fn set_error_page(r: &mut ngx_http_request_t) {
    #[cfg(not(nginx1_29_3))]
    r.set_error_page(1);
    // The bit index lies inside `_bitfield_1` (error_page is followed by more than two bits of
    // the same unit).
    #[cfg(nginx1_29_3)]
    r._bitfield_1.set_bit(super::error_page_bit() + 2, true);
}
