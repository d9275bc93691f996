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
//! Part of the FFI layer: [`Balancer::rr_list`] reads `peer.data` as nginx's round-robin list,
//! which is sound only for the balancers this classification recognises, so only it makes a
//! [`Balancer`] that says so.

use core::mem::size_of;

use ngx::ffi::{ngx_conf_t, ngx_http_upstream_init_pt, ngx_module_t};

use core::ffi::{c_char, c_void, CStr};
use core::mem::zeroed;
use core::ptr;

use ngx::ffi::{
    ngx_array_t, ngx_command_t, ngx_http_conf_ctx_t, ngx_http_upstream_init_round_robin,
    ngx_http_upstream_module, ngx_http_upstream_srv_conf_t, ngx_int_t, ngx_str_t,
};

use super::borrowed;
use super::peers::Peers;
use super::upstream::Upstream;

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
        let up = self.up?;
        self.live?;
        // SAFETY: for these balancers peer.data is the round-robin list their init_upstream
        // made (nginx's zone init re-points it at the zone's copy), alive as long as the
        // configuration.
        unsafe { Peers::from_ptr(up.peer_data().cast()) }
    }
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
                Some(probe_marker),
                0,
            ) {
                let words = conf.len() / size_of::<usize>();
                let off = (0..words).find(|i| {
                    usize::from_ne_bytes(
                        conf[i * size_of::<usize>()..(i + 1) * size_of::<usize>()]
                            .try_into()
                            .unwrap_or_default(),
                    ) == probe_marker as *const () as usize
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
        Balancer {
            up: Some(up),
            ..self.classify_init(up)
        }
    }

    fn classify_init(&self, up: Upstream) -> Balancer {
        let init = addr(up.init_upstream());
        if let Some((ka, m, off)) = self.keepalive {
            if let (true, Some(inner)) = (init == ka, up.srv_conf_word(m, off)) {
                let b = self.plain(inner);
                return Balancer {
                    name: format!("{}+keepalive", b.name),
                    ..b
                };
            }
        }
        #[cfg(nginx1_29_7)]
        if let Some((m, off)) = self.max_cached {
            if up.srv_conf_word(m, off).is_some_and(|w| w != 0) {
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

/// Scratch space handed to a balancer handler as its module configuration.
const SCRATCH: usize = 512;

impl Upstream {
    /// The machine word at byte `off` of module `m`'s server configuration of the upstream
    /// (None when it has none). `off` is an offset the probe found in a scratch configuration
    /// of the same module ([`call`]), less than its `SCRATCH` bytes.
    pub fn srv_conf_word(self, m: &ngx_module_t, off: usize) -> Option<usize> {
        let conf = self.module_srv_conf(m).cast::<u8>();
        if conf.is_null() || off + size_of::<usize>() > SCRATCH {
            return None;
        }
        // SAFETY: conf is m's srv conf of this upstream, which holds a word at `off` (the probe
        // found its directive's value there in a conf of the same type).
        Some(unsafe { ptr::read_unaligned(conf.add(off).cast::<usize>()) })
    }
}

/// The loaded module called `name`.
fn find_module(cf: &ngx_conf_t, name: &str) -> Option<&'static ngx_module_t> {
    // SAFETY: cf->cycle->modules is the cycle's null-terminated array of loaded modules (static
    // module objects, or those of loaded .so files, which stay loaded with the cycle) with
    // their names.
    unsafe {
        let cycle = cf.cycle;
        if cycle.is_null() || (*cycle).modules.is_null() {
            return None;
        }
        let mut i = 0;
        loop {
            let m = *(*cycle).modules.add(i);
            if m.is_null() {
                return None;
            }
            if !(*m).name.is_null() && CStr::from_ptr((*m).name).to_bytes() == name.as_bytes() {
                return Some(&*m);
            }
            i += 1;
        }
    }
}

/// Calls `module`'s directive `cmd` with `args` on a scratch upstream whose `init_upstream` is
/// `preset` and whose module configuration is `SCRATCH` bytes of `fill`; returns the
/// `init_upstream` it left and the scratch module configuration.
fn call(
    cf: &ngx_conf_t,
    module: &str,
    cmd: &CStr,
    args: &[&CStr],
    preset: ngx_http_upstream_init_pt,
    fill: u8,
) -> Option<(usize, Vec<u8>)> {
    // SAFETY: the handler sees a copy of cf whose ctx points at scratch configurations that
    // live until it returns; the words it reads are in `words`, and the module conf it writes
    // is `SCRATCH` bytes (larger than any balancer's srv conf).
    unsafe {
        let m = find_module(cf, module)?;
        let mut c = m.commands as *const ngx_command_t;
        if c.is_null() {
            return None;
        }
        while (*c).name.len != 0 {
            if crate::ffi::bytes(&(*c).name) == cmd.to_bytes() {
                break;
            }
            c = c.add(1);
        }
        let set = (*c).set?;
        let mut scratch_uscf: ngx_http_upstream_srv_conf_t = zeroed();
        scratch_uscf.peer.init_upstream = preset;
        let up_idx = (*ptr::addr_of!(ngx_http_upstream_module)).ctx_index;
        let mut srv: Vec<*mut c_void> = vec![ptr::null_mut(); up_idx + 1];
        srv[up_idx] = ptr::addr_of_mut!(scratch_uscf).cast();
        let mut ctx = ngx_http_conf_ctx_t {
            main_conf: (*(cf.ctx as *mut ngx_http_conf_ctx_t)).main_conf,
            srv_conf: srv.as_mut_ptr(),
            loc_conf: (*(cf.ctx as *mut ngx_http_conf_ctx_t)).loc_conf,
        };
        let mut words: Vec<ngx_str_t> = Vec::with_capacity(args.len() + 1);
        // C strings: handlers may compare with ngx_strcmp, which needs the terminating zero.
        words.push(borrowed(cmd.to_bytes()));
        words.extend(args.iter().map(|a| borrowed(a.to_bytes())));
        let mut arr = ngx_array_t {
            elts: words.as_mut_ptr().cast(),
            nelts: words.len(),
            size: size_of::<ngx_str_t>(),
            nalloc: words.len(),
            pool: cf.pool,
        };
        let mut scratch_cf = *cf;
        scratch_cf.ctx = ptr::addr_of_mut!(ctx).cast();
        scratch_cf.args = ptr::addr_of_mut!(arr);
        let mut conf = vec![fill; SCRATCH];
        let rv: *mut c_char = set(
            ptr::addr_of_mut!(scratch_cf),
            c.cast_mut(),
            conf.as_mut_ptr().cast(),
        );
        if !rv.is_null() {
            return None;
        }
        let init = scratch_uscf.peer.init_upstream.map_or(0, |f| f as usize);
        Some((init, conf))
    }
}
