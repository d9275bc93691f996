//! What a member's refusal of a request means for the caller ([`refusal`]), and the store error
//! that says it: etcd refused this host's etcd user ([`StoreError::PermissionDenied`], naming the
//! user and the keys of the request; [`StoreError::AuthFailed`]), a request larger than the
//! members take ([`StoreError::TooLarge`]), or anything else: unavailable for now
//! ([`StoreError::Unavailable`]). A write is never retried on a refusal (`write.rs`).

use tonic::Code;

use super::EtcdStore;
use crate::StoreError;

/// What a member's refusal of a request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The etcd user's roles do not grant the keys (`etcdserver: permission denied`).
    Permission,
    /// The user was not accepted: wrong password, unknown user, no user while auth is on, an
    /// auth token etcd no longer knows.
    Auth,
    /// The request is larger than the members take (`--max-request-bytes`, or gRPC's own limit
    /// above it), or has more operations than `--max-txn-ops`.
    TooLarge,
    /// Anything else (a lease not found, too many requests...): the store is unavailable for now.
    Other,
}

/// What `e` refuses (by gRPC status code, and etcd's message where the code is shared).
pub(crate) fn refusal(e: &etcd_client::Error) -> Refusal {
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            Code::PermissionDenied => Refusal::Permission,
            Code::Unauthenticated => Refusal::Auth,
            // gRPC's own refusal above etcd's limit: "received message larger than max".
            Code::ResourceExhausted if s.message().contains("larger than max") => Refusal::TooLarge,
            _ => refusal_text(s.message()),
        },
        e => refusal_text(&e.to_string()),
    }
}

/// [`refusal`] from an error's text: etcd's messages (`rpctypes` in etcd's API), which the
/// session keeps as its last error.
pub(crate) fn refusal_text(text: &str) -> Refusal {
    const AUTH: [&str; 4] = [
        "etcdserver: authentication failed",
        "etcdserver: user name is empty",
        "etcdserver: user name not found",
        "etcdserver: invalid auth token",
    ];
    if text.contains("etcdserver: permission denied") {
        Refusal::Permission
    } else if AUTH.iter().any(|m| text.contains(m)) {
        Refusal::Auth
    } else if text.contains("etcdserver: request is too large")
        || text.contains("etcdserver: too many operations in txn request")
    {
        Refusal::TooLarge
    } else {
        Refusal::Other
    }
}

impl EtcdStore {
    /// The error of a write tried while the session is not connected (`why`: its last error):
    /// a session that failed because etcd refused this host's user (the session's own reads and
    /// writes: the prefix, the heartbeat) says so, not that etcd is unreachable.
    pub(crate) fn not_connected(&self, why: String) -> StoreError {
        match refusal_text(&why) {
            Refusal::Auth => StoreError::AuthFailed {
                store: self.shared.location.clone(),
                user: self.etcd_user(),
                why,
            },
            Refusal::Permission => StoreError::PermissionDenied {
                store: self.shared.location.clone(),
                user: self.etcd_user(),
                keys: format!(
                    "what its session reads and writes (the prefix {}, its heartbeat {})",
                    self.shared.keys.prefix,
                    self.shared.keys.host(&self.shared.opts.host_id)
                ),
                why,
            },
            _ => self.unavailable(why),
        }
    }

    /// The etcd user of this host, for errors (`(none)` without one).
    fn etcd_user(&self) -> String {
        self.shared
            .opts
            .user
            .as_ref()
            .map_or_else(|| "(none)".to_string(), |(u, _)| format!("{u:?}"))
    }

    /// The error of a request member `endpoint` refused with `e` (an answer: not retried).
    /// `keys` describes what the request reads or writes.
    pub(crate) fn refusal_error(
        &self,
        endpoint: &str,
        e: &etcd_client::Error,
        keys: &str,
    ) -> StoreError {
        let why = match e {
            etcd_client::Error::GRpcStatus(s) => format!("{endpoint}: {}", s.message()),
            e => format!("{endpoint}: {e}"),
        };
        let store = self.shared.location.clone();
        match refusal(e) {
            Refusal::Permission => StoreError::PermissionDenied {
                store,
                user: self.etcd_user(),
                keys: keys.to_string(),
                why,
            },
            Refusal::Auth => StoreError::AuthFailed {
                store,
                user: self.etcd_user(),
                why,
            },
            Refusal::TooLarge => StoreError::TooLarge { store, why },
            Refusal::Other => self.unavailable(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_told_apart_by_code_and_by_etcds_message() {
        let with = |code, msg: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg));
        let cases = [
            (
                Code::PermissionDenied,
                "etcdserver: permission denied",
                Refusal::Permission,
            ),
            (
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
                Refusal::Auth,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
                Refusal::Auth,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty",
                Refusal::Auth,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: request is too large",
                Refusal::TooLarge,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
                Refusal::TooLarge,
            ),
            (
                Code::ResourceExhausted,
                "grpc: received message larger than max (3000000 vs. 2097152)",
                Refusal::TooLarge,
            ),
            (
                Code::ResourceExhausted,
                "etcdserver: too many requests",
                Refusal::Other,
            ),
            (
                Code::NotFound,
                "etcdserver: requested lease not found",
                Refusal::Other,
            ),
        ];
        for (code, msg, want) in cases {
            assert_eq!(refusal(&with(code, msg)), want, "{code:?} {msg}");
        }
        // The session's last error, as it keeps it (text).
        assert_eq!(
            refusal_text("connect: grpc request error: status: InvalidArgument, message: \"etcdserver: authentication failed, invalid user ID or password\""),
            Refusal::Auth
        );
        assert_eq!(refusal_text("connect: connection refused"), Refusal::Other);
    }
}
