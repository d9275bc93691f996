//! `add_upstream NAME [backup] [weight=N];`

use crate::error::show;
use crate::{ConfError, ServerFlags};

/// Parsed arguments of `add_upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddUpstream {
    /// Name of the source upstream.
    pub name: Vec<u8>,
    /// Mark every copied server `backup`.
    pub backup: bool,
    /// Factor for every copied server's weight (1 when not given).
    pub weight: u64,
}

/// Parses the arguments after the directive name. nginx's argument-count check already
/// guarantees one to three arguments; fewer or more are rejected here as well.
pub fn parse(args: &[&[u8]]) -> Result<AddUpstream, ConfError> {
    let Some((name, options)) = args.split_first() else {
        return Err(ConfError::ArgumentCount("add_upstream"));
    };
    if options.len() > 2 {
        return Err(ConfError::ArgumentCount("add_upstream"));
    }
    let mut backup = None;
    let mut weight = None;
    for &opt in options {
        if opt == b"backup" {
            if backup.replace(true).is_some() {
                return Err(ConfError::AlreadyDeclared("backup"));
            }
        } else if let Some(value) = opt.strip_prefix(b"weight=") {
            if weight.is_some() {
                return Err(ConfError::AlreadyDeclared("weight"));
            }
            weight = Some(positive_integer(value).ok_or(ConfError::WeightNotPositive)?);
        } else {
            return Err(ConfError::InvalidParameter(show(opt)));
        }
    }
    Ok(AddUpstream {
        name: name.to_vec(),
        backup: backup.unwrap_or(false),
        weight: weight.unwrap_or(1),
    })
}

/// A decimal integer ≥ 1 (digits only, like nginx's `ngx_atoi`), without overflow.
fn positive_integer(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (n >= 1).then_some(n)
}

/// The flags a copied server gets in the host upstream. Errors when the multiplied weight
/// overflows.
pub fn copy_flags(src: ServerFlags, opts: &AddUpstream) -> Result<ServerFlags, ConfError> {
    let base = src.weight.max(1);
    let weight = base
        .checked_mul(opts.weight)
        .filter(|w| *w <= MAX_WEIGHT)
        .ok_or_else(|| ConfError::WeightTooLarge {
            weight: base,
            factor: opts.weight,
            upstream: show(&opts.name),
        })?;
    Ok(ServerFlags {
        weight,
        backup: src.backup || opts.backup,
        down: src.down,
    })
}

/// What the cdylib found under the source name of `add_upstream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The source is the upstream being parsed.
    pub is_host: bool,
    /// nginx keeps a server list for it (an upstream implied by `proxy_pass http://HOSTNAME`
    /// has none at configuration time).
    pub has_server_list: bool,
}

/// Decides what `add_upstream` does with the source found under its name (`None`: no such
/// upstream so far): the flags of every copy, in the source's server order, or nginx's error.
/// `host_supports_backup` is whether the current upstream's balancer accepts `backup` servers.
pub fn plan(
    opts: &AddUpstream,
    source: Option<Source>,
    host_supports_backup: bool,
    servers: impl IntoIterator<Item = ServerFlags>,
) -> Result<Vec<ServerFlags>, ConfError> {
    let name = show(&opts.name);
    let source = source.ok_or_else(|| ConfError::SourceNotFound(name.clone()))?;
    if source.is_host {
        return Err(ConfError::Recursion(name));
    }
    if !source.has_server_list {
        return Err(ConfError::NoServerList(name));
    }
    servers
        .into_iter()
        .map(|f| {
            let copy = copy_flags(f, opts)?;
            if copy.backup && !host_supports_backup {
                return Err(ConfError::BackupNotSupported);
            }
            Ok(copy)
        })
        .collect()
}

