//! The nginx status page `/ui/nginx`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;

use super::now_ms;
use crate::web::html::{esc, page, time_el};
use crate::web::session::Session;
use crate::web::WebState;

pub(super) async fn nginx_page(
    State(st): State<WebState>,
    Extension(s): Extension<Session>,
) -> Response {
    let now = now_ms();
    let n = crate::web::api_extra::nginx_status(&st);
    let mut body = format!(
        "<h1>nginx</h1><section class=\"card\"><dl><dt>Conf dir</dt><dd><code>{}</code></dd>\
         <dt>Upstream files</dt><dd><code>{}</code>: {}</dd><dt>Apply batches</dt><dd>{}</dd>\
         <dt>Reloads</dt><dd>{}</dd><dt>Changes refused by nginx -t</dt><dd>{}</dd>\
         <dt>Last successful reload</dt><dd>{}</dd></dl></section>",
        esc(&n.conf_dir),
        esc(&n.upstreams_dir),
        if n.files.is_empty() {
            "none".to_string()
        } else {
            esc(&n.files.join(", "))
        },
        n.numbers.apply_batches,
        n.numbers.reloads,
        n.numbers.test_failures,
        n.numbers
            .last_reload_ms
            .map(|t| time_el(t, now))
            .unwrap_or_else(|| "none since start".into())
    );
    if let Some(f) = &n.numbers.last_test_failure {
        body.push_str(&format!(
            "<section class=\"card\"><h2>Last refused change</h2><p>{} of <a href=\"/ui/bindings/{b}\">{b}</a></p>\
             <pre class=\"nginx-error\">{}</pre></section>",
            time_el(f.at_ms, now),
            esc(f.nginx_error.trim()),
            b = esc(&f.binding)
        ));
    }
    page(StatusCode::OK, "nginx", Some(&s.csrf), &body)
}
