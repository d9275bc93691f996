//! Version cfgs of the module: `nginxX_Y_Z` is set when the nginx the module builds against (as
//! `nginx-sys` found it: `DEP_NGINX_VERSION_NUMBER`) is X.Y.Z or newer. Code that depends on the nginx
//! version is conditional on these, e.g. `#[cfg(nginx1_29_3)]` in `src/ffi/request/read.rs`.

/// (first nginx version, cfg name), as `nginx_version` numbers.
const VERSION_CHECKS: &[(u64, &str)] = &[
    // `server ... resolve`: the upstream zone module re-resolves names at run time and rewrites
    // the peer lists itself; peers carry `refs` (ffi/peers.rs)
    (1_027_003, "nginx1_27_3"),
    // `in_port_t port` before the request's bit fields (bindgen misplaces them, see set_error_page)
    (1_029_003, "nginx1_29_3"),
    // upstream `keepalive` on by default, wrapping `peer.init` in its init_main_conf (ffi/probe.rs)
    (1_029_007, "nginx1_29_7"),
];

/// Set when the nginx build defines `NGX_HTTP_UPSTREAM_SID` (sticky sessions, nginx 1.29.6+,
/// on by default): its zone module gives every peer a `sid` slab allocation (ffi/peers.rs).
const SID_CFG: &str = "ngx_upstream_sid";

fn main() {
    for (_, name) in VERSION_CHECKS {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    println!("cargo::rustc-check-cfg=cfg({SID_CFG})");
    println!("cargo::rerun-if-env-changed=DEP_NGINX_BUILD_DIR");
    if let Ok(dir) = std::env::var("DEP_NGINX_BUILD_DIR") {
        let header = std::path::Path::new(&dir).join("ngx_auto_config.h");
        println!("cargo::rerun-if-changed={}", header.display());
        let text = std::fs::read_to_string(&header)
            .unwrap_or_else(|e| panic!("{}: {e}", header.display()));
        if text.lines().any(|l| {
            l.split_whitespace()
                .take(2)
                .eq(["#define", "NGX_HTTP_UPSTREAM_SID"])
        }) {
            println!("cargo::rustc-cfg={SID_CFG}");
        }
    }
    println!("cargo::rerun-if-env-changed=DEP_NGINX_VERSION_NUMBER");
    let Ok(version) = std::env::var("DEP_NGINX_VERSION_NUMBER") else {
        panic!("nginx-sys did not report the nginx version (DEP_NGINX_VERSION_NUMBER)");
    };
    let version: u64 = version
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("DEP_NGINX_VERSION_NUMBER={version:?}: {e}"));
    for (first, name) in VERSION_CHECKS {
        if version >= *first {
            println!("cargo::rustc-cfg={name}");
        }
    }
}
