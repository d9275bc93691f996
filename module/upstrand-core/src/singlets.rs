//! `combine_server_singlets [SUFFIX] [WIDTH | byname] [nobackup];`

use crate::error::show;
use crate::{ConfError, ServerFlags};

/// How the tail of a singlet name is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// 1-based order number, zero-padded to `width` digits (0: no padding).
    Number {
        /// Minimum number of digits.
        width: usize,
    },
    /// The server's address text as written, every `:` replaced by `_`.
    ByName,
}

/// Parsed arguments of `combine_server_singlets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Singlets {
    /// Put between the host upstream's name and the tail.
    pub suffix: Vec<u8>,
    /// Tail of each name.
    pub naming: Naming,
    /// Mark the other servers `down` instead of `backup`.
    pub nobackup: bool,
}

/// Largest accepted field width.
pub const MAX_WIDTH: usize = 64;

const BYNAME: &[u8] = b"byname";
const NOBACKUP: &[u8] = b"nobackup";

/// Parses the arguments after the directive name.
///
/// `nobackup` is recognised only as the last argument; `byname` only in the first position (then
/// there is no suffix) or in the second (after a suffix).
pub fn parse(args: &[&[u8]]) -> Result<Singlets, ConfError> {
    let (nobackup, rest) = match args.split_last() {
        Some((&last, rest)) if last == NOBACKUP => (true, rest),
        _ => (false, args),
    };
    let mut out = Singlets {
        suffix: Vec::new(),
        naming: Naming::Number { width: 0 },
        nobackup,
    };
    let mut it = rest.iter().copied();
    match it.next() {
        None => return Ok(out),
        Some(first) if first == BYNAME => out.naming = Naming::ByName,
        Some(first) => {
            out.suffix = first.to_vec();
            match it.next() {
                None => return Ok(out),
                Some(second) if second == BYNAME => out.naming = Naming::ByName,
                Some(second) => {
                    out.naming = Naming::Number {
                        width: width(second)?,
                    }
                }
            }
        }
    }
    if let Some(extra) = it.next() {
        return Err(if out.naming == Naming::ByName && is_integer(extra) {
            ConfError::WidthWithByName
        } else {
            ConfError::InvalidParameter(show(extra))
        });
    }
    Ok(out)
}

/// `combine_server_singlets` needs at least one server declared before it in its upstream
/// (the C module's wording).
pub fn require_servers(count: usize) -> Result<(), ConfError> {
    if count == 0 {
        return Err(ConfError::NoServerForSinglets);
    }
    Ok(())
}

fn is_integer(arg: &[u8]) -> bool {
    !arg.is_empty() && arg.iter().all(u8::is_ascii_digit)
}

fn width(arg: &[u8]) -> Result<usize, ConfError> {
    if !is_integer(arg) {
        return Err(ConfError::WidthNotInteger(show(arg)));
    }
    match std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        Some(w) if w <= MAX_WIDTH => Ok(w),
        _ => Err(ConfError::WidthTooLarge(show(arg), MAX_WIDTH)),
    }
}

/// Name of singlet number `index` (1-based) of upstream `host`; `server_name` is the server's
/// address text as written in its `server` line (used with `byname`).
pub fn name(host: &[u8], opts: &Singlets, index: usize, server_name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(host.len() + opts.suffix.len() + server_name.len() + 4);
    out.extend_from_slice(host);
    out.extend_from_slice(&opts.suffix);
    match opts.naming {
        Naming::Number { width } => {
            out.extend_from_slice(format!("{index:0width$}").as_bytes());
        }
        Naming::ByName => {
            out.extend(
                server_name
                    .iter()
                    .map(|&b| if b == b':' { b'_' } else { b }),
            );
        }
    }
    out
}

