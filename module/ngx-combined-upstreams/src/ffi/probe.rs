//! Which balancer an upstream uses. nginx keeps it only as the `peer.init_upstream` function
//! pointer, and the balancers' functions are `static` in nginx: to learn their addresses the
//! module calls each balancer directive's own handler once per configuration on a scratch
//! upstream (`least_conn;`, `ip_hash;`, `random;`, `hash x;`, `hash x consistent;`,
//! `keepalive 1;`) and records the pointer the handler stores. For `keepalive` the scratch
//! configuration also shows where its private configuration keeps the wrapped balancer's
//! function (the offset of a marker value), so `keepalive` on top of round robin or least_conn is
//! recognised as such.
//!
//! From nginx 1.29.7 (cfg `nginx1_29_7`) `keepalive` no longer replaces `init_upstream`: the
//! directive only stores `max_cached`, and the keepalive module's own `init_main_conf` wraps
//! `peer.init` of every explicit upstream whose `max_cached` is not 0 — which is every upstream
//! without `keepalive 0;`, as keepalive is on by default there (32 connections, `local`). The
//! probe then learns where the keepalive srv conf keeps `max_cached` (the directive's value in a
//! scratch conf preset to `NGX_CONF_UNSET`), and an upstream is `+keepalive` when its
//! `max_cached` is not 0. The module's own `init_main_conf` runs after the keepalive module's
//! (dynamic modules come after the static ones), so the value is final when it classifies.
//!
//! Safe code on `conf/mod.rs` ([`call_directive`] runs a handler on scratch configurations and
//! shows the place of the words it wrote) and `upstream/mod.rs`: [`Balancer::rr_list`] reads
//! `peer.data` as nginx's round-robin list ([`upstream::rr_list`]), which is sound only for the
//! balancers this classification recognises, so only this file makes a [`Balancer`] (its
//! fields are private) and sets `live` only for them.

use ngx::ffi::{
    ngx_conf_t, ngx_http_upstream_init_pt, ngx_http_upstream_init_round_robin,
    ngx_http_upstream_srv_conf_t, ngx_int_t,
};

use super::conf::{call_directive, SrvConfWord};
use super::peers::Peers;
use super::upstream::{self, Upstream};

/// A balancer the live API can change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// Plain round robin (the default).
    RoundRobin,
    /// `least_conn`
    LeastConn,
}

/// Classification of one upstream's balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balancer {
    /// `round_robin`, `least_conn`, `round_robin+keepalive`, `ip_hash`, ... or `unknown`.
    pub name: String,
    /// Set when live changes are possible (only the probe sets it).
    live: Option<Live>,
    /// The upstream classified (set by [`Probes::classify`]).
    up: Option<Upstream>,
}

impl Balancer {
    /// Set when live changes are possible.
    pub fn live(&self) -> Option<Live> {
        self.live
    }

    /// The upstream classified.
    pub fn upstream(&self) -> Option<Upstream> {
        self.up
    }

    /// The upstream's round-robin list (`peer.data`), for a balancer the probe recognised as
    /// keeping one there (round robin, least_conn, with or without keepalive); None otherwise.
    /// In the configuration pool until the zone exists, the zone's list after nginx's zone
    /// `init` ran.
    pub fn rr_list(&self) -> Option<Peers> {
        upstream::rr_list(self)
    }
}

