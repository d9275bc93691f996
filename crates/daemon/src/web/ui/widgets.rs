//! Shared pieces of the pages: a binding's state, outcome summaries and blocks, the targets table and the dropped-targets list.

use serde_json::Value;
use tributary_store::{DroppedRecord, OutcomeRecord, OutcomeStatus};

use super::now_ms;
use crate::view::BindingView;
use crate::web::html::{esc, fmt_time, time_el};

/// The state word and CSS class of a binding: ok, unchanged, failing, stale since ..., pending.
pub fn state_of(b: &BindingView, last_success_ms: Option<i64>) -> (String, &'static str) {
    match &b.last_outcome {
        None => ("pending".into(), "pending"),
        Some(o) => match o.status {
            OutcomeStatus::Ok => ("ok".into(), "ok"),
            OutcomeStatus::Unchanged => ("unchanged".into(), "ok"),
            OutcomeStatus::Failed => match last_success_ms {
                // Failing for longer than two intervals: the servers may be out of date.
                Some(at) if now_ms() - at > 2 * 1000 * b.interval_secs as i64 => {
                    (format!("stale since {}", fmt_time(at)), "failing")
                }
                _ => ("failing".into(), "failing"),
            },
        },
    }
}

pub(super) fn outcome_summary(o: &OutcomeRecord) -> String {
    let mut s = format!(
        "<span class=\"status {}\">{}</span>",
        o.status.as_str(),
        o.status.as_str()
    );
    if let Some(w) = &o.why {
        s.push_str(&format!(" <span class=\"why\">{}</span>", esc(w)));
    }
    s
}

pub(super) fn targets_table(servers: &[Value]) -> String {
    if servers.is_empty() {
        return "<p>No servers known.</p>".into();
    }
    let mut s = String::from(
        "<table class=\"servers\"><thead><tr><th>Address</th><th class=\"num\">Port</th><th class=\"num\">Weight</th>\
         <th>Tags</th></tr></thead><tbody>",
    );
    for t in servers {
        let txt = |k: &str| match &t[k] {
            Value::String(v) => v.clone(),
            Value::Null => String::new(),
            v => v.to_string(),
        };
        let tags = t["tags"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        s.push_str(&format!(
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&txt("address")),
            esc(&txt("port")),
            esc(&txt("weight")),
            esc(&tags)
        ));
    }
    s.push_str("</tbody></table>");
    s
}

pub(super) fn outcome_block(o: &OutcomeRecord, now: i64) -> String {
    let mut s = format!(
        "<dl class=\"outcome\"><dt>When</dt><dd>{}</dd><dt>Outcome</dt><dd>{}</dd>\
         <dt>Took</dt><dd>{} ms</dd><dt>Valid targets</dt><dd>{}</dd>",
        time_el(o.at_ms, now),
        outcome_summary(o),
        o.duration_ms,
        o.kept.len()
    );
    if let Some(c) = o.code {
        s.push_str(&format!(
            "<dt>Plugin error code</dt><dd class=\"code\">{c}</dd>"
        ));
    }
    if let Some(f) = &o.field {
        s.push_str(&format!(
            "<dt>Field at fault</dt><dd class=\"field\">{}</dd>",
            esc(f)
        ));
    }
    if let Some(t) = o.ttl_seconds {
        s.push_str(&format!("<dt>TTL</dt><dd>{t} s</dd>"));
    }
    s.push_str(&format!(
        "<dt>File changed</dt><dd>{}</dd><dt>nginx reloaded</dt><dd>{}</dd>",
        if o.changed { "yes" } else { "no" },
        if o.reloaded { "yes" } else { "no" }
    ));
    s.push_str("</dl>");
    if !o.dropped.is_empty() {
        s.push_str("<h3>Dropped targets</h3>");
        s.push_str(&dropped_list(&o.dropped));
    }
    if let Some(e) = &o.nginx_error {
        s.push_str(&format!(
            "<h3>nginx said</h3><pre class=\"nginx-error\">{}</pre>",
            esc(e.trim())
        ));
    }
    s
}

/// The dropped targets of an answer, each with its reason.
pub(super) fn dropped_list(dropped: &[DroppedRecord]) -> String {
    let mut s = String::from("<ul class=\"dropped\">");
    for d in dropped {
        s.push_str(&format!(
            "<li><code>{}</code>: {}</li>",
            esc(&d.target.to_string()),
            esc(&d.reason)
        ));
    }
    s.push_str("</ul>");
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn view(last: Option<OutcomeStatus>) -> BindingView {
        BindingView {
            name: "api".into(),
            plugin: "static".into(),
            provider: "static".into(),
            service: "demo".into(),
            interval_secs: 60,
            directives: vec![],
            config: BTreeMap::new(),
            secrets: BTreeMap::new(),
            include_line: "include upstreams/api.conf;".into(),
            file: "/x/upstreams/api.conf".into(),
            last_outcome: last.map(|status| OutcomeRecord {
                at_ms: now_ms(),
                duration_ms: 1,
                status,
                why: None,
                code: None,
                field: None,
                kept: vec![],
                dropped: vec![],
                ttl_seconds: None,
                changed: false,
                reloaded: false,
                nginx_error: None,
            }),
            servers: vec![],
            next_refresh_ms: None,
            consecutive_failures: 0,
        }
    }

    #[test]
    fn binding_states() {
        assert_eq!(state_of(&view(None), None).0, "pending");
        assert_eq!(state_of(&view(Some(OutcomeStatus::Ok)), None).0, "ok");
        assert_eq!(
            state_of(&view(Some(OutcomeStatus::Unchanged)), None).0,
            "unchanged"
        );
        let failed = view(Some(OutcomeStatus::Failed));
        assert_eq!(state_of(&failed, None), ("failing".into(), "failing"));
        // A success within two intervals: failing; older: stale since that success.
        assert_eq!(state_of(&failed, Some(now_ms() - 60_000)).0, "failing");
        let old = 1_700_000_000_000;
        assert_eq!(
            state_of(&failed, Some(old)),
            ("stale since 2023-11-14 22:13:20Z".into(), "failing")
        );
    }
}
