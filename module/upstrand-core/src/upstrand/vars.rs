//! Values of the status variables `$upstrand_addr` & co. and `$upstrand_path`.

/// The name shown for the failover subrequest of `intercept_statuses`.
pub const INTERCEPTED: &str = "<intercepted>";

/// The status variables: `$upstrand_<suffix>` collects `$upstream_<suffix>` of every step.
pub const STATUS_SUFFIXES: [&str; 7] = [
    "addr",
    "cache_status",
    "connect_time",
    "header_time",
    "response_length",
    "response_time",
    "status",
];

/// Name of the path variable's suffix: `$upstrand_path`.
pub const PATH_SUFFIX: &str = "path";

/// True when `suffix` (the part after `upstrand_`) names a status or path variable rather than an
/// upstrand.
pub fn is_reserved_suffix(suffix: &str) -> bool {
    suffix == PATH_SUFFIX || STATUS_SUFFIXES.contains(&suffix)
}

/// `(u01) VALUE (u02) VALUE`: one entry per step, chronologically; an empty value is shown as `-`.
pub fn format_entries<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (name, value) in entries {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push('(');
        out.push_str(name);
        out.push_str(") ");
        out.push_str(if value.is_empty() { "-" } else { value });
    }
    out
}

/// `u01 -> u02 -> b01`: the upstreams a request went through (the failover subrequest is not an
/// upstream and is not listed).
pub fn format_path<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .filter(|n| *n != INTERCEPTED)
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_format() {
        let s = format_entries([
            ("u01", "127.0.0.1:8040"),
            ("u02", "127.0.0.1:8050"),
            ("b01", "127.0.0.1:8060"),
        ]);
        assert_eq!(
            s,
            "(u01) 127.0.0.1:8040 (u02) 127.0.0.1:8050 (b01) 127.0.0.1:8060"
        );
        assert_eq!(
            format_entries([("u01", "503"), (INTERCEPTED, "")]),
            "(u01) 503 (<intercepted>) -"
        );
        assert_eq!(format_entries(std::iter::empty()), "");
        assert_eq!(
            format_entries([("u01", "127.0.0.1:1, 127.0.0.1:2")]),
            "(u01) 127.0.0.1:1, 127.0.0.1:2"
        );
    }

    #[test]
    fn path_format() {
        assert_eq!(format_path(["u01", "u02", "b01"]), "u01 -> u02 -> b01");
        assert_eq!(format_path(["u01"]), "u01");
        assert_eq!(format_path(["u01", INTERCEPTED]), "u01");
        assert_eq!(format_path(std::iter::empty()), "");
    }

    #[test]
    fn reserved_suffixes() {
        for s in STATUS_SUFFIXES {
            assert!(is_reserved_suffix(s));
        }
        assert!(is_reserved_suffix("path"));
        assert!(!is_reserved_suffix("us1"));
    }
}
