//! Why a request to the module's live API failed ([`LiveApiError`]): each step its own kind, so
//! the live path tells an API that is down from one that refused a set, and a full zone (507) from
//! other refusals, without reading the text.

use super::ZoneTooSmall;

/// A failed request to the live API, or an address that is not one. `Display` is the text for
/// logs and outcomes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveApiError {
    /// `--live-api` is not an address the daemon takes.
    #[error("live API {given:?}: {why}")]
    Address { given: String, why: &'static str },
    #[error("the live API at {api} did not answer within {ms} ms")]
    Timeout { api: String, ms: u128 },
    #[error("cannot reach the live API at {api}: {error}")]
    Unreachable { api: String, error: String },
    #[error("HTTP handshake with the live API: {0}")]
    Handshake(String),
    #[error("building the request: {0}")]
    Request(String),
    #[error("the live API at {api} failed: {error}")]
    Exchange { api: String, error: String },
    #[error("reading the live API's answer: {0}")]
    Body(String),
    #[error("encoding the set: {0}")]
    Encode(String),
    /// The module answered an error status (`message`: its `error`, or the start of the body);
    /// a 507 that names the sizes carries them.
    #[error("{what}: HTTP {status}: {message}")]
    Status {
        what: String,
        status: u16,
        message: String,
        zone_too_small: Option<ZoneTooSmall>,
    },
    #[error("{what}: unexpected answer: {error}")]
    Answer { what: String, error: String },
    /// The read-back after a `PUT` found another set.
    #[error("GET {name} after the PUT shows a different set ({got} servers, {expected} expected)")]
    Differs {
        name: String,
        got: usize,
        expected: usize,
    },
    #[error(
        "the live API at {api} is read-only: write \"upstreams_api write=on;\" in its nginx \
         location and reload nginx"
    )]
    ReadOnly { api: String },
    /// The task that asked the API ended without an answer.
    #[error("the live API request did not finish: {0}")]
    Task(String),
}

impl LiveApiError {
    /// Whether the API did not answer at all (unreachable, timeout, a broken connection).
    pub fn is_down(&self) -> bool {
        matches!(
            self,
            LiveApiError::Timeout { .. }
                | LiveApiError::Unreachable { .. }
                | LiveApiError::Handshake(_)
                | LiveApiError::Exchange { .. }
                | LiveApiError::Body(_)
                | LiveApiError::Task(_)
        )
    }

    /// The sizes of a 507 that named them.
    pub fn zone_too_small(&self) -> Option<ZoneTooSmall> {
        match self {
            LiveApiError::Status { zone_too_small, .. } => *zone_too_small,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_answer;
    use super::*;
    use upstrand_core::live::render::PutView as PutAnswer;

    #[test]
    fn a_refusal_keeps_its_status_and_a_507_its_sizes() {
        let body = br#"{"error":"zone \"a\" too small","needed_bytes":123904,"zone_bytes":65536}"#;
        let e = parse_answer::<PutAnswer>(507, body, "PUT a").unwrap_err();
        assert_eq!(e.to_string(), "PUT a: HTTP 507: zone \"a\" too small");
        assert_eq!(
            e.zone_too_small(),
            Some(ZoneTooSmall {
                needed: 123_904,
                zone: 65_536
            })
        );
        assert!(!e.is_down());
        let e = parse_answer::<PutAnswer>(409, br#"{"error":"generation"}"#, "PUT a").unwrap_err();
        assert!(matches!(e, LiveApiError::Status { status: 409, .. }), "{e}");
        assert_eq!(e.zone_too_small(), None);
        let e = parse_answer::<PutAnswer>(200, b"{}", "PUT a").unwrap_err();
        assert!(matches!(e, LiveApiError::Answer { .. }), "{e}");
        let down = LiveApiError::Unreachable {
            api: "unix:/x.sock:/".into(),
            error: "refused".into(),
        };
        assert!(down.is_down());
        assert_eq!(
            down.to_string(),
            "cannot reach the live API at unix:/x.sock:/: refused"
        );
    }
}
