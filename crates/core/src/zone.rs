//! Live mode's deviation from the seed's render: a `zone <name> <size>;` line, so the module's
//! `upstreams_api` can change the upstream's servers at run time (issue 11, `docs/live-api.md`).
//!
//! The size follows the module's measured cost (`docs/live-api.md`, "Sizing the zone"): 816
//! bytes of zone memory per server (nginx 1.30, the largest of the versions measured), and for
//! an `https` upstream (`proxy_ssl_session_reuse`, nginx's default) a 2 KiB slab chunk per
//! server for the TLS session nginx keeps in the zone,
//! plus about 24 KiB nginx uses itself. A change needs room for the old set while the new one
//! arrives (the old one with its sessions, the new one before its first requests):
//! `32 KiB + servers × (2 × 816 B + 2 KiB)`, at least 64 KiB, rounded **up to a power of two** so
//! that small changes of the server count keep the same line (a changed zone size needs a
//! reload). The daemon does not know whether the upstream is reached over TLS, so it counts the
//! session always. When the module still refuses a change for want of room (507, naming the size
//! it needs), the daemon writes at least that size from then on ([`add_zone_at_least`]). A
//! `zone` line among the binding's own directives wins: nothing is added then.

use crate::{render, ExtraDirective, Target, UpstreamName};

/// Zone memory counted per server (bytes), twice over for a set retiring while the new one
/// arrives: what the module's estimate counts on nginx 1.30 (808 measured, 816 estimated; 1.22
/// and 1.26: 778 measured, 784 estimated; `docs/live-api.md`, the per-version table).
pub const ZONE_BYTES_PER_SERVER: u64 = 816;
/// Zone memory counted per server for the TLS session nginx keeps (a 2 KiB slab chunk: measured
/// 2048 bytes per server with a 2048-bit RSA certificate, which the session holds).
pub const ZONE_TLS_SESSION_BYTES: u64 = 2048;
/// Smallest zone written.
pub const ZONE_MIN_BYTES: u64 = 64 * 1024;

/// The zone size in bytes for `servers` servers (see the module docs above).
pub fn zone_size(servers: usize) -> u64 {
    zone_size_at_least(servers, 0)
}

/// [`zone_size`], but at least `floor` bytes (a size the module said a change needed).
pub fn zone_size_at_least(servers: usize, floor: u64) -> u64 {
    let need = 32 * 1024 + (2 * ZONE_BYTES_PER_SERVER + ZONE_TLS_SESSION_BYTES) * servers as u64;
    need.max(floor).max(ZONE_MIN_BYTES).next_power_of_two()
}

/// The size as nginx reads it: `64k`, `512k`, `1m`, `2m`...
pub fn zone_size_text(bytes: u64) -> String {
    if bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0 {
        format!("{}m", bytes / (1024 * 1024))
    } else {
        format!("{}k", bytes.div_ceil(1024))
    }
}

/// [`render`] plus the `zone` line (live mode).
pub fn render_live(
    name: &UpstreamName,
    targets: &[Target],
    directives: &[ExtraDirective],
) -> String {
    add_zone(&render(name, targets, directives))
}

/// Adds `    zone <name> <size>;` right after the `upstream <name> {` line of a rendered file,
/// sized for its `server` lines. Text that is not a rendered file, or one whose directives carry
/// a `zone` already, comes back unchanged.
pub fn add_zone(rendered: &str) -> String {
    add_zone_at_least(rendered, |_| 0)
}

/// [`add_zone`] with the zone at least `floor(name)` bytes for upstream `name`.
pub fn add_zone_at_least(rendered: &str, floor: impl Fn(&str) -> u64) -> String {
    let mut lines = rendered.split_inclusive('\n');
    let mut out = String::with_capacity(rendered.len() + 32);
    let mut name = None;
    for line in lines.by_ref() {
        out.push_str(line);
        if let Some(rest) = line.strip_prefix("upstream ") {
            name = rest.strip_suffix(" {\n").map(str::to_string);
            break;
        }
    }
    let Some(name) = name else {
        return rendered.to_string();
    };
    let body: Vec<&str> = lines.collect();
    if body.iter().any(|l| l.starts_with("    zone ")) {
        return rendered.to_string();
    }
    let servers = body.iter().filter(|l| l.starts_with("    server ")).count();
    out.push_str(&format!(
        "    zone {name} {};\n",
        zone_size_text(zone_size_at_least(servers, floor(&name)))
    ));
    for l in body {
        out.push_str(l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_powers_of_two_from_64k() {
        assert_eq!(zone_size(0), 64 * 1024);
        assert_eq!(zone_size(8), 64 * 1024);
        assert_eq!(zone_size(9), 128 * 1024);
        assert_eq!(zone_size(20), 128 * 1024);
        assert_eq!(zone_size(500), 2 * 1024 * 1024);
        assert_eq!(zone_size_text(zone_size(1)), "64k");
        assert_eq!(zone_size_text(zone_size(500)), "2m");
        assert_eq!(zone_size_text(zone_size(1000)), "4m");
    }

    #[test]
    fn twenty_tls_servers_get_the_size_the_module_measured() {
        // The module's test `full_zone_names_the_size_a_tls_set_needs`: 20 servers with TLS
        // sessions and a disjoint set of 20 needed about 121 KiB.
        assert!(zone_size(20) >= 121 * 1024);
    }

    #[test]
    fn a_size_the_module_named_is_a_floor() {
        assert_eq!(zone_size_at_least(1, 123_904), 128 * 1024);
        assert_eq!(zone_size_at_least(1, 0), zone_size(1));
        let text = "# generated by tributary\nupstream a {\n    server 10.0.0.1:80 weight=1;\n}\n";
        assert!(add_zone(text).contains("    zone a 64k;\n"));
        let grown = add_zone_at_least(text, |n| if n == "a" { 200_000 } else { 0 });
        assert!(grown.contains("    zone a 256k;\n"), "{grown}");
        let other = add_zone_at_least(text, |n| if n == "b" { 200_000 } else { 0 });
        assert!(other.contains("    zone a 64k;\n"), "{other}");
    }

    #[test]
    fn own_zone_directive_wins_and_foreign_text_is_unchanged() {
        let with = "# generated by tributary\nupstream a {\n    server 10.0.0.1:80 weight=1;\n    zone z 1m;\n}\n";
        assert_eq!(add_zone(with), with);
        assert_eq!(add_zone("junk\n"), "junk\n");
    }
}
