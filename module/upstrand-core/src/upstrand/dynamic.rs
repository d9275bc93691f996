//! `dynamic_upstrand $RESULT $VAR1 [$VAR2 ...] [LITERAL];`

use crate::ConfError;

/// A parsed `dynamic_upstrand` directive. Variable names are stored without `$`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicSpec {
    pub result: String,
    pub candidates: Vec<String>,
    pub default: Option<String>,
}

fn variable_name(arg: &str) -> Result<&str, ConfError> {
    let name = arg.strip_prefix('$').unwrap_or("");
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(ConfError::InvalidVariableName(arg.to_string()));
    }
    Ok(name)
}

/// Parses the arguments after the directive name. The first is the result variable, then at least
/// one candidate variable; a last argument without `$` is the literal default.
pub fn parse_args(args: &[&str]) -> Result<DynamicSpec, ConfError> {
    let count_error = || ConfError::ArgumentCount("dynamic_upstrand");
    let Some((result, rest)) = args.split_first() else {
        return Err(count_error());
    };
    let result = variable_name(result)?.to_string();
    let (default, vars) = match rest.split_last() {
        Some((last, vars)) if !last.starts_with('$') => (Some(*last), vars),
        _ => (None, rest),
    };
    if vars.is_empty() {
        return Err(count_error());
    }
    if let Some(d) = default {
        if d.is_empty() {
            return Err(ConfError::EmptyDefaultUpstrand);
        }
    }
    let candidates = vars
        .iter()
        .map(|v| variable_name(v).map(str::to_string))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DynamicSpec {
        result,
        candidates,
        default: default.map(str::to_string),
    })
}

/// The upstrand name chosen at run time: the first non-empty candidate value (in order), else the
/// literal default, lower-cased. `None` when all are empty and there is no default.
pub fn choose<'a>(
    values: impl IntoIterator<Item = Option<&'a [u8]>>,
    default: Option<&str>,
) -> Option<Vec<u8>> {
    values
        .into_iter()
        .flatten()
        .find(|v| !v.is_empty())
        .or(default.map(str::as_bytes))
        .map(|v| v.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_seed_forms() {
        assert_eq!(
            parse_args(&["$dus1", "$arg_a", "us2"]).unwrap(),
            DynamicSpec {
                result: "dus1".into(),
                candidates: vec!["arg_a".into()],
                default: Some("us2".into())
            }
        );
        assert_eq!(
            parse_args(&["$dus2", "$arg_b"]).unwrap(),
            DynamicSpec {
                result: "dus2".into(),
                candidates: vec!["arg_b".into()],
                default: None
            }
        );
        let s = parse_args(&["$r", "$a", "$b", "$c"]).unwrap();
        assert_eq!(s.candidates, ["a", "b", "c"]);
        assert_eq!(s.default, None);
    }

    #[test]
    fn rejects_bad_args() {
        let count = "invalid number of arguments in \"dynamic_upstrand\" directive";
        assert_eq!(parse_args(&[]).unwrap_err().to_string(), count);
        assert_eq!(parse_args(&["$r"]).unwrap_err().to_string(), count);
        assert_eq!(parse_args(&["$r", "us1"]).unwrap_err().to_string(), count);
        assert_eq!(
            parse_args(&["r", "$a"]).unwrap_err().to_string(),
            "invalid variable name \"r\""
        );
        assert_eq!(
            parse_args(&["$", "$a"]).unwrap_err().to_string(),
            "invalid variable name \"$\""
        );
        assert_eq!(
            parse_args(&["$r", "a", "us1"]).unwrap_err().to_string(),
            "invalid variable name \"a\""
        );
        assert_eq!(
            parse_args(&["$r", "$a-b"]).unwrap_err().to_string(),
            "invalid variable name \"$a-b\""
        );
    }

    #[test]
    fn choice() {
        let some = |s: &'static str| Some(s.as_bytes());
        assert_eq!(choose([some("us1")], Some("us2")), Some(b"us1".to_vec()));
        assert_eq!(choose([some("")], Some("us2")), Some(b"us2".to_vec()));
        assert_eq!(choose([None], Some("us2")), Some(b"us2".to_vec()));
        assert_eq!(choose([None], None), None);
        assert_eq!(choose([some(""), some("US1")], None), Some(b"us1".to_vec()));
        assert_eq!(
            choose([None, some("x"), some("y")], Some("d")),
            Some(b"x".to_vec())
        );
        assert_eq!(
            choose(Vec::<Option<&[u8]>>::new(), Some("D")),
            Some(b"d".to_vec())
        );
    }
}
