//! Status sets: the argument lists of `next_upstream_statuses` and `intercept_statuses`.

use std::fmt;

use crate::ConfError;

/// Who produced an answer that a walk looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A backend sent this status line.
    Backend,
    /// nginx produced the status itself because no backend answered (connection refused,
    /// reset, invalid header: 502; time-out: 504).
    Generated,
}

/// One upstream's final answer: the status of the last server nginx tried inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub origin: Origin,
}

impl Answer {
    pub fn backend(status: u16) -> Self {
        Answer {
            status,
            origin: Origin::Backend,
        }
    }

    pub fn generated(status: u16) -> Self {
        Answer {
            status,
            origin: Origin::Generated,
        }
    }
}

/// Lowest and highest status accepted in a status list (decision 7 of the spec).
pub const MIN_STATUS: u16 = 100;
pub const MAX_STATUS: u16 = 599;

/// A set of statuses with the special words `error`, `timeout` and `non_idempotent`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StatusSet {
    /// Bit `s - 100` is set when status `s` is in the set.
    codes: [u64; 8],
    /// `error`: an nginx-generated 502.
    pub error: bool,
    /// `timeout`: an nginx-generated 504.
    pub timeout: bool,
    /// `non_idempotent`: POST, LOCK and PATCH may move on after a backend answered.
    pub non_idempotent: bool,
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let codes: Vec<u16> = (MIN_STATUS..=MAX_STATUS)
            .filter(|s| self.has_code(*s))
            .collect();
        f.debug_struct("StatusSet")
            .field("codes", &codes)
            .field("error", &self.error)
            .field("timeout", &self.timeout)
            .field("non_idempotent", &self.non_idempotent)
            .finish()
    }
}

/// Which special words a status list accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `next_upstream_statuses`: everything, including `non_idempotent`.
    NextUpstream,
    /// `intercept_statuses`: codes, `4xx`, `5xx`, `error`, `timeout`.
    Intercept,
}

impl StatusSet {
    pub fn new() -> Self {
        Self::default()
    }

    fn set_code(&mut self, status: u16) {
        let bit = usize::from(status - MIN_STATUS);
        self.codes[bit / 64] |= 1 << (bit % 64);
    }