/// The addresses learned for this configuration.
#[derive(Default)]
pub struct Probes {
    known: Vec<(usize, &'static str)>,
    /// (keepalive's `init_upstream`, the keepalive module, byte offset of the wrapped balancer's
    /// `init_upstream` in its srv conf).
    keepalive: Option<(usize, SrvConfWord)>,
    /// nginx >= 1.29.7: where the keepalive module's srv conf keeps `max_cached`.
    #[cfg(nginx1_29_7)]
    max_cached: Option<SrvConfWord>,
}

fn addr(f: ngx_http_upstream_init_pt) -> usize {
    f.map_or(0, |f| f as usize)
}

impl Probes {
    /// Runs the probes against the modules of the configuration being parsed (inside `http {}`).
    pub fn run(cf: &ngx_conf_t) -> Probes {
        let mut p = Probes::default();
        {
            for (module, cmd, args, label) in [
                (
                    "ngx_http_upstream_least_conn_module",
                    c"least_conn",
                    &[][..],
                    "least_conn",
                ),
                (
                    "ngx_http_upstream_ip_hash_module",
                    c"ip_hash",
                    &[][..],
                    "ip_hash",
                ),
                (
                    "ngx_http_upstream_random_module",
                    c"random",
                    &[][..],
                    "random",
                ),
                (
                    "ngx_http_upstream_hash_module",
                    c"hash",
                    &[c"x"][..],
                    "hash",
                ),
                (
                    "ngx_http_upstream_hash_module",
                    c"hash",
                    &[c"x", c"consistent"][..],
                    "hash consistent",
                ),
            ] {
                if let Some(s) = call_directive(cf, module, cmd, args, None, 0) {
                    if s.init != 0 {
                        p.known.push((s.init, label));
                    }
                }
            }
            if let Some(s) = call_directive(
                cf,
                "ngx_http_upstream_keepalive_module",
                c"keepalive",
                &[c"1"],
                Some(probe_marker),
                0,
            ) {
                let marker = probe_marker as *const () as usize;
                let at = s.words().position(|w| w == marker);
                if let (Some(at), true) = (at.and_then(|i| s.written_word(i)), s.init != 0) {
                    p.keepalive = Some((s.init, at));
                }
            }
            #[cfg(nginx1_29_7)]
            {
                // A value no other field of the scratch conf holds: they stay NGX_CONF_UNSET
                // (all bits set), which the directive also needs to see to not say "is duplicate".
                const PROBE: usize = 7;
                if let Some(s) = call_directive(
                    cf,
                    "ngx_http_upstream_keepalive_module",
                    c"keepalive",
                    &[c"7"],
                    None,
                    0xff,
                ) {
                    let mut hits = s.words().enumerate().filter(|(_, w)| *w == PROBE);
                    if let (Some((i, _)), None) = (hits.next(), hits.next()) {
                        p.max_cached = s.written_word(i);
                    }
                }
            }
        }
        p
    }

    /// Classifies an upstream by its `peer.init_upstream`.
    pub fn classify(&self, up: Upstream) -> Balancer {
        Balancer {
            up: Some(up),
            ..self.classify_init(up)
        }
    }

    fn classify_init(&self, up: Upstream) -> Balancer {
        let init = addr(up.init_upstream());
        if let Some((ka, at)) = self.keepalive {
            if let (true, Some(inner)) = (init == ka, up.srv_conf_word(at)) {
                let b = self.plain(inner);
                return Balancer {
                    name: format!("{}+keepalive", b.name),
                    ..b
                };
            }
        }
        #[cfg(nginx1_29_7)]
        if let Some(at) = self.max_cached {
            if up.srv_conf_word(at).is_some_and(|w| w != 0) {
                let b = self.plain(init);
                return Balancer {
                    name: format!("{}+keepalive", b.name),
                    ..b
                };
            }
        }
        self.plain(init)
    }

    fn plain(&self, init: usize) -> Balancer {
        if init == 0 || is_round_robin(init) {
            return Balancer {
                name: "round_robin".into(),
                live: Some(Live::RoundRobin),
                up: None,
            };
        }
        match self.known.iter().find(|(a, _)| *a == init) {
            Some((_, "least_conn")) => Balancer {
                name: "least_conn".into(),
                live: Some(Live::LeastConn),
                up: None,
            },
            Some((_, label)) => Balancer {
                name: (*label).into(),
                live: None,
                up: None,
            },
            None => Balancer {
                name: "unrecognised (third-party or module-made)".into(),
                live: None,
                up: None,
            },
        }
    }
}

// ---- nginx access ------------------------------------------------------------------------

/// A marker init function whose address the keepalive probe looks for.
extern "C" fn probe_marker(
    _cf: *mut ngx_conf_t,
    _us: *mut ngx_http_upstream_srv_conf_t,
) -> ngx_int_t {
    0
}

/// True when `init` (an `init_upstream` address) is nginx's round robin.
fn is_round_robin(init: usize) -> bool {
    init == ngx_http_upstream_init_round_robin as *const () as usize
}
