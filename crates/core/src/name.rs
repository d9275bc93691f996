//! The upstream name a person chooses for a binding. It names the nginx upstream and the file
//! `upstreams/<name>.conf`, so it is checked strictly.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest accepted upstream name, in characters.
pub const MAX_NAME_LEN: usize = 128;

/// A valid upstream name: ASCII letters, digits, `_`, `-`, `.`; 1 to 128 characters; not starting
/// with `.` (so never `.`/`..`, a hidden file, or a path).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UpstreamName(String);

/// Why a text is not a valid upstream name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("upstream name is empty")]
    Empty,
    #[error("upstream name is {len} characters long; the limit is {MAX_NAME_LEN}")]
    TooLong { len: usize },
    #[error("upstream name must not start with \".\"")]
    LeadingDot,
    #[error(
        "upstream name contains {ch:?} at position {position}; use letters, digits, \"_\", \"-\" and \".\" only"
    )]
    BadChar { ch: char, position: usize },
}

impl UpstreamName {
    /// Checks `s` and wraps it. The error names the problem; nothing is trimmed or changed.
    pub fn parse(s: &str) -> Result<UpstreamName, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        let len = s.chars().count();
        if len > MAX_NAME_LEN {
            return Err(NameError::TooLong { len });
        }
        if s.starts_with('.') {
            return Err(NameError::LeadingDot);
        }
        if let Some((position, ch)) = s
            .chars()
            .enumerate()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(NameError::BadChar { ch, position });
        }
        Ok(UpstreamName(s.to_string()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The file name inside `upstreams/`: `<name>.conf`.
    pub fn file_name(&self) -> String {
        format!("{}.conf", self.0)
    }
}

impl fmt::Display for UpstreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for UpstreamName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UpstreamName::parse(s)
    }
}

impl TryFrom<String> for UpstreamName {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        UpstreamName::parse(&s)
    }
}

impl From<UpstreamName> for String {
    fn from(n: UpstreamName) -> String {
        n.0
    }
}

impl AsRef<str> for UpstreamName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
