//! The SDK's integration tests, one binary (one link): `serve` with a toy plugin, and the
//! text-entry pieces the plugins share.

mod serve;
mod target_text;
