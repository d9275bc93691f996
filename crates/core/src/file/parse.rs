//! [`UpstreamFile::parse`]: the strict inverse of [`UpstreamFile::render`].

use std::net::Ipv6Addr;

use super::{Server, UpstreamFile, HEADER};
use crate::{Address, DirectiveError, ExtraDirective, NameError, Target, UpstreamName};

/// Why a text is not a file the daemon renders. Line numbers count from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("the file is not UTF-8")]
    NotUtf8,
    #[error("line 1 is not {HEADER:?}")]
    NoHeader,
    #[error("line 2 is not \"upstream <name> {{\"")]
    NoUpstream,
    #[error("line 2: {0}")]
    BadName(#[from] NameError),
    #[error("line {line}: not a server line \"    server ADDR:PORT weight=W[ down];\"")]
    BadServer { line: usize },
    #[error("line {line}: {source}")]
    BadDirective {
        line: usize,
        #[source]
        source: DirectiveError,
    },
    #[error("line {line}: a server directive the daemon did not write")]
    ForeignServer { line: usize },
    #[error("line {line}: not indented by four spaces")]
    NotIndented { line: usize },
    #[error("the file does not end with \"}}\" and a newline")]
    NoEnd,
    #[error("the file is not in the form the daemon renders (it would render differently)")]
    NotCanonical,
}

impl UpstreamFile {
    /// Parses bytes; see [`Self::parse`].
    pub fn parse_bytes(bytes: &[u8]) -> Result<UpstreamFile, FileError> {
        UpstreamFile::parse(std::str::from_utf8(bytes).map_err(|_| FileError::NotUtf8)?)
    }

    /// The file `text` is, when it is exactly what [`Self::render`] writes for it: every line in
    /// its place and form, values valid by the same rules as when they were rendered (addresses,
    /// ports, weights, directives), and the value renders `text` again byte for byte.
    pub fn parse(text: &str) -> Result<UpstreamFile, FileError> {
        let body = text.strip_suffix("}\n").ok_or(FileError::NoEnd)?;
        let mut lines = body
            .split_terminator('\n')
            .enumerate()
            .map(|(i, l)| (i + 1, l));
        if lines.next().map(|(_, l)| l) != Some(HEADER) {
            return Err(FileError::NoHeader);
        }
        let name = lines
            .next()
            .and_then(|(_, l)| l.strip_prefix("upstream "))
            .and_then(|l| l.strip_suffix(" {"))
            .ok_or(FileError::NoUpstream)?;
        let name = UpstreamName::parse(name)?;
        let mut file = UpstreamFile {
            name,
            zone: None,
            servers: Vec::new(),
            directives: Vec::new(),
        };
        let mut in_servers = true;
        for (n, line) in lines {
            let l = line
                .strip_prefix("    ")
                .ok_or(FileError::NotIndented { line: n })?;
            if n == 3 {
                if let Some(bytes) = zone_line(l, &file.name) {
                    file.zone = Some(bytes);
                    continue;
                }
            }
            if in_servers {
                if let Some(rest) = l.strip_prefix("server ") {
                    file.servers
                        .push(server(rest).ok_or(FileError::BadServer { line: n })?);
                    continue;
                }
                in_servers = false;
            }
            let d = ExtraDirective::parse(l).map_err(|source| match source {
                DirectiveError::Server => FileError::ForeignServer { line: n },
                source => FileError::BadDirective { line: n, source },
            })?;
            file.directives.push(d);
        }
        if file.render() != text {
            return Err(FileError::NotCanonical);
        }
        Ok(file)
    }
}

