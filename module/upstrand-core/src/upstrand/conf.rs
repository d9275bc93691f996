//! The `upstrand NAME { ... }` block: directive-by-directive parsing and validation.
//!
//! The cdylib calls [`UpstrandBuilder::directive`] once per inner directive with nginx's argument
//! list (directive name first), the names of the upstreams defined so far, and a regex compiler
//! backed by nginx's own regex engine. Every error is a complete nginx-style message, returned
//! without changing the builder.

use super::status::{ListKind, StatusSet};
use super::time::parse_time_ms;
use super::vars::is_reserved_suffix;
use crate::ConfError;

/// One upstream of an upstrand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// `blacklist_interval=TIME` in milliseconds; `None` when the member is never blacklisted.
    pub blacklist_interval_ms: Option<u64>,
}

/// One `intercept_statuses` directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intercept {
    pub statuses: StatusSet,
    pub uri: String,
}

/// A complete, validated upstrand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstrandConf {
    pub name: String,
    pub normal: Vec<Member>,
    pub backup: Vec<Member>,
    pub start_random: bool,
    pub per_request: bool,
    pub next_statuses: StatusSet,
    /// `next_upstream_timeout` in milliseconds; 0 means no limit (as nginx's `proxy_next_upstream_timeout 0`).
    pub next_timeout_ms: u64,
    pub intercepts: Vec<Intercept>,
}

impl UpstrandConf {
    /// The first `intercept_statuses` directive whose list contains `answer`.
    pub fn intercept_for(&self, answer: super::status::Answer) -> Option<usize> {
        self.intercepts
            .iter()
            .position(|i| i.statuses.matches(answer))
    }
}

/// A compiled regex: answers whether a name matches (unanchored, as nginx's `ngx_regex_exec`).
pub type Matcher = Box<dyn Fn(&str) -> bool>;

/// Compiles a regex source; returns nginx's own error text when it does not compile.
pub type RegexCompiler<'a> = dyn FnMut(&str) -> Result<Matcher, String> + 'a;

/// Checks an upstrand name: it becomes part of a variable name (`$upstrand_NAME`), so only ASCII
/// letters, digits and `_` are allowed.
pub fn validate_name(name: &str) -> Result<(), ConfError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(ConfError::InvalidUpstrandName(name.to_string()));
    }
    if is_reserved_suffix(&name.to_ascii_lowercase()) {
        return Err(ConfError::ReservedUpstrandName(name.to_string()));
    }
    Ok(())
}

/// `duplicate upstrand "NAME"` when `name` is already taken (names compare case-insensitively, as
/// nginx variable names do).
pub fn check_unique<'a>(
    existing: impl IntoIterator<Item = &'a str>,
    name: &str,
) -> Result<(), ConfError> {
    if existing.into_iter().any(|e| e.eq_ignore_ascii_case(name)) {
        return Err(ConfError::DuplicateUpstrand(name.to_string()));
    }
    Ok(())
}

/// Collects the inner directives of one block.
#[derive(Debug)]
pub struct UpstrandBuilder {
    conf: UpstrandConf,
    order_seen: bool,
    timeout_seen: bool,
}

impl UpstrandBuilder {
    pub fn new(name: &str) -> Result<Self, ConfError> {
        validate_name(name)?;
        Ok(UpstrandBuilder {
            conf: UpstrandConf {
                name: name.to_string(),
                normal: Vec::new(),
                backup: Vec::new(),
                start_random: false,
                per_request: false,
                next_statuses: StatusSet::new(),
                next_timeout_ms: 0,
                intercepts: Vec::new(),
            },
            order_seen: false,
            timeout_seen: false,
        })
    }

