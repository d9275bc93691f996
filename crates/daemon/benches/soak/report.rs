//! Classification of the clients' errors against the faults, and the report: a table of every
//! check with its value, its bound and its verdict, then the details a reader needs to judge it
//! (each explained error with the kill that explains it, each unexplained one whole).

use std::fmt::Write as _;

use crate::client::Stage;
use crate::traffic::ClientError;

/// Slack around a kill's time stamp (the clients' clocks and the kill command's own latency).
const SLACK_S: f64 = 0.25;

/// Why an error happened, when a fault explains it.
pub fn explain(e: &ClientError, worker_kills: &[(u32, f64)]) -> Option<String> {
    // An answer that came and was wrong (no stage), a timeout, a refused connection: nothing the
    // soak does explains those. A kill or a closing worker closes or resets the connection.
    e.stage?;
    if !e.closed {
        return None;
    }
    if let Some(w) = e.worker {
        if let Some((_, t)) = worker_kills
            .iter()
            .find(|(p, t)| *p == w && *t <= e.end_s + SLACK_S)
        {
            return Some(format!("its worker {w} was SIGKILLed at {t:.2} s"));
        }
        // A keep-alive connection the worker closed before it read the request: after a reload
        // an old worker closes its idle keep-alive connections and exits (HTTP clients send the
        // request again on a new connection, as this one did).
        if e.reused
            && e.bytes == 0
            && matches!(e.stage, Some(Stage::Send | Stage::Head))
            && matches!(e.worker_state, "shutting down" | "gone")
        {
            return Some(format!(
                "keep-alive connection closed before the request by worker {w}, {} after a reload (sent again)",
                e.worker_state
            ));
        }
        return None;
    }
    worker_kills
        .iter()
        .find(|(_, t)| *t >= e.start_s - SLACK_S && *t <= e.end_s + SLACK_S)
        .map(|(p, t)| format!("in flight when worker {p} was SIGKILLed at {t:.2} s (its worker was not known yet)"))
}

pub fn describe(e: &ClientError) -> String {
    format!(
        "{} {} {:.2}–{:.2} s: {}{} at {:?} after {} bytes, worker {:?} ({}), {}",
        e.kind,
        e.path,
        e.start_s,
        e.end_s,
        e.error,
        e.status
            .map(|s| format!(" (status {s})"))
            .unwrap_or_default(),
        e.stage,
        e.bytes,
        e.worker,
        e.worker_state,
        if e.reused {
            "reused connection"
        } else {
            "fresh connection"
        }
    )
}

/// One line of the table.
pub struct Row {
    pub check: String,
    pub value: String,
    pub bound: String,
    pub pass: bool,
}

impl Row {
    pub fn new(check: &str, value: impl Into<String>, bound: &str, pass: bool) -> Row {
        Row {
            check: check.into(),
            value: value.into(),
            bound: bound.into(),
            pass,
        }
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("| check | value | bound | verdict |\n|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            r.check,
            r.value,
            r.bound,
            if r.pass { "pass" } else { "**FAIL**" }
        );
    }
    s
}

/// Percentile (0–100) of unsorted values.
pub fn pct(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}
