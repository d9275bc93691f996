//! The exact bytes of `upstreams/<name>.conf` for a validated answer.

use crate::{ExtraDirective, Target, UpstreamFile, UpstreamName};

/// Renders the upstream block exactly as the spec shows it: [`UpstreamFile::new`] rendered (the
/// header line, `upstream <name> {`, one `server <addr>:<port> weight=<w>;` per target in the
/// given order, then the extra directives one per line, then `}` and a final newline).
///
/// Pass targets from [`crate::validate`] (canonical order). An empty `targets` renders a block
/// nginx rejects; callers must not write it (the spec keeps the current file instead).
pub fn render(name: &UpstreamName, targets: &[Target], directives: &[ExtraDirective]) -> String {
    UpstreamFile::new(name, targets, directives).render()
}
