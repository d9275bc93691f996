//! Small SVG line charts (servers and resolution time on the detail page).

use maud::{html, Markup};

use super::html::fmt_time;

/// A line chart of `points` (time in ms, value, failed); nothing when there are none.
pub(super) fn chart(title: &str, points: &[(i64, f64, bool)], unit: &str) -> Markup {
    const W: f64 = 320.0;
    const H: f64 = 90.0;
    if points.is_empty() {
        return html! {};
    }
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0);
    let step = if points.len() > 1 {
        (W - 20.0) / (points.len() - 1) as f64
    } else {
        0.0
    };
    let xy: Vec<(f64, f64)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| (10.0 + step * i as f64, H - 10.0 - (p.1 / max) * (H - 25.0)))
        .collect();
    let line: Vec<String> = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    html! {
        figure.chart {
            figcaption { (title) " (max " (max) " " (unit) ")" }
            svg viewBox={"0 0 " (W) " " (H)} width=(W) height=(H) role="img" aria-label=(title) {
                polyline points=(line.join(" ")) fill="none" stroke="#2a6fb0" stroke-width="2" {}
                @for ((x, y), p) in xy.iter().zip(points) {
                    circle cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="3"
                        class=(if p.2 { "bad" } else { "good" }) {
                        title { (fmt_time(p.0)) ": " (p.1) " " (unit) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_scale_points_and_mark_failures() {
        let svg = chart("Servers", &[(0, 2.0, false), (1_000, 4.0, true)], "servers").into_string();
        assert!(svg.contains("max 4 servers"), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("class=\"bad\""));
        assert_eq!(chart("x", &[], "ms").into_string(), "");
        // The title is text, never markup.
        let svg = chart("<x>", &[(0, 1.0, false)], "ms").into_string();
        assert!(svg.contains("&lt;x&gt;") && !svg.contains("<x>"), "{svg}");
    }
}