/// Flags of every server in singlet number `active` (0-based) built from the host's servers
/// so far. The active server becomes primary (keeping `down`, and in `nobackup` mode keeping
/// all its own flags); the others become `backup` (default) or `down` (`nobackup`).
pub fn singlet_flags(servers: &[ServerFlags], active: usize, nobackup: bool) -> Vec<ServerFlags> {
    servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if i == active {
                if nobackup {
                    *s
                } else {
                    ServerFlags {
                        backup: false,
                        ..*s
                    }
                }
            } else if nobackup {
                ServerFlags { down: true, ..*s }
            } else {
                ServerFlags { backup: true, ..*s }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn singlets_need_a_server_declared_before() {
        assert_eq!(
            require_servers(0).unwrap_err().to_string(),
            "no server so far declared to build singlets"
        );
        assert!(require_servers(1).is_ok());
    }

    fn p(args: &[&str]) -> Result<Singlets, ConfError> {
        let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse(&v)
    }

    fn names(host: &str, args: &[&str], servers: &[&str]) -> Vec<String> {
        let o = p(args).unwrap();
        servers
            .iter()
            .enumerate()
            .map(|(i, s)| {
                String::from_utf8(name(host.as_bytes(), &o, i + 1, s.as_bytes())).unwrap()
            })
            .collect()
    }

    #[test]
    fn default_numbering() {
        assert_eq!(names("uhost", &[], &["a", "b"]), ["uhost1", "uhost2"]);
    }

    #[test]
    fn suffix_and_width() {
        assert_eq!(names("uhost", &["_single_"], &["a"]), ["uhost_single_1"]);
        let n = names("u3", &["_tmp_", "2"], &["a"; 11]);
        assert_eq!(n[0], "u3_tmp_01");
        assert_eq!(n[10], "u3_tmp_11");
        assert_eq!(names("u", &["_", "3"], &["a"])[0], "u_001");
        assert_eq!(names("u", &["_", "0"], &["a"])[0], "u_1");
        // a number wider than the width is not cut
        let o = p(&["_", "2"]).unwrap();
        assert_eq!(name(b"u", &o, 100, b""), b"u_100");
    }

    #[test]
    fn byname_forms() {
        assert_eq!(
            names("u3", &["byname"], &["localhost:8020"]),
            ["u3localhost_8020"]
        );
        assert_eq!(
            names("u3", &["_x_", "byname"], &["localhost:8020"]),
            ["u3_x_localhost_8020"]
        );
        assert_eq!(
            names("u", &["byname", "nobackup"], &["[::1]:80"]),
            ["u[__1]_80"]
        );
    }

    #[test]
    fn nobackup_only_last() {
        assert!(p(&["nobackup"]).unwrap().nobackup);
        assert_eq!(p(&["nobackup"]).unwrap().suffix, b"");
        let o = p(&["_s_", "2", "nobackup"]).unwrap();
        assert!(o.nobackup);
        assert_eq!(o.naming, Naming::Number { width: 2 });
        // not last: taken as the suffix
        let o = p(&["nobackup", "byname"]).unwrap();
        assert!(!o.nobackup);
        assert_eq!(o.suffix, b"nobackup");
        assert_eq!(o.naming, Naming::ByName);
    }

    #[test]
    fn errors() {
        let e = |a: &[&str]| p(a).unwrap_err().to_string();
        assert_eq!(
            e(&["byname", "2"]),
            "setting field width is not permitted when using \"byname\" value"
        );
        assert_eq!(
            e(&["_x_", "byname", "2"]),
            "setting field width is not permitted when using \"byname\" value"
        );
        assert_eq!(
            e(&["_x_", "two"]),
            "field width \"two\" must be an integer value"
        );
        assert_eq!(
            e(&["_x_", "-1"]),
            "field width \"-1\" must be an integer value"
        );
        assert_eq!(e(&["_x_", "2", "3"]), "invalid parameter \"3\"");
        assert_eq!(e(&["byname", "x"]), "invalid parameter \"x\"");
        assert!(e(&["_x_", "65"]).contains("too large"));
    }

    fn f(weight: u64, backup: bool, down: bool) -> ServerFlags {
        ServerFlags {
            weight,
            backup,
            down,
        }
    }

    #[test]
    fn flags_default_mode() {
        let host = [f(1, false, false), f(2, false, true), f(3, true, false)];
        assert_eq!(
            singlet_flags(&host, 0, false),
            [f(1, false, false), f(2, true, true), f(3, true, false)]
        );
        // a backup server of the host is primary in its own singlet
        assert_eq!(
            singlet_flags(&host, 2, false),
            [f(1, true, false), f(2, true, true), f(3, false, false)]
        );
    }

    #[test]
    fn flags_nobackup_mode() {
        let host = [f(1, false, false), f(2, false, false), f(3, true, false)];
        assert_eq!(
            singlet_flags(&host, 1, true),
            [f(1, false, true), f(2, false, false), f(3, true, true)]
        );
        assert_eq!(
            singlet_flags(&host, 2, true),
            [f(1, false, true), f(2, false, true), f(3, true, false)]
        );
    }
}