/// Largest weight accepted (keeps nginx's total-weight sums far from overflow).
pub const MAX_WEIGHT: u64 = 1 << 31;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_decides_source_errors_and_copies() {
        let opts = p(&["src", "backup", "weight=2"]).unwrap();
        let found = Source {
            is_host: false,
            has_server_list: true,
        };
        let f = |weight, backup| ServerFlags {
            weight,
            backup,
            down: false,
        };
        assert_eq!(
            plan(&opts, None, true, []).unwrap_err().to_string(),
            "upstream \"src\" not found"
        );
        let host = Source {
            is_host: true,
            ..found
        };
        assert_eq!(
            plan(&opts, Some(host), true, []).unwrap_err().to_string(),
            "upstream \"src\" makes recursion"
        );
        let implied = Source {
            has_server_list: false,
            ..found
        };
        assert_eq!(
            plan(&opts, Some(implied), true, []).unwrap_err(),
            ConfError::NoServerList("src".into())
        );
        assert_eq!(
            plan(&opts, Some(found), false, [f(1, false)]).unwrap_err(),
            ConfError::BackupNotSupported
        );
        assert_eq!(
            plan(&opts, Some(found), true, [f(1, false), f(3, true)]).unwrap(),
            [f(2, true), f(6, true)]
        );
        let plain = p(&["src"]).unwrap();
        assert_eq!(
            plan(&plain, Some(found), false, [f(5, false)]).unwrap(),
            [f(5, false)],
            "no backup asked: any balancer"
        );
    }

    fn p(args: &[&str]) -> Result<AddUpstream, ConfError> {
        let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse(&v)
    }

    fn err(args: &[&str]) -> String {
        p(args).unwrap_err().to_string()
    }

    #[test]
    fn name_only_defaults() {
        assert_eq!(
            p(&["u1"]).unwrap(),
            AddUpstream {
                name: b"u1".to_vec(),
                backup: false,
                weight: 1
            }
        );
    }

    #[test]
    fn options_in_any_order() {
        let a = p(&["u1", "weight=3", "backup"]).unwrap();
        let b = p(&["u1", "backup", "weight=3"]).unwrap();
        assert_eq!(a, b);
        assert!(a.backup);
        assert_eq!(a.weight, 3);
    }

    #[test]
    fn duplicates_are_rejected() {
        assert_eq!(
            err(&["u", "backup", "backup"]),
            "parameter \"backup\" has been already declared"
        );
        assert_eq!(
            err(&["u", "weight=2", "weight=3"]),
            "parameter \"weight\" has been already declared"
        );
    }

    #[test]
    fn bad_weights() {
        for w in [
            "weight=0",
            "weight=",
            "weight=-1",
            "weight=x",
            "weight=2x",
            "weight=99999999999999999999999",
        ] {
            assert_eq!(
                err(&["u", w]),
                "parameter \"weight\" must be a positive integer value",
                "{w}"
            );
        }
    }

    #[test]
    fn backup_is_an_exact_word() {
        assert_eq!(err(&["u", "backupx"]), "invalid parameter \"backupx\"");
        assert_eq!(err(&["u", "back"]), "invalid parameter \"back\"");
        assert_eq!(err(&["u", "Weight=2"]), "invalid parameter \"Weight=2\"");
    }

    #[test]
    fn too_many_arguments() {
        assert!(err(&["u", "backup", "weight=2", "x"]).contains("invalid number of arguments"));
        assert!(p(&[]).is_err());
    }

    #[test]
    fn copy_multiplies_and_marks() {
        let opts = p(&["u", "weight=3", "backup"]).unwrap();
        let src = ServerFlags {
            weight: 2,
            backup: false,
            down: true,
        };
        assert_eq!(
            copy_flags(src, &opts).unwrap(),
            ServerFlags {
                weight: 6,
                backup: true,
                down: true
            }
        );
        // weight 0 (implicit upstream) counts as 1
        let src = ServerFlags {
            weight: 0,
            backup: true,
            down: false,
        };
        let plain = p(&["u"]).unwrap();
        assert_eq!(
            copy_flags(src, &plain).unwrap(),
            ServerFlags {
                weight: 1,
                backup: true,
                down: false
            }
        );
    }

    #[test]
    fn weight_overflow_is_an_error() {
        let opts = p(&["big", "weight=4294967296"]).unwrap();
        let src = ServerFlags {
            weight: 5,
            backup: false,
            down: false,
        };
        let e = copy_flags(src, &opts).unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
        assert!(e.contains("\"big\""), "{e}");
    }
}
