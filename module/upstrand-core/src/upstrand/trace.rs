//! The walk decisions as text for nginx's debug log (`error_log ... debug`): which upstream a
//! walk starts at, why it moved on, why it stopped. Formatting only; the cdylib decides whether
//! the debug level is on before it asks for a line.

use super::select::{Cycle, FinalReason};
use super::status::{Answer, Origin};

fn cycle_word(cycle: Cycle) -> &'static str {
    match cycle {
        Cycle::Normal => "normal",
        Cycle::Backup => "backup",
    }
}

fn answer_text(a: Answer) -> String {
    let who = match a.origin {
        Origin::Backend => "sent by the backend",
        Origin::Generated => "made by nginx",
    };
    format!("{} ({who})", a.status)
}

impl FinalReason {
    /// Why a walk stopped, in words.
    pub fn describe(self) -> &'static str {
        match self {
            FinalReason::NotListed => "the status is not in next_upstream_statuses",
            FinalReason::NonIdempotent => {
                "a backend answered a POST, LOCK or PATCH request and next_upstream_statuses \
                 has no non_idempotent"
            }
            FinalReason::TimedOut => "next_upstream_timeout has expired",
            FinalReason::Exhausted => "no upstream is left in the normal and backup cycles",
        }
    }
}

/// `upstrand "us1": walk starts at upstream "u01" (normal cycle)`.
pub fn started(upstrand: &str, member: &str, cycle: Cycle) -> String {
    format!(
        "upstrand \"{upstrand}\": walk starts at upstream \"{member}\" ({} cycle)",
        cycle_word(cycle)
    )
}

/// `upstrand "us1": upstream "u01" answered 503 (sent by the backend), listed in
/// next_upstream_statuses: moving on to upstream "u02" (normal cycle)`.
pub fn moved(upstrand: &str, from: &str, answer: Answer, to: &str, cycle: Cycle) -> String {
    format!(
        "upstrand \"{upstrand}\": upstream \"{from}\" answered {}, listed in \
         next_upstream_statuses: moving on to upstream \"{to}\" ({} cycle)",
        answer_text(answer),
        cycle_word(cycle)
    )
}

/// `upstrand "us1": walk stops at upstream "u02" with 200 (sent by the backend): the status is
/// not in next_upstream_statuses; delivering this answer` (or `; intercepted by "/failover"`).
pub fn stopped(
    upstrand: &str,
    at: &str,
    answer: Answer,
    reason: FinalReason,
    intercept_uri: Option<&str>,
) -> String {
    let outcome = match intercept_uri {
        Some(uri) => format!("intercepted by \"{uri}\" (intercept_statuses)"),
        None => "delivering this answer".to_string(),
    };
    format!(
        "upstrand \"{upstrand}\": walk stops at upstream \"{at}\" with {}: {}; {outcome}",
        answer_text(answer),
        reason.describe()
    )
}

/// `upstrand "us1": the next step could not start (see the previous message); the answer of
/// upstream "u01" is final`.
pub fn spawn_failed(upstrand: &str, at: &str) -> String {
    format!(
        "upstrand \"{upstrand}\": the next step could not start (see the previous message); the \
         answer of upstream \"{at}\" is final"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_upstrand_upstream_and_reason() {
        assert_eq!(
            started("us1", "u01", Cycle::Normal),
            "upstrand \"us1\": walk starts at upstream \"u01\" (normal cycle)"
        );
        assert_eq!(
            moved("us1", "u01", Answer::generated(502), "b01", Cycle::Backup),
            "upstrand \"us1\": upstream \"u01\" answered 502 (made by nginx), listed in \
             next_upstream_statuses: moving on to upstream \"b01\" (backup cycle)"
        );
        assert_eq!(
            stopped(
                "us1",
                "u02",
                Answer::backend(200),
                FinalReason::NotListed,
                None
            ),
            "upstrand \"us1\": walk stops at upstream \"u02\" with 200 (sent by the backend): \
             the status is not in next_upstream_statuses; delivering this answer"
        );
        let s = stopped(
            "us1",
            "u02",
            Answer::backend(503),
            FinalReason::Exhausted,
            Some("/failover"),
        );
        assert!(s.ends_with("no upstream is left in the normal and backup cycles; intercepted by \"/failover\" (intercept_statuses)"), "{s}");
        for r in [
            FinalReason::NotListed,
            FinalReason::NonIdempotent,
            FinalReason::TimedOut,
            FinalReason::Exhausted,
        ] {
            assert!(!r.describe().is_empty());
        }
    }
}
