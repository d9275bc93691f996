use std::fmt;

/// A configuration error of one of the module's directives. `Display` gives the text in nginx's
/// wording (nginx prefixes `[emerg]` and appends ` in FILE:LINE`); the text never contains
/// anything but directive arguments the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfError {
    /// `invalid number of arguments in "DIRECTIVE" directive`
    ArgumentCount(&'static str),
    /// `invalid parameter "X"`
    InvalidParameter(String),
    /// `parameter "X" has been already declared`
    AlreadyDeclared(&'static str),
    /// `parameter "weight" must be a positive integer value`
    WeightNotPositive,
    /// `weight W multiplied by N is too large in upstream "NAME"`
    WeightTooLarge {
        weight: u64,
        factor: u64,
        upstream: String,
    },
    /// `upstream "NAME" not found` (`add_upstream`)
    SourceNotFound(String),
    /// `upstream "NAME" makes recursion`
    Recursion(String),
    /// `upstream "NAME" has no server list to copy (...)`
    NoServerList(String),
    /// `balancing method does not support parameter "backup"`
    BackupNotSupported,
    /// `setting field width is not permitted when using "byname" value`
    WidthWithByName,
    /// `field width "W" must be an integer value`
    WidthNotInteger(String),
    /// `field width "W" is too large (at most 64)`
    WidthTooLarge(String, usize),
    /// `no server so far declared to build singlets`
    NoServerForSinglets,
    /// `invalid upstrand name "X"`
    InvalidUpstrandName(String),
    /// `invalid upstrand name "X": reserved`
    ReservedUpstrandName(String),
    /// `duplicate upstrand "NAME"`
    DuplicateUpstrand(String),
    /// `empty upstrand directive`
    EmptyDirective,
    /// `bad upstrand directive "X"`
    BadDirective(String),
    /// `duplicate upstrand directive "X"`
    DuplicateDirective(&'static str),
    /// `bad timeout value: "X"`
    BadTimeout(String),
    /// `bad blacklist interval: "X"`
    BadBlacklistInterval(String),
    /// `upstream "NAME" is not found` (an upstrand member)
    MemberNotFound(String),
    /// `no upstream registered in upstrand "NAME"`
    NoMember(String),
    /// `invalid status "X"`
    InvalidStatus(String),
    /// `invalid failover URI "X": must start with "/"`
    InvalidFailoverUri(String),
    /// nginx's own regex compile error, as nginx words it
    Regex(String),
    /// `invalid variable name "X"`
    InvalidVariableName(String),
    /// `empty default upstrand in "dynamic_upstrand" directive`
    EmptyDefaultUpstrand,
    /// `"upstreams_api" directive is duplicate`
    ApiDuplicate,
    /// A `probe` directive error, the whole text (`live::probe`).
    Probe(String),
    /// `invalid parameter "X" in "upstreams_api" directive: WHY`
    ApiParameter {
        /// The parameter as written.
        param: String,
        /// What it should be.
        why: &'static str,
    },
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfError::*;
        match self {
            ArgumentCount(d) => write!(f, "invalid number of arguments in \"{d}\" directive"),
            InvalidParameter(p) => write!(f, "invalid parameter \"{p}\""),
            AlreadyDeclared(p) => write!(f, "parameter \"{p}\" has been already declared"),
            WeightNotPositive => {
                f.write_str("parameter \"weight\" must be a positive integer value")
            }
            WeightTooLarge {
                weight,
                factor,
                upstream,
            } => write!(
                f,
                "weight {weight} multiplied by {factor} is too large in upstream \"{upstream}\""
            ),
            SourceNotFound(n) => write!(f, "upstream \"{n}\" not found"),
            Recursion(n) => write!(f, "upstream \"{n}\" makes recursion"),
            NoServerList(n) => write!(
                f,
                "upstream \"{n}\" has no server list to copy (an upstream implied by proxy_pass \
                 with a host name is resolved only at start)"
            ),
            BackupNotSupported => {
                f.write_str("balancing method does not support parameter \"backup\"")
            }
            WidthWithByName => {
                f.write_str("setting field width is not permitted when using \"byname\" value")
            }
            WidthNotInteger(w) => write!(f, "field width \"{w}\" must be an integer value"),
            WidthTooLarge(w, max) => write!(f, "field width \"{w}\" is too large (at most {max})"),
            NoServerForSinglets => f.write_str("no server so far declared to build singlets"),
            InvalidUpstrandName(n) => write!(f, "invalid upstrand name \"{n}\""),
            ReservedUpstrandName(n) => write!(f, "invalid upstrand name \"{n}\": reserved"),
            DuplicateUpstrand(n) => write!(f, "duplicate upstrand \"{n}\""),
            EmptyDirective => f.write_str("empty upstrand directive"),
            BadDirective(d) => write!(f, "bad upstrand directive \"{d}\""),
            DuplicateDirective(d) => write!(f, "duplicate upstrand directive \"{d}\""),
            BadTimeout(v) => write!(f, "bad timeout value: \"{v}\""),
            BadBlacklistInterval(v) => write!(f, "bad blacklist interval: \"{v}\""),
            MemberNotFound(n) => write!(f, "upstream \"{n}\" is not found"),
            NoMember(n) => write!(f, "no upstream registered in upstrand \"{n}\""),
            InvalidStatus(s) => write!(f, "invalid status \"{s}\""),
            InvalidFailoverUri(u) => {
                write!(f, "invalid failover URI \"{u}\": must start with \"/\"")
            }
            Regex(text) => f.write_str(text),
            InvalidVariableName(v) => write!(f, "invalid variable name \"{v}\""),
            EmptyDefaultUpstrand => {
                f.write_str("empty default upstrand in \"dynamic_upstrand\" directive")
            }
            Probe(text) => f.write_str(text),
            ApiDuplicate => f.write_str("\"upstreams_api\" directive is duplicate"),
            ApiParameter { param, why } => write!(
                f,
                "invalid parameter \"{param}\" in \"upstreams_api\" directive: {why}"
            ),
        }
    }
}

impl std::error::Error for ConfError {}

/// Shows a directive argument the way nginx quotes it in messages.
pub(crate) fn show(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_nginx_wording() {
        let cases: Vec<(ConfError, &str)> = vec![
            (
                ConfError::ArgumentCount("add_upstream"),
                "invalid number of arguments in \"add_upstream\" directive",
            ),
            (
                ConfError::InvalidParameter("x".into()),
                "invalid parameter \"x\"",
            ),
            (
                ConfError::AlreadyDeclared("backup"),
                "parameter \"backup\" has been already declared",
            ),
            (
                ConfError::WeightTooLarge {
                    weight: 3,
                    factor: 4,
                    upstream: "u".into(),
                },
                "weight 3 multiplied by 4 is too large in upstream \"u\"",
            ),
            (
                ConfError::NoServerForSinglets,
                "no server so far declared to build singlets",
            ),
            (
                ConfError::ReservedUpstrandName("addr".into()),
                "invalid upstrand name \"addr\": reserved",
            ),
            (
                ConfError::InvalidFailoverUri("f".into()),
                "invalid failover URI \"f\": must start with \"/\"",
            ),
            (ConfError::Regex("pcre said no".into()), "pcre said no"),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }
}
