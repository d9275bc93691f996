//! Small SVG line charts (servers and resolution time on the detail page).

use crate::web::html::{esc, fmt_time};

pub(super) fn chart(title: &str, points: &[(i64, f64, bool)], unit: &str) -> String {
    const W: f64 = 320.0;
    const H: f64 = 90.0;
    if points.is_empty() {
        return String::new();
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
    let mut dots = String::new();
    for ((x, y), p) in xy.iter().zip(points) {
        dots.push_str(&format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" class=\"{}\"><title>{}: {} {unit}</title></circle>",
            if p.2 { "bad" } else { "good" },
            fmt_time(p.0),
            p.1
        ));
    }
    format!(
        "<figure class=\"chart\"><figcaption>{t} (max {max} {unit})</figcaption>\
         <svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{t}\">\
         <polyline points=\"{}\" fill=\"none\" stroke=\"#2a6fb0\" stroke-width=\"2\"/>{dots}</svg></figure>",
        line.join(" "),
        t = esc(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_scale_points_and_mark_failures() {
        let svg = chart("Servers", &[(0, 2.0, false), (1_000, 4.0, true)], "servers");
        assert!(svg.contains("max 4 servers"), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("class=\"bad\""));
        assert_eq!(chart("x", &[], "ms"), "");
    }
}
