//! The store's integration tests, one binary (`--test e2e`) with one module per concern:
//! linking one test executable instead of one per file is what keeps `cargo build --tests`
//! short. nextest still runs every test in its own process; a test's name is
//! `<module>::<test>` (e.g. `etcd_claims::...`). `common` holds the etcd tests' shared helpers.

mod common;

mod etcd_auth;
mod etcd_auth_upgrade;
mod etcd_claims;
mod etcd_gc;
mod etcd_host_scoped;
mod etcd_integrity;
mod etcd_keepalive;
mod etcd_mirror;
mod etcd_store;
mod etcd_tls_auth;
mod etcd_txn;
mod etcd_watch;
mod live_settings;
mod sqlite_store;
mod store;
