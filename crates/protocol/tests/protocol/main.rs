//! The protocol crate's integration tests, one binary (one link): the wire format's golden
//! fixtures and the manifest members that isolate plugins.

mod isolation;
mod wire;