    /// Handles one inner directive. `args[0]` is the directive name. `known` lists the upstreams
    /// defined so far, in definition order.
    pub fn directive(
        &mut self,
        args: &[&str],
        known: &[&str],
        compile: &mut RegexCompiler<'_>,
    ) -> Result<(), ConfError> {
        let Some((&name, params)) = args.split_first() else {
            return Err(ConfError::EmptyDirective);
        };
        match name {
            "upstream" => self.upstream(params, known, compile),
            "order" => self.order(params),
            "next_upstream_statuses" => {
                if params.is_empty() {
                    return Err(ConfError::ArgumentCount("next_upstream_statuses"));
                }
                let mut set = self.conf.next_statuses.clone();
                for p in params {
                    set.add_token(p, ListKind::NextUpstream)?;
                }
                self.conf.next_statuses = set;
                Ok(())
            }
            "next_upstream_timeout" => {
                if self.timeout_seen {
                    return Err(ConfError::DuplicateDirective("next_upstream_timeout"));
                }
                let [value] = params else {
                    return Err(ConfError::ArgumentCount("next_upstream_timeout"));
                };
                let ms =
                    parse_time_ms(value).ok_or_else(|| ConfError::BadTimeout(value.to_string()))?;
                self.conf.next_timeout_ms = ms;
                self.timeout_seen = true;
                Ok(())
            }
            "intercept_statuses" => {
                let Some((uri, statuses)) = params.split_last() else {
                    return Err(ConfError::ArgumentCount("intercept_statuses"));
                };
                if statuses.is_empty() {
                    return Err(ConfError::ArgumentCount("intercept_statuses"));
                }
                let mut set = StatusSet::new();
                for s in statuses {
                    set.add_token(s, ListKind::Intercept)?;
                }
                if !uri.starts_with('/') {
                    return Err(ConfError::InvalidFailoverUri(uri.to_string()));
                }
                self.conf.intercepts.push(Intercept {
                    statuses: set,
                    uri: uri.to_string(),
                });
                Ok(())
            }
            other => Err(ConfError::BadDirective(other.to_string())),
        }
    }

    fn order(&mut self, params: &[&str]) -> Result<(), ConfError> {
        if self.order_seen {
            return Err(ConfError::DuplicateDirective("order"));
        }
        if params.is_empty() {
            return Err(ConfError::ArgumentCount("order"));
        }
        let (mut start_random, mut per_request) = (false, false);
        for p in params {
            let (flag, word) = match *p {
                "start_random" => (&mut start_random, "start_random"),
                "per_request" => (&mut per_request, "per_request"),
                other => return Err(ConfError::InvalidParameter(other.to_string())),
            };
            if *flag {
                return Err(ConfError::AlreadyDeclared(word));
            }
            *flag = true;
        }
        self.conf.start_random = start_random;
        self.conf.per_request = per_request;
        self.order_seen = true;
        Ok(())
    }

    fn upstream(
        &mut self,
        params: &[&str],
        known: &[&str],
        compile: &mut RegexCompiler<'_>,
    ) -> Result<(), ConfError> {
        let Some((&target, options)) = params.split_first() else {
            return Err(ConfError::ArgumentCount("upstream"));
        };
        let mut backup = false;
        let mut interval: Option<u64> = None;
        for opt in options {
            if *opt == "backup" {
                if backup {
                    return Err(ConfError::AlreadyDeclared("backup"));
                }
                backup = true;
            } else if let Some(value) = opt.strip_prefix("blacklist_interval=") {
                if interval.is_some() {
                    return Err(ConfError::AlreadyDeclared("blacklist_interval"));
                }
                let ms = parse_time_ms(value)
                    .ok_or_else(|| ConfError::BadBlacklistInterval(value.to_string()))?;
                interval = Some(ms);
            } else {
                return Err(ConfError::InvalidParameter(opt.to_string()));
            }
        }

        let names: Vec<&str> = if let Some(pattern) = target.strip_prefix('~') {
            if pattern.is_empty() {
                return Err(ConfError::InvalidParameter(target.to_string()));
            }
            let matcher = compile(pattern).map_err(ConfError::Regex)?;
            known.iter().copied().filter(|n| matcher(n)).collect()
        } else {
            if target.is_empty() {
                return Err(ConfError::MemberNotFound(target.to_string()));
            }
            // nginx compares upstream names case-insensitively.
            match known.iter().find(|k| k.eq_ignore_ascii_case(target)) {
                Some(k) => vec![*k],
                None => return Err(ConfError::MemberNotFound(target.to_string())),
            }
        };

        for n in names {
            let taken = self
                .conf
                .normal
                .iter()
                .chain(&self.conf.backup)
                .any(|m| m.name == n);
            if taken {
                continue;
            }
            let member = Member {
                name: n.to_string(),
                blacklist_interval_ms: interval,
            };
            if backup {
                self.conf.backup.push(member);
            } else {
                self.conf.normal.push(member);
            }
        }
        Ok(())
    }