    /// True when the plain code `status` is in the set (ignores `error`/`timeout`).
    pub fn has_code(&self, status: u16) -> bool {
        if !(MIN_STATUS..=MAX_STATUS).contains(&status) {
            return false;
        }
        let bit = usize::from(status - MIN_STATUS);
        self.codes[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// True when nothing at all was listed.
    pub fn is_empty(&self) -> bool {
        self.codes.iter().all(|w| *w == 0) && !self.error && !self.timeout && !self.non_idempotent
    }

    /// Adds one word of a status list. Error text as nginx would word it: `invalid status "X"`.
    pub fn add_token(&mut self, token: &str, kind: ListKind) -> Result<(), ConfError> {
        match token {
            "4xx" => (400..500).for_each(|s| self.set_code(s)),
            "5xx" => (500..600).for_each(|s| self.set_code(s)),
            "error" => self.error = true,
            "timeout" => self.timeout = true,
            "non_idempotent" if kind == ListKind::NextUpstream => self.non_idempotent = true,
            _ => {
                let code =
                    parse_code(token).ok_or_else(|| ConfError::InvalidStatus(token.to_string()))?;
                self.set_code(code);
            }
        }
        Ok(())
    }

    /// Does this answer belong to the set? A plain code matches both origins; `error` matches an
    /// nginx-generated 502 and `timeout` an nginx-generated 504.
    pub fn matches(&self, answer: Answer) -> bool {
        if self.has_code(answer.status) {
            return true;
        }
        answer.origin == Origin::Generated
            && ((self.error && answer.status == 502) || (self.timeout && answer.status == 504))
    }
}

/// A status code: ASCII digits only, value 100–599.
fn parse_code(token: &str) -> Option<u16> {
    if token.is_empty() || token.len() > 3 || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let code: u16 = token.parse().ok()?;
    (MIN_STATUS..=MAX_STATUS).contains(&code).then_some(code)
}

/// Methods that nginx's `proxy_next_upstream` treats as non-idempotent.
pub fn is_non_idempotent_method(method: &str) -> bool {
    matches!(method, "POST" | "LOCK" | "PATCH")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(tokens: &[&str]) -> StatusSet {
        let mut s = StatusSet::new();
        for t in tokens {
            s.add_token(t, ListKind::NextUpstream).unwrap();
        }
        s
    }

    #[test]
    fn empty_set_matches_nothing() {
        let s = StatusSet::new();
        assert!(s.is_empty());
        for code in [100, 200, 404, 502, 504, 599] {
            assert!(!s.matches(Answer::backend(code)));
            assert!(!s.matches(Answer::generated(code)));
        }
    }

    #[test]
    fn exact_codes_match_both_origins() {
        let s = set(&["204", "502"]);
        assert!(s.matches(Answer::backend(204)));
        assert!(s.matches(Answer::backend(502)));
        assert!(s.matches(Answer::generated(502)));
        assert!(!s.matches(Answer::backend(503)));
        assert!(!s.matches(Answer::backend(200)));
        assert!(!s.is_empty());
    }

    #[test]
    fn class_words() {
        let s = set(&["4xx"]);
        assert!(s.matches(Answer::backend(400)));
        assert!(s.matches(Answer::backend(499)));
        assert!(!s.matches(Answer::backend(399)));
        assert!(!s.matches(Answer::backend(500)));
        let s = set(&["5xx"]);
        assert!(s.matches(Answer::backend(500)));
        assert!(s.matches(Answer::generated(504)));
        assert!(s.matches(Answer::backend(599)));
        assert!(!s.matches(Answer::backend(499)));
    }

    #[test]
    fn error_and_timeout_only_match_generated_answers() {
        let s = set(&["error"]);
        assert!(s.matches(Answer::generated(502)));
        assert!(!s.matches(Answer::backend(502)));
        assert!(!s.matches(Answer::generated(504)));
        let s = set(&["timeout"]);
        assert!(s.matches(Answer::generated(504)));
        assert!(!s.matches(Answer::backend(504)));
        assert!(!s.matches(Answer::generated(502)));
    }

    #[test]
    fn bounds_are_inclusive() {
        let s = set(&["100", "599"]);
        assert!(s.has_code(100));
        assert!(s.has_code(599));
        assert!(!s.has_code(99));
        assert!(!s.has_code(600));
    }

    #[test]
    fn invalid_statuses_are_rejected_with_nginx_wording() {
        let mut s = StatusSet::new();
        for bad in [
            "99", "600", "0", "1000", "abc", "", "5XX", "3xx", "+200", "20 0", "-500",
        ] {
            assert_eq!(
                s.add_token(bad, ListKind::NextUpstream)
                    .map_err(|e| e.to_string()),
                Err(format!("invalid status \"{bad}\"")),
            );
        }
        assert!(s.is_empty(), "a rejected token changes nothing");
    }

    #[test]
    fn non_idempotent_only_in_next_upstream_lists() {
        let mut s = StatusSet::new();
        s.add_token("non_idempotent", ListKind::NextUpstream)
            .unwrap();
        assert!(s.non_idempotent);
        let mut s = StatusSet::new();
        assert_eq!(
            s.add_token("non_idempotent", ListKind::Intercept),
            Err(ConfError::InvalidStatus("non_idempotent".to_string()))
        );
        s.add_token("timeout", ListKind::Intercept).unwrap();
        assert!(s.timeout);
    }

    #[test]
    fn methods() {
        for m in ["POST", "LOCK", "PATCH"] {
            assert!(is_non_idempotent_method(m));
        }
        for m in ["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "post"] {
            assert!(!is_non_idempotent_method(m));
        }
    }
}
