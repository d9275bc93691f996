//! Pure logic of the combined-upstreams nginx module.
//!
//! Nothing here touches nginx: the cdylib (`ngx-combined-upstreams`) hands directive arguments in as
//! plain strings, gets typed values or an nginx-worded error text back, and applies the result to
//! nginx's structures itself.

pub mod upstrand;
