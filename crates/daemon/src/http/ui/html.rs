//! HTML helpers of the web UI: the page frame, security headers, times. Pages are written with
//! maud's `html!` (compile-time templates; every `(value)` spliced into a page is escaped).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

/// Content-Security-Policy of every page: nothing from elsewhere, no inline script or style.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       form-action 'self'; frame-ancestors 'none'; base-uri 'none'; connect-src 'self'";

/// Adds the headers every UI answer carries.
pub fn secure(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A full page: title, navigation (with a logout form when `csrf` is given) and `body`.
pub fn page(status: StatusCode, title: &str, csrf: Option<&str>, body: Markup) -> Response {
    let html = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Tributary" }
                link rel="stylesheet" href="/ui/assets/style.css";
                script src="/ui/assets/app.js" defer {}
            }
            body {
                header {
                    a.brand href="/ui/bindings" { "Tributary" }
                    @if let Some(t) = csrf {
                        nav {
                            a href="/ui/bindings" { "Bindings" } " "
                            a href="/ui/new" { "New binding" } " "
                            a href="/ui/nginx" { "nginx" }
                            form.inline method="post" action="/logout" {
                                (csrf_field(t))
                                button.link type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    };
    secure(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html.into_string(),
        )
            .into_response(),
    )
}

/// The hidden CSRF field every form carries.
pub fn csrf_field(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

/// A page with one error paragraph (`role="alert"`) and a link back to the bindings.
pub fn error_page(status: StatusCode, title: &str, csrf: Option<&str>, message: &str) -> Response {
    page(
        status,
        title,
        csrf,
        html! {
            p.error role="alert" { (message) }
            p { a href="/ui/bindings" { "Back to the bindings" } }
        },
    )
}

/// `YYYY-MM-DD HH:MM:SSZ` (UTC) of a time in ms since the Unix epoch.
pub fn fmt_time(ms: i64) -> String {
    crate::utc::utc(ms, ' ')
}

/// "in 42 s", "3 min ago"...
pub fn rel_time(ms: i64, now_ms: i64) -> String {
    let d = (ms - now_ms) / 1000;
    if d == 0 {
        return "now".into();
    }
    let (n, future) = (d.unsigned_abs(), d > 0);
    let amount = if n < 90 {
        format!("{n} s")
    } else if n < 90 * 60 {
        format!("{} min", n / 60)
    } else if n < 36 * 3600 {
        format!("{} h", n / 3600)
    } else {
        format!("{} d", n / 86_400)
    };
    if future {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// A `<time>` element with the absolute time and the relative one.
pub fn time_el(ms: i64, now_ms: i64) -> Markup {
    let t = fmt_time(ms);
    html! { time title=(t) { (t) " (" (rel_time(ms, now_ms)) ")" } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_in_text_and_attributes() {
        let m = html! { p title=("\"><script>") { ("<b>&'") } };
        assert_eq!(
            m.into_string(),
            "<p title=\"&quot;&gt;&lt;script&gt;\">&lt;b&gt;&amp;'</p>"
        );
        assert_eq!(
            csrf_field("a\"b").into_string(),
            "<input type=\"hidden\" name=\"csrf\" value=\"a&quot;b\">"
        );
        assert_eq!(
            time_el(0, 10_000).into_string(),
            "<time title=\"1970-01-01 00:00:00Z\">1970-01-01 00:00:00Z (10 s ago)</time>"
        );
    }

    #[test]
    fn times() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(fmt_time(1_700_000_000_000), "2023-11-14 22:13:20Z");
        assert_eq!(fmt_time(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(fmt_time(-1), "1969-12-31 23:59:59Z");
        assert_eq!(fmt_time(i64::MAX), format!("{} ms", i64::MAX));
        assert_eq!(rel_time(10_000, 0), "in 10 s");
        assert_eq!(rel_time(0, 600_000), "10 min ago");
        assert_eq!(rel_time(1_000, 1_500), "now");
    }
}
