//! The text form of binding views and outcomes (`binding add|show|refresh`).

use tributary_store::{Applied, OutcomeRecord};

use crate::view::BindingView;

pub(super) fn outcome_line(o: &OutcomeRecord) -> String {
    let mut s = format!(
        "{} {}{} in {} ms: {} servers",
        format_time(o.at_ms),
        o.status.as_str(),
        o.failure.map(|f| format!(" ({f})")).unwrap_or_default(),
        o.duration_ms,
        o.kept.len()
    );
    if o.changed {
        s.push_str(", file changed");
    }
    match (o.applied, &o.applied_reason) {
        (Some(Applied::Live), _) => s.push_str(", applied live (no reload)"),
        (Some(Applied::Reload), Some(why)) => {
            s.push_str(&format!(", nginx reloaded (applied by reload: {why})"))
        }
        _ if o.reloaded => s.push_str(", nginx reloaded"),
        _ => {}
    }
    if let Some(code) = o.code {
        s.push_str(&format!(", code {code}"));
    }
    if let Some(f) = &o.field {
        s.push_str(&format!(", field {f}"));
    }
    if let Some(w) = &o.why {
        s.push_str(&format!(" — {w}"));
    }
    s
}

/// `YYYY-MM-DDTHH:MM:SSZ` (UTC) of a time in ms since the Unix epoch.
pub(crate) fn format_time(ms: i64) -> String {
    crate::utc::utc(ms, 'T')
}

pub(super) fn print_view(b: &BindingView) {
    println!("  plugin/provider: {}/{}", b.plugin, b.provider);
    println!("  service: {}", b.service);
    println!("  interval: {} s", b.interval_secs);
    for (k, v) in &b.config {
        println!("  config {k}: {v}");
    }
    for (k, set) in &b.secrets {
        println!(
            "  config {k}: {}",
            if *set {
                "(secret, set)"
            } else {
                "(secret, not set)"
            }
        );
    }
    for d in &b.directives {
        println!("  directive: {d}");
    }
    println!("  file: {}", b.file);
    println!("  add at http level: {}", b.include_line);
    match &b.last_outcome {
        Some(o) => {
            println!("  last: {}", outcome_line(o));
            if let Some(e) = &o.nginx_error {
                println!("  nginx: {}", e.trim());
            }
            for d in &o.dropped {
                println!("  dropped: {} ({})", d.target, d.reason);
            }
        }
        None => println!("  last: not resolved yet"),
    }
    if b.servers.is_empty() {
        println!("  servers: none known");
    } else {
        println!("  servers:");
        for s in &b.servers {
            println!("    {s}");
        }
    }
    if let Some(n) = b.next_refresh_ms {
        println!("  next refresh: {}", format_time(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_formatting() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(1_700_000_000_000), "2023-11-14T22:13:20Z");
    }
}
