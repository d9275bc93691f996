//! Pure logic of the Tributary daemon (no IO: no files, processes, sockets or clocks).
//!
//! The data flow it serves, one function per arrow:
//! plugin answer (raw JSON targets) → [`validate`] (drop bad targets with a reason, lower-case host
//! names, dedupe, canonical sort) → [`UpstreamFile`] (the file as a value; [`render`] gives its
//! exact bytes, [`UpstreamFile::parse`] is the strict inverse) → the apply crate compares bytes
//! and writes. [`live_plan`] decides from two files (the one nginx runs, the one wanted) whether
//! a change goes live through the module's API, or why it needs a reload ([`NeedsReload`], whose
//! [`ReloadReason`] is the tag stored with the outcome). [`schedule`] computes when a binding refreshes next.
//!
//! Inputs a person types are validated here once, when a binding is saved: [`BindingDraft::check`]
//! reports every invalid field at once (the API, the web form and the engine all use it), among
//! them [`UpstreamName`] (it becomes a file name) and [`ExtraDirective`] (it becomes a line of
//! nginx configuration).
//!
//! Also here: `zone.rs` (live mode's `zone` line sized from the server count, TLS sessions counted,
//! at least a size the module named in a 507); [`schedule`] (refresh delay from interval and TTL,
//! failure back-off, jitter); [`Binding`] with its checks against a provider's declared fields and
//! its live settings (`probe.rs`: the module's `probe` parameters, written by
//! `Binding::file_directives` in live mode only; `drain_secs`). [`BindingDraft::check`] (`draft.rs`)
//! turns a person's input into a `Binding`, or reports every invalid field at once as `FieldError`s
//! (one per field, ordered by field); the engine's `prepare` adds what only it knows (plugin and
//! provider loaded, stored secrets). [`validate`] lower-cases host names and drops duplicates. Render
//! cases live as fixture files in `crates/core/tests/render/`.
#![forbid(unsafe_code)]

mod binding;
mod directive;
mod draft;
mod file;
mod name;
mod probe;
mod render;
pub mod schedule;
mod target;
mod zone;

pub use binding::{coerce_config, Binding, BindingError, MAX_SERVICE_LEN};
pub use directive::{DirectiveError, ExtraDirective, MAX_DIRECTIVE_LEN};
pub use draft::{tidy_field_errors, BindingDraft, FieldError};
pub use file::{
    live_plan, FileError, LivePlan, NeedsReload, ReloadReason, Server, UpstreamFile, HEADER,
};
pub use name::{NameError, UpstreamName, MAX_NAME_LEN};
pub use probe::{Probe, ProbeError, MAX_DRAIN_SECS, MAX_PROBE_LEN};
pub use render::render;
pub use target::{
    summarize_dropped, validate, Address, DropReason, Dropped, Target, Validated, MAX_HOST_LEN,
    MAX_WEIGHT,
};
pub use zone::{
    render_live, zone_size, zone_size_at_least, zone_size_text, ZONE_BYTES_PER_SERVER,
    ZONE_MIN_BYTES, ZONE_TLS_SESSION_BYTES,
};
