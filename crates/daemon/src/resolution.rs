//! From a plugin's answer to the file it would produce. One path for the three places that take
//! an answer that far: a refresh ([`crate::engine`]), a test resolution (`POST /api/v1/resolve`)
//! and the `tributary resolve` dry run ([`crate::dry_run`]).
//!
//! What a plugin sends is bounded before it is kept: an outcome records at most
//! [`MAX_DROPPED_KEPT`] dropped targets (each cut to [`MAX_DROPPED_TARGET_BYTES`] of JSON) plus one
//! line counting the rest by reason, so an answer with 100,000 invalid targets costs the store and
//! the memory of the history as much as one with 21.

use serde_json::Value;
use tributary_core::UpstreamName;
use tributary_core::{render, summarize_dropped, validate, Dropped, ExtraDirective, Target};
use tributary_protocol::ResolveResult;
use tributary_store::DroppedRecord;

/// Most dropped targets an outcome keeps (the rest are counted in one more record).
pub const MAX_DROPPED_KEPT: usize = 20;
/// Longest dropped target kept as JSON; a longer one is kept as a note of its size.
pub const MAX_DROPPED_TARGET_BYTES: usize = 512;

/// A plugin answer validated, canonicalised and rendered.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub ttl_seconds: u64,
    /// The valid targets in canonical order.
    pub targets: Vec<Target>,
    /// What was dropped, with reasons, in answer order.
    pub dropped: Vec<Dropped>,
    /// The bytes of `upstreams/<name>.conf`; `None` when no target is valid (nothing may be
    /// written: an upstream without servers is invalid nginx).
    pub rendered: Option<String>,
    answer_was_empty: bool,
}

impl Resolved {
    pub fn new(
        name: &UpstreamName,
        directives: &[ExtraDirective],
        answer: &ResolveResult,
    ) -> Resolved {
        let v = validate(&answer.targets);
        let rendered = (!v.targets.is_empty()).then(|| render(name, &v.targets, directives));
        Resolved {
            ttl_seconds: answer.ttl_seconds,
            targets: v.targets,
            dropped: v.dropped,
            rendered,
            answer_was_empty: answer.targets.is_empty(),
        }
    }

    /// Why nothing can be written, when no target is valid (`None` otherwise).
    pub fn no_target_reason(&self) -> Option<String> {
        if self.rendered.is_some() {
            None
        } else if self.answer_was_empty {
            Some("the service has no servers right now".to_string())
        } else {
            Some(format!(
                "no valid target ({})",
                summarize_dropped(&self.dropped)
            ))
        }
    }

    /// "N dropped: reasons" when a file was rendered despite dropped targets.
    pub fn dropped_note(&self) -> Option<String> {
        (self.rendered.is_some() && !self.dropped.is_empty())
            .then(|| summarize_dropped(&self.dropped))
    }

    /// The dropped targets as the store and the API show them: the first [`MAX_DROPPED_KEPT`]
    /// (each at most [`MAX_DROPPED_TARGET_BYTES`] of JSON), then, when there were more, one record
    /// whose target is `{"not_kept": N}` and whose reason counts those N by reason.
    pub fn dropped_records(&self) -> Vec<DroppedRecord> {
        let mut out: Vec<DroppedRecord> = self
            .dropped
            .iter()
            .take(MAX_DROPPED_KEPT)
            .map(|d| DroppedRecord {
                target: bounded_target(&d.target),
                reason: d.reason.to_string(),
            })
            .collect();
        if self.dropped.len() > MAX_DROPPED_KEPT {
            let rest = &self.dropped[MAX_DROPPED_KEPT..];
            let summary = summarize_dropped(rest);
            let reasons = summary.split_once(": ").map_or("", |(_, r)| r);
            out.push(DroppedRecord {
                target: serde_json::json!({ NOT_KEPT: rest.len() }),
                reason: format!("{} more not kept: {reasons}", rest.len()),
            });
        }
        out
    }

    /// The valid targets as shown to a person, with their plugin's display tags.
    pub fn kept_with_tags(&self, answer: &ResolveResult) -> Vec<Value> {
        crate::tags::kept_with_tags(&self.targets, &answer.targets)
    }
}

/// Member of the record that counts the dropped targets not kept.
pub const NOT_KEPT: &str = "not_kept";

