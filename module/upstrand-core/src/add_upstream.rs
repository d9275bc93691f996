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
        return Err(ConfError::new(
            "invalid number of arguments in \"add_upstream\" directive",
        ));
    };
    if options.len() > 2 {
        return Err(ConfError::new(
            "invalid number of arguments in \"add_upstream\" directive",
        ));
    }
    let mut backup = None;
    let mut weight = None;
    for &opt in options {
        if opt == b"backup" {
            if backup.replace(true).is_some() {
                return Err(ConfError::new(
                    "parameter \"backup\" has been already declared",
                ));
            }
        } else if let Some(value) = opt.strip_prefix(b"weight=") {
            if weight.is_some() {
                return Err(ConfError::new(
                    "parameter \"weight\" has been already declared",
                ));
            }
            weight = Some(positive_integer(value).ok_or_else(|| {
                ConfError::new("parameter \"weight\" must be a positive integer value")
            })?);
        } else {
            return Err(ConfError::new(format!(
                "invalid parameter \"{}\"",
                show(opt)
            )));
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
        .ok_or_else(|| {
            ConfError::new(format!(
                "weight {base} multiplied by {} is too large in upstream \"{}\"",
                opts.weight,
                show(&opts.name)
            ))
        })?;
    Ok(ServerFlags {
        weight,
        backup: src.backup || opts.backup,
        down: src.down,
    })
}

/// Largest weight accepted (keeps nginx's total-weight sums far from overflow).
pub const MAX_WEIGHT: u64 = 1 << 31;

#[cfg(test)]
mod tests {
    use super::*;

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
