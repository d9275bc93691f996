//! A binding's live settings: the module's `probe` directive parameters, rendered in
//! live mode as `    probe <params>;` in the upstream block, and `drain_secs`, how long a target
//! that left discovery is drained before it is removed (the engine's graceful removal).
//!
//! The check of the parameters is deliberately light: it refuses what is obviously not a list of
//! `key=value` words or flags (empty, a `;`, a brace, a quote, a comment, a control character, a
//! word that is not `name` or `name=value`) so that the line it becomes is one simple directive;
//! the parameters themselves are the module's to judge (`nginx -t`, `docs/directives.md`).

use std::fmt;

use crate::ExtraDirective;

/// Longest `probe` parameter text accepted (bytes).
pub const MAX_PROBE_LEN: usize = 512;
/// Longest `drain_secs` accepted (one day).
pub const MAX_DRAIN_SECS: u64 = 86_400;

/// The parameters of the module's `probe` directive, e.g. `uri=/healthz interval=1s fails=2`:
/// whitespace-separated words, each `name` or `name=value` (name: lower-case letters, digits,
/// `_`; value: printable, without `;`, braces, quotes, `#` or `\`). Stored trimmed, words
/// separated by one space.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Probe(String);

/// Why a text is not acceptable `probe` parameters. The texts name the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("probe is empty: give the probe directive's parameters, e.g. \"uri=/healthz interval=1s\", or leave the field out")]
    Empty,
    #[error("probe is {len} bytes long; the limit is {MAX_PROBE_LEN}")]
    TooLong { len: usize },
    #[error("probe contains {0:?}: give the parameters only (no \";\", braces, quotes, \"#\", \"\\\" or control characters); the daemon writes \"probe ...;\" itself")]
    BadChar(char),
    #[error("probe parameter {0:?} is not a word like \"name\" or \"name=value\"")]
    BadWord(String),
}

impl Probe {
    /// Checks `s` and keeps its words, one space apart.
    pub fn parse(s: &str) -> Result<Probe, ProbeError> {
        if s.len() > MAX_PROBE_LEN {
            return Err(ProbeError::TooLong { len: s.len() });
        }
        if let Some(c) = s.chars().find(|c| {
            (c.is_control() && *c != '\t')
                || matches!(c, ';' | '{' | '}' | '"' | '\'' | '#' | '\\' | '$')
        }) {
            return Err(ProbeError::BadChar(c));
        }
        let words: Vec<&str> = s.split_whitespace().collect();
        if words.is_empty() {
            return Err(ProbeError::Empty);
        }
        for w in &words {
            let (name, value) = match w.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (*w, None),
            };
            let name_ok = !name.is_empty()
                && name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            let value_ok = value.is_none_or(|v| !v.is_empty() && !v.contains('='));
            if !name_ok || !value_ok {
                return Err(ProbeError::BadWord(w.to_string()));
            }
        }
        Ok(Probe(words.join(" ")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The line's directive, `probe <params>;`.
    pub fn directive(&self) -> ExtraDirective {
        ExtraDirective::parse(&format!("probe {};", self.0))
            .expect("checked parameters make one simple directive")
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_kept_one_space_apart() {
        let p = Probe::parse("  uri=/healthz   interval=1s\tfails=2 mandatory ").unwrap();
        assert_eq!(p.as_str(), "uri=/healthz interval=1s fails=2 mandatory");
        assert_eq!(
            p.directive().to_string(),
            "probe uri=/healthz interval=1s fails=2 mandatory;"
        );
    }

    #[test]
    fn obviously_malformed_parameters_are_refused() {
        assert_eq!(Probe::parse(" "), Err(ProbeError::Empty));
        assert_eq!(Probe::parse("uri=/; reload"), Err(ProbeError::BadChar(';')));
        assert_eq!(Probe::parse("uri=/ }"), Err(ProbeError::BadChar('}')));
        assert_eq!(Probe::parse("a\nb"), Err(ProbeError::BadChar('\n')));
        assert_eq!(Probe::parse("uri=\"/x\""), Err(ProbeError::BadChar('"')));
        assert_eq!(
            Probe::parse("interval= 1s"),
            Err(ProbeError::BadWord("interval=".into()))
        );
        assert_eq!(Probe::parse("=1s"), Err(ProbeError::BadWord("=1s".into())));
        assert_eq!(
            Probe::parse("Uri=/x"),
            Err(ProbeError::BadWord("Uri=/x".into()))
        );
        assert_eq!(
            Probe::parse("a=b=c"),
            Err(ProbeError::BadWord("a=b=c".into()))
        );
        assert!(matches!(
            Probe::parse(&"x".repeat(MAX_PROBE_LEN + 1)),
            Err(ProbeError::TooLong { .. })
        ));
    }
}