    /// Ends the block: at least one upstream is required.
    pub fn finish(self) -> Result<UpstrandConf, ConfError> {
        if self.conf.normal.is_empty() && self.conf.backup.is_empty() {
            return Err(ConfError::NoMember(self.conf.name));
        }
        Ok(self.conf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstrand::status::Answer;

    /// A tiny regex stand-in for tests: `^prefix` or substring; `(` does not compile.
    fn compile(pattern: &str) -> Result<Matcher, String> {
        if pattern.contains('(') {
            return Err(format!("pcre_compile() failed: missing ) in \"{pattern}\""));
        }
        let p = pattern.to_string();
        Ok(Box::new(move |name: &str| match p.strip_prefix('^') {
            Some(prefix) => name.starts_with(prefix),
            None => name.contains(p.as_str()),
        }))
    }

    const KNOWN: &[&str] = &[
        "u01",
        "u02",
        "b01",
        "b02",
        "u1_single_1",
        "u1_single_2",
        "x",
    ];

    /// Builds one block; errors as nginx prints them.
    fn build(lines: &[&[&str]]) -> Result<UpstrandConf, String> {
        let mut b = UpstrandBuilder::new("us1").map_err(|e| e.to_string())?;
        for l in lines {
            b.directive(l, KNOWN, &mut compile)
                .map_err(|e| e.to_string())?;
        }
        b.finish().map_err(|e| e.to_string())
    }

    fn names(ms: &[Member]) -> Vec<&str> {
        ms.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn seed_example_parses() {
        let c = build(&[
            &["upstream", "~^u0", "blacklist_interval=60s"],
            &["upstream", "b01", "backup"],
            &["order", "start_random"],
            &[
                "next_upstream_statuses",
                "error",
                "timeout",
                "non_idempotent",
                "204",
                "5xx",
            ],
            &["next_upstream_timeout", "60s"],
            &["intercept_statuses", "5xx", "/Internal/failover"],
        ])
        .unwrap();
        assert_eq!(names(&c.normal), ["u01", "u02"]);
        assert!(c
            .normal
            .iter()
            .all(|m| m.blacklist_interval_ms == Some(60_000)));
        assert_eq!(names(&c.backup), ["b01"]);
        assert_eq!(c.backup[0].blacklist_interval_ms, None);
        assert!(c.start_random && !c.per_request);
        assert!(c.next_statuses.error && c.next_statuses.timeout && c.next_statuses.non_idempotent);
        assert!(c.next_statuses.has_code(204) && c.next_statuses.has_code(503));
        assert!(!c.next_statuses.has_code(404));
        assert_eq!(c.next_timeout_ms, 60_000);
        assert_eq!(c.intercepts.len(), 1);
        assert_eq!(c.intercepts[0].uri, "/Internal/failover");
        assert_eq!(c.intercept_for(Answer::backend(503)), Some(0));
        assert_eq!(c.intercept_for(Answer::backend(404)), None);
    }

    #[test]
    fn defaults() {
        let c = build(&[&["upstream", "u01"]]).unwrap();
        assert!(!c.start_random && !c.per_request);
        assert!(c.next_statuses.is_empty());
        assert_eq!(c.next_timeout_ms, 0);
        assert!(c.intercepts.is_empty());
        assert!(c.backup.is_empty());
    }

    #[test]
    fn regex_members_in_definition_order_without_duplicates() {
        let c = build(&[
            &["upstream", "u02"],
            &["upstream", "~^u"],
            &["upstream", "~single", "backup"],
            &["upstream", "u01", "backup"],
        ])
        .unwrap();
        assert_eq!(
            names(&c.normal),
            ["u02", "u01", "u1_single_1", "u1_single_2"]
        );
        assert!(c.backup.is_empty());
    }

    #[test]
    fn singlets_no_round_robin_example() {
        let c = build(&[
            &["upstream", "~^u1_single_", "blacklist_interval=60s"],
            &["order", "per_request"],
            &[
                "next_upstream_statuses",
                "error",
                "timeout",
                "non_idempotent",
                "5xx",
            ],
            &["intercept_statuses", "5xx", "/Internal/failover"],
        ])
        .unwrap();
        assert_eq!(names(&c.normal), ["u1_single_1", "u1_single_2"]);
        assert!(c.per_request && !c.start_random);
    }

    #[test]
    fn upstream_names_match_case_insensitively_and_keep_definition_spelling() {
        let c = build(&[&["upstream", "U01"]]).unwrap();
        assert_eq!(names(&c.normal), ["u01"]);
    }

    #[test]
    fn statuses_accumulate_and_intercepts_keep_order() {
        let c = build(&[
            &["upstream", "u01"],
            &["next_upstream_statuses", "502"],
            &["next_upstream_statuses", "404"],
            &["intercept_statuses", "502", "/a"],
            &["intercept_statuses", "5xx", "404", "/b"],
        ])
        .unwrap();
        assert!(c.next_statuses.has_code(502) && c.next_statuses.has_code(404));
        assert_eq!(c.intercept_for(Answer::backend(502)), Some(0));
        assert_eq!(c.intercept_for(Answer::backend(503)), Some(1));
        assert_eq!(c.intercept_for(Answer::backend(404)), Some(1));
        assert_eq!(c.intercept_for(Answer::backend(200)), None);
    }

    #[test]
    fn order_combinations() {
        let c = build(&[
            &["upstream", "u01"],
            &["order", "per_request", "start_random"],
        ])
        .unwrap();
        assert!(c.per_request && c.start_random);
    }

    #[test]
    fn error_table() {
        let u = &["upstream", "u01"][..];
        let cases: &[(&[&[&str]], &str)] = &[
            (&[u, &["foo", "bar"]], "bad upstrand directive \"foo\""),
            (
                &[u, &["order", "start_random"], &["order", "per_request"]],
                "duplicate upstrand directive \"order\"",
            ),
            (
                &[
                    u,
                    &["next_upstream_timeout", "1s"],
                    &["next_upstream_timeout", "2s"],
                ],
                "duplicate upstrand directive \"next_upstream_timeout\"",
            ),
            (
                &[u, &["next_upstream_statuses", "5xx", "600"]],
                "invalid status \"600\"",
            ),
            (
                &[u, &["next_upstream_statuses", "99"]],
                "invalid status \"99\"",
            ),
            (
                &[u, &["next_upstream_statuses", "oops"]],
                "invalid status \"oops\"",
            ),
            (
                &[u, &["intercept_statuses", "abc", "/f"]],
                "invalid status \"abc\"",
            ),
            (
                &[u, &["intercept_statuses", "non_idempotent", "/f"]],
                "invalid status \"non_idempotent\"",
            ),
            (
                &[u, &["intercept_statuses", "5xx", "f"]],
                "invalid failover URI \"f\": must start with \"/\"",
            ),
            (
                &[u, &["next_upstream_timeout", "1x"]],
                "bad timeout value: \"1x\"",
            ),
            (
                &[u, &["next_upstream_timeout", "-1"]],
                "bad timeout value: \"-1\"",
            ),
            (
                &[&["upstream", "u01", "blacklist_interval=abc"]],
                "bad blacklist interval: \"abc\"",
            ),
            (
                &[&["upstream", "u01", "blacklist_interval="]],
                "bad blacklist interval: \"\"",
            ),
            (&[&["upstream", "nope"]], "upstream \"nope\" is not found"),
            (
                &[&["upstream", "u01", "backupx"]],
                "invalid parameter \"backupx\"",
            ),
            (
                &[&["upstream", "u01", "backup", "backup"]],
                "parameter \"backup\" has been already declared",
            ),
            (
                &[&[
                    "upstream",
                    "u01",
                    "blacklist_interval=1s",
                    "blacklist_interval=2s",
                ]],
                "parameter \"blacklist_interval\" has been already declared",
            ),
            (
                &[&["upstream", "~(u"]],
                "pcre_compile() failed: missing ) in \"(u\"",
            ),
            (&[&["upstream", "~"]], "invalid parameter \"~\""),
            (
                &[&["upstream", "~^zzz"]],
                "no upstream registered in upstrand \"us1\"",
            ),
            (
                &[&["upstream"]],
                "invalid number of arguments in \"upstream\" directive",
            ),
            (
                &[u, &["order"]],
                "invalid number of arguments in \"order\" directive",
            ),
            (&[u, &["order", "random"]], "invalid parameter \"random\""),
            (
                &[u, &["order", "per_request", "per_request"]],
                "parameter \"per_request\" has been already declared",
            ),
            (
                &[u, &["next_upstream_statuses"]],
                "invalid number of arguments in \"next_upstream_statuses\" directive",
            ),
            (
                &[u, &["next_upstream_timeout"]],
                "invalid number of arguments in \"next_upstream_timeout\" directive",
            ),
            (
                &[u, &["next_upstream_timeout", "1s", "2s"]],
                "invalid number of arguments in \"next_upstream_timeout\" directive",
            ),
            (
                &[u, &["intercept_statuses", "/f"]],
                "invalid number of arguments in \"intercept_statuses\" directive",
            ),
            (&[], "no upstream registered in upstrand \"us1\""),
        ];
        for (lines, want) in cases {
            assert_eq!(build(lines).unwrap_err(), *want, "lines {lines:?}");
        }
    }

    #[test]
    fn failed_directive_changes_nothing() {
        let mut b = UpstrandBuilder::new("us1").unwrap();
        b.directive(&["upstream", "u01"], KNOWN, &mut compile)
            .unwrap();
        b.directive(&["next_upstream_statuses", "502"], KNOWN, &mut compile)
            .unwrap();
        assert!(b
            .directive(
                &["next_upstream_statuses", "404", "bad"],
                KNOWN,
                &mut compile
            )
            .is_err());
        assert!(b
            .directive(&["order", "per_request", "x"], KNOWN, &mut compile)
            .is_err());
        let c = b.finish().unwrap();
        assert!(!c.next_statuses.has_code(404));
        assert!(!c.per_request);
    }

    #[test]
    fn names_and_uniqueness() {
        assert!(validate_name("us1").is_ok());
        assert!(validate_name("Us_2").is_ok());
        for bad in ["", "us-1", "us.1", "us 1", "$us"] {
            assert_eq!(
                validate_name(bad),
                Err(ConfError::InvalidUpstrandName(bad.to_string()))
            );
        }
        for reserved in ["addr", "PATH", "status"] {
            assert_eq!(
                validate_name(reserved).unwrap_err().to_string(),
                format!("invalid upstrand name \"{reserved}\": reserved")
            );
        }
        assert!(UpstrandBuilder::new("a-b").is_err());
        assert_eq!(
            check_unique(["us1", "us2"], "US2"),
            Err(ConfError::DuplicateUpstrand("US2".into()))
        );
        assert!(check_unique(["us1", "us2"], "us3").is_ok());
    }
}