/// How many targets were dropped in all, from the records of [`Resolved::dropped_records`].
pub fn dropped_total(records: &[DroppedRecord]) -> usize {
    records
        .iter()
        .map(|d| match d.target.get(NOT_KEPT).and_then(Value::as_u64) {
            Some(n) if d.target.as_object().is_some_and(|o| o.len() == 1) => n as usize,
            _ => 1,
        })
        .sum()
}

/// `target` itself when its JSON is short, else a note of its size.
fn bounded_target(target: &Value) -> Value {
    let len = serde_json::to_string(target).map_or(0, |t| t.len());
    if len <= MAX_DROPPED_TARGET_BYTES {
        target.clone()
    } else {
        Value::String(format!("<a target of {len} bytes, not kept>"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resolved(targets: Value) -> Resolved {
        let answer: ResolveResult =
            serde_json::from_value(json!({"targets": targets, "ttl_seconds": 7})).unwrap();
        let name = UpstreamName::parse("api").unwrap();
        let directives = [ExtraDirective::parse("keepalive 8;").unwrap()];
        Resolved::new(&name, &directives, &answer)
    }

    #[test]
    fn valid_targets_render_and_note_what_was_dropped() {
        let r = resolved(json!([
            {"address": "10.0.0.2", "port": 80, "weight": 2},
            {"address": "10.0.0.1", "port": 0}
        ]));
        assert_eq!(r.ttl_seconds, 7);
        assert_eq!(
            r.rendered.as_deref(),
            Some("# generated by tributary\nupstream api {\n    server 10.0.0.2:80 weight=2;\n    keepalive 8;\n}\n")
        );
        assert_eq!(r.no_target_reason(), None);
        assert_eq!(
            r.dropped_note().as_deref(),
            Some("1 dropped: port out of range")
        );
        assert_eq!(r.dropped_records()[0].reason, "port out of range");
    }

    #[test]
    fn nothing_valid_renders_nothing_and_says_why() {
        let empty = resolved(json!([]));
        assert!(empty.rendered.is_none());
        assert_eq!(
            empty.no_target_reason().as_deref(),
            Some("the service has no servers right now")
        );
        let bad = resolved(json!([{"address": "a b", "port": 80}]));
        assert!(bad.rendered.is_none());
        assert_eq!(
            bad.no_target_reason().as_deref(),
            Some("no valid target (1 dropped: bad address)")
        );
        assert_eq!(bad.dropped_note(), None);
    }

    #[test]
    fn a_hundred_thousand_invalid_targets_keep_a_bounded_record() {
        let mut targets: Vec<Value> = (0..100_000)
            .map(|i| json!({"address": format!("bad address {i}"), "port": 80}))
            .collect();
        targets.push(json!({"address": "10.0.0.1", "port": 0, "tags": ["x".repeat(4096)]}));
        targets.push(json!({"address": "10.0.0.9", "port": 80}));
        let r = resolved(Value::Array(targets));
        assert!(r.rendered.is_some(), "the one valid target is written");
        assert_eq!(
            r.dropped_note().as_deref(),
            Some("100001 dropped: bad address ×100000, port out of range")
        );
        let recs = r.dropped_records();
        assert_eq!(recs.len(), MAX_DROPPED_KEPT + 1);
        assert_eq!(recs[0].target["address"], "bad address 0");
        let last = recs.last().unwrap();
        assert_eq!(last.target, json!({"not_kept": 99_981}));
        assert_eq!(dropped_total(&recs), 100_001);
        assert_eq!(
            last.reason,
            "99981 more not kept: bad address ×99980, port out of range"
        );
        let stored = serde_json::to_string(&recs).unwrap();
        assert!(stored.len() < 4096, "{} bytes kept", stored.len());
    }

    #[test]
    fn a_long_dropped_target_is_kept_as_a_note_of_its_size() {
        let r = resolved(json!([
            {"address": "10.0.0.1", "port": 0, "tags": ["y".repeat(2000)]},
            {"address": "10.0.0.2", "port": 80}
        ]));
        let recs = r.dropped_records();
        assert_eq!(recs.len(), 1);
        let note = recs[0].target.as_str().unwrap();
        assert!(
            note.starts_with("<a target of 20") && note.ends_with("bytes, not kept>"),
            "{note}"
        );
        assert_eq!(recs[0].reason, "port out of range");
    }
}