/// `zone NAME SIZE;` with the upstream's own name: the size in bytes.
fn zone_line(l: &str, name: &UpstreamName) -> Option<u64> {
    let rest = l.strip_prefix("zone ")?.strip_suffix(';')?;
    let (zone, size) = rest.split_once(' ')?;
    if zone != name.as_str() {
        return None;
    }
    let (n, unit) = size.split_at(size.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    match unit {
        "k" => n.checked_mul(1024),
        "m" => n.checked_mul(1024 * 1024),
        _ => None,
    }
}

/// `ADDR:PORT weight=W;` or `ADDR:PORT weight=W down;`.
fn server(rest: &str) -> Option<Server> {
    let rest = rest.strip_suffix(';')?;
    let (rest, down) = match rest.strip_suffix(" down") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (host_port, weight) = rest.split_once(" weight=")?;
    let weight: u16 = weight.parse().ok()?;
    let (address, port) = match host_port.strip_prefix('[') {
        Some(v6) => {
            let (a, port) = v6.split_once("]:")?;
            (Address::V6(a.parse::<Ipv6Addr>().ok()?), port)
        }
        None => {
            let (a, port) = host_port.rsplit_once(':')?;
            match Address::parse(a).ok()? {
                Address::V6(_) => return None,
                a => (a, port),
            }
        }
    };
    let port: u16 = port.parse().ok()?;
    if port == 0 || weight == 0 || weight > crate::MAX_WEIGHT {
        return None;
    }
    Some(Server {
        target: Target {
            address,
            port,
            weight,
        },
        down,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: &str = "# generated by tributary\nupstream api {\n    zone api 64k;\n    \
        server 10.0.0.1:80 weight=1;\n    server [2001:db8::1]:443 weight=3;\n    \
        server app.internal:80 weight=2 down;\n    keepalive 8;\n}\n";

    #[test]
    fn a_rendered_file_parses_to_the_value_that_renders_it() {
        let f = UpstreamFile::parse(LIVE).unwrap();
        assert_eq!(f.name.as_str(), "api");
        assert_eq!(f.zone, Some(64 * 1024));
        assert_eq!(f.servers.len(), 3);
        assert!(f.servers[2].down && f.servers[2].is_host_name());
        assert_eq!(f.servers[1].target.weight, 3);
        assert_eq!(f.directives.len(), 1);
        assert_eq!(f.render(), LIVE);
        assert_eq!(UpstreamFile::parse_bytes(LIVE.as_bytes()).unwrap(), f);
    }

    #[test]
    fn text_the_daemon_would_not_write_is_refused_naming_the_line() {
        let cases: &[(String, FileError)] = &[
            (
                LIVE.replace("# generated", "# written"),
                FileError::NoHeader,
            ),
            (
                LIVE.replace("upstream api {", "upstream api{"),
                FileError::NoUpstream,
            ),
            (LIVE.replace("}\n", ""), FileError::NoEnd),
            (
                LIVE.replace("weight=3", "weight=0"),
                FileError::BadServer { line: 5 },
            ),
            (
                LIVE.replace("weight=3", "weight=1001"),
                FileError::BadServer { line: 5 },
            ),
            (LIVE.replace(":443", ":0"), FileError::BadServer { line: 5 }),
            (LIVE.replace(":443", ""), FileError::BadServer { line: 5 }),
            (
                LIVE.replace("[2001:db8::1]", "2001:db8::1"),
                FileError::BadServer { line: 5 },
            ),
            (
                LIVE.replace("    keepalive", "  keepalive"),
                FileError::NotIndented { line: 7 },
            ),
            (
                LIVE.replace(" down;", " backup;"),
                FileError::BadServer { line: 6 },
            ),
            (
                LIVE.replace(
                    "keepalive 8;",
                    "keepalive 8;\n    server 10.0.0.9:80 weight=1;",
                ),
                FileError::ForeignServer { line: 8 },
            ),
            (
                LIVE.replace("keepalive 8;", "server 10.0.0.9:80 backup;"),
                FileError::BadServer { line: 7 },
            ),
            (
                LIVE.replace("keepalive 8;", "keepalive 8"),
                FileError::BadDirective {
                    line: 7,
                    source: DirectiveError::MissingSemicolon,
                },
            ),
            // Valid values, but not as render writes them.
            (
                LIVE.replace("app.internal", "App.internal"),
                FileError::NotCanonical,
            ),
            (LIVE.replace("db8::1", "db8:0::1"), FileError::NotCanonical),
            (LIVE.replace("64k", "65536k"), FileError::NotCanonical),
            (
                LIVE.replace("keepalive 8;", "keepalive 8; "),
                FileError::NotCanonical,
            ),
            (format!("{LIVE}\n"), FileError::NoEnd),
        ];
        for (text, want) in cases {
            assert_eq!(UpstreamFile::parse(text).as_ref(), Err(want), "{text}");
        }
        assert_eq!(
            UpstreamFile::parse_bytes(b"\xff\n}\n"),
            Err(FileError::NotUtf8)
        );
    }

    #[test]
    fn a_zone_line_of_another_name_or_later_is_a_directive() {
        let own = LIVE.replace("zone api 64k;", "zone shared 1m;");
        // Line 3 names another zone: a directive, so the servers after it are foreign.
        assert_eq!(
            UpstreamFile::parse(&own),
            Err(FileError::ForeignServer { line: 4 })
        );
        let own =
            "# generated by tributary\nupstream api {\n    server 10.0.0.1:80 weight=1;\n    \
                   zone shared 1m;\n}\n";
        let f = UpstreamFile::parse(own).unwrap();
        assert_eq!((f.zone, f.has_own_zone()), (None, true));
        assert_eq!(f.zone_text().as_deref(), Some("zone shared 1m;"));
    }
}
