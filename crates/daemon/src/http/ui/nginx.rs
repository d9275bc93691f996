//! The nginx status page `/ui/nginx`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::html;
use tributary_store::now_ms;

use super::html::{page, time_el};
use crate::http::auth::session::Session;
use crate::http::AppState;

pub(super) async fn nginx_page(
    State(st): State<AppState>,
    Extension(s): Extension<Session>,
) -> Response {
    let now = now_ms();
    let n = crate::http::api::status::nginx_status(&st);
    let body = html! {
        h1 { "nginx" }
        section.card {
            dl {
                dt { "Conf dir" } dd { code { (n.conf_dir) } }
                dt { "Upstream files" }
                dd {
                    code { (n.upstreams_dir) } ": "
                    @if n.files.is_empty() { "none" } @else { (n.files.join(", ")) }
                }
                dt { "Apply batches" } dd { (n.numbers.apply_batches) }
                dt { "Reloads" } dd { (n.numbers.reloads) }
                dt { "Changes refused by nginx -t" } dd { (n.numbers.test_failures) }
                dt { "Last successful reload" }
                dd {
                    @match n.numbers.last_reload_ms {
                        Some(t) => (time_el(t, now)),
                        None => "none since start",
                    }
                }
            }
        }
        @if let Some(f) = &n.numbers.last_test_failure {
            section.card {
                h2 { "Last refused change" }
                p { (time_el(f.at_ms, now)) " of " a href={"/ui/bindings/" (f.binding)} { (f.binding) } }
                pre.nginx-error { (f.nginx_error.trim()) }
            }
        }
    };
    page(StatusCode::OK, "nginx", Some(&s.csrf), body)
}
