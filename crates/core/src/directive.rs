//! Extra directives a person adds to a binding (e.g. `keepalive 32;`). Each one becomes a line of
//! the generated upstream block, so each must be one simple nginx directive and nothing more. A
//! binding's servers come from its targets only: `server` is refused as an extra directive (the
//! daemon could neither show nor update such a server through the live API).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest accepted extra directive, in bytes.
pub const MAX_DIRECTIVE_LEN: usize = 1024;

/// One simple nginx directive ending in `;`: a name (letters, digits, `_`) and arguments; no block
/// (`{`, `}`), no comment (`#`), no second directive, no newline, no unclosed quote, no `include`,
/// no `server`.
/// Surrounding spaces and tabs are trimmed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExtraDirective(String);

/// Why a text is not an acceptable extra directive. The texts name the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectiveError {
    #[error("extra directive is empty")]
    Empty,
    #[error("extra directive is {len} bytes long; the limit is {MAX_DIRECTIVE_LEN}")]
    TooLong { len: usize },
    #[error("extra directive contains a line break; give one directive per entry")]
    Newline,
    #[error("extra directive contains a control character")]
    ControlChar,
    #[error("extra directive must end with \";\"")]
    MissingSemicolon,
    #[error("extra directive contains {0:?}; blocks are not allowed, only simple directives")]
    Brace(char),
    #[error("extra directive contains \"#\"; comments are not allowed")]
    Comment,
    #[error("extra directive contains more than one \";\"; give one directive per entry")]
    MultipleDirectives,
    #[error("extra directive has a quote that does not close")]
    UnclosedQuote,
    #[error("extra directive has a backslash outside quotes")]
    Backslash,
    #[error("extra directive \"include\" is not allowed")]
    Include,
    #[error(
        "extra directive \"server\" is not allowed: a binding's servers come from its targets"
    )]
    Server,
    #[error("extra directive must start with a directive name (letters, digits, \"_\")")]
    BadName,
}

impl ExtraDirective {
    /// Checks `s` and wraps it (trimmed of surrounding spaces and tabs).
    pub fn parse(s: &str) -> Result<ExtraDirective, DirectiveError> {
        if s.len() > MAX_DIRECTIVE_LEN {
            return Err(DirectiveError::TooLong { len: s.len() });
        }
        if s.contains(['\n', '\r']) {
            return Err(DirectiveError::Newline);
        }
        if s.chars().any(|c| c.is_control() && c != '\t') {
            return Err(DirectiveError::ControlChar);
        }
        let s = s.trim_matches([' ', '\t']);
        if s.is_empty() {
            return Err(DirectiveError::Empty);
        }
        if let Some(c) = s.chars().find(|c| matches!(c, '{' | '}')) {
            return Err(DirectiveError::Brace(c));
        }
        if s.contains('#') {
            return Err(DirectiveError::Comment);
        }
        // Quotes: a quote opens a quoted part that a matching quote closes; inside quotes a
        // backslash escapes the next character. Outside quotes nginx would let a backslash escape
        // the final ";" and swallow the next line, so it is refused.
        let mut quote: Option<char> = None;
        let mut escaped = false;
        for c in s.chars() {
            if escaped {
                escaped = false;
            } else if c == '\\' && quote.is_none() {
                return Err(DirectiveError::Backslash);
            } else if c == '\\' {
                escaped = true;
            } else if let Some(q) = quote {
                if c == q {
                    quote = None;
                }
            } else if c == '"' || c == '\'' {
                quote = Some(c);
            }
        }
        if quote.is_some() || escaped {
            return Err(DirectiveError::UnclosedQuote);
        }
        let Some(body) = s.strip_suffix(';') else {
            return Err(DirectiveError::MissingSemicolon);
        };
        if body.contains(';') {
            return Err(DirectiveError::MultipleDirectives);
        }
        let name: &str = body.split([' ', '\t']).next().unwrap_or("");
        if name.is_empty()
            || !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(DirectiveError::BadName);
        }
        if name.eq_ignore_ascii_case("include") {
            return Err(DirectiveError::Include);
        }
        if name.eq_ignore_ascii_case("server") {
            return Err(DirectiveError::Server);
        }
        Ok(ExtraDirective(s.to_string()))
    }

    /// The directive as text, ending in `;`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ExtraDirective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ExtraDirective {
    type Err = DirectiveError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ExtraDirective::parse(s)
    }
}

impl TryFrom<String> for ExtraDirective {
    type Error = DirectiveError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ExtraDirective::parse(&s)
    }
}

impl From<ExtraDirective> for String {
    fn from(d: ExtraDirective) -> String {
        d.0
    }
}
