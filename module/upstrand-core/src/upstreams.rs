//! Which upstreams of a configuration a directive may use: a plain view of nginx's upstream
//! list (name, port, explicit or implied) in, positions in that list out.

/// One entry of nginx's upstream list, in definition order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpstreamInfo<'a> {
    /// `upstream NAME`, or the host of an upstream implied by `proxy_pass`.
    pub name: &'a [u8],
    /// 0 for explicit blocks and singlets; the port of an implied `host:port` upstream.
    pub port: u16,
    /// Made by an `upstream {}` block or like one (nginx's `NGX_HTTP_UPSTREAM_CREATE`).
    pub explicit: bool,
}

/// The upstream `name` refers to in `add_upstream` (ASCII case-insensitive, as nginx compares
/// upstream names): an explicit one wins over an implied one of the same host; else the first.
pub fn find_by_name(list: &[UpstreamInfo<'_>], name: &[u8]) -> Option<usize> {
    let same = |u: &&UpstreamInfo<'_>| u.name.eq_ignore_ascii_case(name);
    let explicit = list.iter().position(|u| same(&u) && u.explicit);
    explicit.or_else(|| list.iter().position(|u| same(&u)))
}

/// Upstreams that `proxy_pass http://NAME` (a variable's value) can address by name: port 0, in
/// definition order. These are the ones an `upstrand` may have as members.
pub fn addressable(list: &[UpstreamInfo<'_>]) -> Vec<usize> {
    (0..list.len()).filter(|i| list[*i].port == 0).collect()
}

/// For every member name, the first addressable upstream of that name (the one `proxy_pass`
/// finds), each at most once: the upstreams whose `peer.init` the walk must wrap.
pub fn members_to_wrap<'m>(
    list: &[UpstreamInfo<'_>],
    members: impl IntoIterator<Item = &'m str>,
) -> Vec<usize> {
    let mut names: Vec<Vec<u8>> = Vec::new();
    for m in members {
        let n = m.as_bytes().to_ascii_lowercase();
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let mut out = Vec::new();
    for i in addressable(list) {
        let lower = list[i].name.to_ascii_lowercase();
        if let Some(pos) = names.iter().position(|n| *n == lower) {
            names.remove(pos);
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &'static str, port: u16, explicit: bool) -> UpstreamInfo<'static> {
        UpstreamInfo {
            name: name.as_bytes(),
            port,
            explicit,
        }
    }

    #[test]
    fn explicit_wins_then_first_match_case_insensitively() {
        let list = [
            info("10.0.0.1", 8080, false),
            info("u1", 0, true),
            info("10.0.0.1", 0, true),
        ];
        assert_eq!(find_by_name(&list, b"10.0.0.1"), Some(2));
        assert_eq!(find_by_name(&list, b"U1"), Some(1));
        assert_eq!(find_by_name(&list, b"nope"), None);
        let implied = [info("h", 80, false), info("h", 81, false)];
        assert_eq!(find_by_name(&implied, b"h"), Some(0));
    }

    #[test]
    fn members_wrap_the_first_addressable_upstream_of_each_name_once() {
        let list = [
            info("u01", 80, false),
            info("u01", 0, true),
            info("U02", 0, true),
            info("u01", 0, true),
            info("other", 0, true),
        ];
        assert_eq!(addressable(&list), [1, 2, 3, 4]);
        assert_eq!(members_to_wrap(&list, ["u01", "u02", "U01"]), [1, 2]);
        assert!(members_to_wrap(&list, ["zzz"]).is_empty());
    }
}
