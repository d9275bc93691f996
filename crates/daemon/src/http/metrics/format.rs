//! The two text formats of `/metrics` and the choice between them by `Accept`.

/// The two text formats `/metrics` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The Prometheus text format, version 0.0.4.
    Prometheus,
}

impl Format {
    /// The format for a request's `Accept` values: OpenMetrics when `application/openmetrics-text`
    /// is accepted (q > 0) at least as much as `text/plain`; else (no `Accept`, `*/*`, `text/plain`)
    /// the Prometheus text format.
    pub fn from_accept<'a>(accept: impl IntoIterator<Item = &'a str>) -> Format {
        let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.into_iter().flat_map(|v| v.split(',')) {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(0.0));
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The `Content-Type` of the format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}
