//! Test support for the `consul`, `kubernetes` and `ec2` discovery plugins.
//!
//! - [`consul::FakeConsul`]: a fake of Consul's `/v1/health/service/<name>` and
//!   `/v1/catalog/services`, written from Consul's public API docs (it is not Consul).
//! - [`kube::FakeKube`]: a fake Kubernetes API server answering EndpointSlice lists over HTTPS
//!   with a test CA and a bearer token, written from the Kubernetes API reference.
//! - [`moto::Moto`]: the real `moto_server` from PyPI (in `target/venv`), with IAM auth on.
//! - [`tls::TestCa`]: a CA and a server certificate generated at test time.
//! - [`daemon::Daemon`]: the real `tributary serve` for end-to-end tests with a real nginx.
//!
//! - [`bench`]: the resolve benchmark (host and in-process, same run).
//!
//! Every server listens on 127.0.0.1 only, on a free port, and stops when dropped.
#![forbid(unsafe_code)]

pub mod bench;
pub mod consul;
pub mod daemon;
pub mod http;
pub mod kube;
pub mod moto;
pub mod tls;
