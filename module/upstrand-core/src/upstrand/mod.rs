//! Pure logic of the `upstrand` family of directives.
//!
//! Nothing here touches nginx: the cdylib feeds directive arguments, upstream names, answers,
//! the clock and a random source in, and acts on the values that come out.
//!
//! - [`time`]: nginx-style time values (`60s`, `1m30s`, `500ms`).
//! - [`status`]: status sets of `next_upstream_statuses` / `intercept_statuses`.
//! - [`conf`]: the `upstrand NAME { ... }` block, directive by directive, with nginx-worded errors.
//! - [`select`]: the per-worker cursor and blacklist, and the walk of one request.
//! - [`trace`]: the walk decisions as debug log lines.
//! - [`vars`]: formatting of `$upstrand_addr` & co. and `$upstrand_path`.
//! - [`dynamic`]: `dynamic_upstrand` arguments and candidate choice.

pub mod conf;
pub mod dynamic;
pub mod select;
pub mod status;
pub mod time;
pub mod trace;
pub mod vars;
