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

use core::mem::size_of;

use ngx::ffi::{ngx_conf_t, ngx_http_upstream_init_pt, ngx_module_t};

use crate::ffi::upstream::{find_module, is_round_robin, probe_directive as call, Upstream};

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
    /// Set when live changes are possible.
    pub live: Option<Live>,
}

/// The addresses learned for this configuration.
#[derive(Default)]
pub struct Probes {
    known: Vec<(usize, &'static str)>,
    /// (keepalive's `init_upstream`, the keepalive module, byte offset of the wrapped balancer's
    /// `init_upstream` in its srv conf).
    keepalive: Option<(usize, &'static ngx_module_t, usize)>,
    /// nginx >= 1.29.7: (the keepalive module, byte offset of `max_cached` in its srv conf).
    #[cfg(nginx1_29_7)]
    max_cached: Option<(&'static ngx_module_t, usize)>,
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
                if let Some((init, _)) = call(cf, module, cmd, args, None, 0) {
                    if init != 0 {
                        p.known.push((init, label));
                    }
                }
            }
            if let Some((init, conf)) = call(
                cf,
                "ngx_http_upstream_keepalive_module",
                c"keepalive",
                &[c"1"],
                Some(crate::ffi::upstream::probe_marker),
                0,
            ) {
                let words = conf.len() / size_of::<usize>();
                let off = (0..words).find(|i| {
                    usize::from_ne_bytes(
                        conf[i * size_of::<usize>()..(i + 1) * size_of::<usize>()]
                            .try_into()
                            .unwrap_or_default(),
                    ) == crate::ffi::upstream::probe_marker as *const () as usize
                });
                if let (Some(off), true) = (off, init != 0) {
                    if let Some(m) = find_module(cf, "ngx_http_upstream_keepalive_module") {
                        p.keepalive = Some((init, m, off * size_of::<usize>()));
                    }
                }
            }
            #[cfg(nginx1_29_7)]
            {
                // A value no other field of the scratch conf holds: they stay NGX_CONF_UNSET
                // (all bits set), which the directive also needs to see to not say "is duplicate".
                const PROBE: usize = 7;
                if let Some((_, conf)) = call(
                    cf,
                    "ngx_http_upstream_keepalive_module",
                    c"keepalive",
                    &[c"7"],
                    None,
                    0xff,
                ) {
                    let words: Vec<usize> = conf
                        .chunks_exact(size_of::<usize>())
                        .map(|w| usize::from_ne_bytes(w.try_into().unwrap_or_default()))
                        .collect();
                    let mut hits = words.iter().enumerate().filter(|(_, w)| **w == PROBE);
                    if let (Some((off, _)), None) = (hits.next(), hits.next()) {
                        if let Some(m) = find_module(cf, "ngx_http_upstream_keepalive_module") {
                            p.max_cached = Some((m, off * size_of::<usize>()));
                        }
                    }
                }
            }
        }
        p
    }

    /// Classifies an upstream by its `peer.init_upstream`.
    pub fn classify(&self, up: Upstream) -> Balancer {
        let init = addr(up.init_upstream());
        if let Some((ka, m, off)) = self.keepalive {
            if let (true, Some(inner)) = (init == ka, up.srv_conf_word(m, off)) {
                let b = self.plain(inner);
                return Balancer {
                    name: format!("{}+keepalive", b.name),
                    live: b.live,
                };
            }
        }
        #[cfg(nginx1_29_7)]
        if let Some((m, off)) = self.max_cached {
            if up.srv_conf_word(m, off).is_some_and(|w| w != 0) {
                let b = self.plain(init);
                return Balancer {
                    name: format!("{}+keepalive", b.name),
                    live: b.live,
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
            };
        }
        match self.known.iter().find(|(a, _)| *a == init) {
            Some((_, "least_conn")) => Balancer {
                name: "least_conn".into(),
                live: Some(Live::LeastConn),
            },
            Some((_, label)) => Balancer {
                name: (*label).into(),
                live: None,
            },
            None => Balancer {
                name: "unrecognised (third-party or module-made)".into(),
                live: None,
            },
        }
    }
}
