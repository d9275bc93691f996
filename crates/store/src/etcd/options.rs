//! How to reach etcd and behave in the fleet: [`EtcdOptions`] and its defaults.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{now_ms, StoreOptions};

/// Default resolver/heartbeat lease TTL.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// Default time after which the outcomes of a host that is gone are removed
/// ([`EtcdOptions::forget_gone_hosts_after`]).
pub const DEFAULT_FORGET_GONE_HOSTS_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Default bound of one etcd operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Outcomes per etcd transaction of this host's outcome flush (etcd's default `--max-txn-ops`,
/// 128, bounds the compares and the operations of one transaction each).
pub const TXN_CHUNK: usize = 100;

/// TLS of the etcd client: PEM files.
#[derive(Debug, Clone, Default)]
pub struct EtcdTls {
    /// CA certificate that signed the members' certificates.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (mutual TLS), both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// How to reach etcd and behave in the fleet.
#[derive(Clone)]
pub struct EtcdOptions {
    /// Client URLs (`http://host:2379`, `https://...`).
    pub endpoints: Vec<String>,
    /// Key prefix (a `/` is added at the end when missing).
    pub prefix: String,
    /// This host's id: unique in the fleet, no `/`.
    pub host_id: String,
    /// Lease TTL of the heartbeat and resolver claims: a dead resolver's bindings are taken over
    /// within it.
    pub lease_ttl: Duration,
    /// Bound of one etcd operation (a write fails with `Unavailable` after it, having tried the
    /// next members when the first did not answer).
    pub op_timeout: Duration,
    /// The outcomes (and markers) of a host whose heartbeat has been gone this long are removed
    /// from etcd, so from every host's fleet view (`gc.rs`).
    pub forget_gone_hosts_after: Duration,
    pub tls: Option<EtcdTls>,
    /// etcd user and password (read from a file by the caller; never on a command line).
    pub user: Option<(String, String)>,
    /// The `plugin/provider` pairs this host can resolve (its loaded plugins); `None`: any. Put
    /// in the heartbeat with the secrets key ids, so that the hosts leave this one out of the
    /// resolver choice of a binding it cannot resolve (`docs/fleet.md`).
    pub providers: Option<Vec<String>>,
    /// Refuse values without a MAC from the start, and put the fleet's integrity key (every
    /// host then refuses them): the explicit step of an upgrade (docs/fleet.md, "Integrity").
    pub require_integrity: bool,
    /// The clock of the bindings' time stamps (milliseconds since the Unix epoch; [`now_ms`]).
    /// Versions do not depend on it (`bindings.rs`); a test sets one that is behind.
    pub clock: fn() -> i64,
    /// Outcome history of this host, and where the mirror lives.
    pub history: StoreOptions,
    pub mirror_path: PathBuf,
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("host_id", &self.host_id)
            .field("lease_ttl", &self.lease_ttl)
            .field("op_timeout", &self.op_timeout)
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("mirror_path", &self.mirror_path)
            .finish()
    }
}

impl EtcdOptions {
    /// Options with the defaults for everything but where etcd is and who this host is.
    pub fn new(endpoints: Vec<String>, prefix: &str, host_id: &str, mirror_path: &Path) -> Self {
        EtcdOptions {
            endpoints,
            prefix: prefix.to_string(),
            host_id: host_id.to_string(),
            lease_ttl: DEFAULT_LEASE_TTL,
            op_timeout: DEFAULT_OP_TIMEOUT,
            forget_gone_hosts_after: DEFAULT_FORGET_GONE_HOSTS_AFTER,
            tls: None,
            user: None,
            providers: None,
            require_integrity: false,
            clock: now_ms,
            history: StoreOptions::default(),
            mirror_path: mirror_path.to_path_buf(),
        }
    }
}
