//! Writes that outlive the member they went to.
//!
//! A write (save, removal, claim, target set) is one guarded etcd transaction. It goes to the
//! member of the host's session; when that member does not answer (it died: connection refused or
//! reset; it lost the quorum: `Unavailable`; no answer within its share of the time), the same
//! transaction is sent to the next member, then the next, all within the store's operation
//! timeout; when no member answered a round (one is dead, the others wait for a new leader), again
//! after a pause, until the timeout. A refusal from a member that answered (permission, auth, too
//! large, lease not found...) fails the write at once, and a failed guard is the write's answer:
//! neither is retried ([`retryable`]). When every member refused the connection, nothing listens:
//! the write fails at once, and so do the next ones until the session is connected again.
//!
//! **At most once.** An attempt that got no answer may still have been applied (the member
//! forwarded it to the leader before it died), or may still be on its way. Every write therefore
//! carries two marker keys of its own, `P/writes/HOST/ID` and `P/writes/HOST/ID/refused`
//! ([`Keys::write_marker`]), on a short lease of their own so they vanish by themselves:
//!
//! ```text
//! when   the write's guards, and neither marker exists
//! then   the write's operations, and put P/writes/HOST/ID
//! else   get P/writes/HOST/ID, and put P/writes/HOST/ID/refused
//! ```
//!
//! Whichever attempt etcd decides first wins, and every later attempt of the same write (a retry,
//! or the first one arriving late) finds a marker and changes nothing: the operations are applied
//! at most once. A later attempt whose `get` finds the first marker knows an earlier attempt was
//! applied, at that marker's revision: the write succeeded ([`Written::Applied`]), not a conflict
//! with itself. No first marker means the guards failed for real, on someone else's write
//! ([`Written::Refused`]): a duplicate name, a concurrent change, a claim held by another host.
//!
//! The markers' lease lives `2 × op_timeout + 4 s` and is used for new writes during the first
//! half of that (then a new one is granted), so a write's markers outlive all its attempts. Marker keys are under the
//! prefix (the etcd user's permission on the prefix covers them); the mirror ignores them.

use std::time::{Duration, Instant};

use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tonic::Code;

use super::keys::Keys;
use super::refusal::{refusal, Refusal};
use super::{lock, session, Conn, EtcdStore};
use crate::StoreError;

/// A guarded write: `ops` are applied when every one of `compares` holds.
pub(crate) struct Guarded {
    pub compares: Vec<Compare>,
    pub ops: Vec<TxnOp>,
}

/// What etcd decided on a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// Applied, at this revision (by this attempt or an earlier one of the same write).
    Applied(i64),
    /// Not applied: a guard failed on someone else's write. The revision etcd answered at.
    Refused(i64),
}

/// The two marker keys of one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Markers {
    pub applied: String,
    pub refused: String,
}

impl Markers {
    /// Fresh markers: a random 128-bit write id under this host.
    pub fn new(keys: &Keys, host: &str) -> Markers {
        let id = format!("{:016x}{:016x}", OsRng.next_u64(), OsRng.next_u64());
        let applied = keys.write_marker(host, &id);
        Markers {
            refused: format!("{applied}/refused"),
            applied,
        }
    }
}

/// The transaction of one write with its markers (every attempt sends the same one).
pub(crate) fn marked_txn(g: &Guarded, m: &Markers, marker_lease: i64) -> Txn {
    let lease = || Some(PutOptions::new().with_lease(marker_lease));
    let mut compares = g.compares.clone();
    compares.push(Compare::create_revision(
        m.applied.clone(),
        CompareOp::Equal,
        0,
    ));
    compares.push(Compare::create_revision(
        m.refused.clone(),
        CompareOp::Equal,
        0,
    ));
    let mut ops = g.ops.clone();
    ops.push(TxnOp::put(m.applied.clone(), "", lease()));
    Txn::new().when(compares).and_then(ops).or_else([
        TxnOp::get(m.applied.clone(), None),
        TxnOp::put(m.refused.clone(), "", lease()),
    ])
}

/// etcd's answer to a marked transaction.
pub(crate) fn decide(r: &TxnResponse) -> Written {
    let rev = r.header().map_or(0, |h| h.revision());
    if r.succeeded() {
        return Written::Applied(rev);
    }
    match r.op_responses().first() {
        // An earlier attempt of this write was applied: its marker is there.
        Some(TxnOpResponse::Get(g)) if !g.kvs().is_empty() => {
            Written::Applied(g.kvs()[0].mod_revision())
        }
        _ => Written::Refused(rev),
    }
}

/// Whether a failed attempt is worth sending to another member: the member it went to did not
/// answer (it is gone, unreachable, or has no leader). An answer (a refusal) is never retried:
/// permission, authentication, a request too large, a lease not found, too many requests, a
/// compacted revision, and any status the member itself sent other than `Unavailable` and
/// `DeadlineExceeded`.
pub(crate) fn retryable(e: &etcd_client::Error) -> bool {
    use etcd_client::Error;
    match e {
        // Connecting to the member failed.
        Error::TransportError(_) | Error::IoError(_) => true,
        Error::GRpcStatus(s) => match s.code() {
            // From the member ("no leader", "leader changed", "request timed out", "server
            // stopped") or from this side (connection refused, keep-alive timed out).
            Code::Unavailable | Code::DeadlineExceeded => true,
            // Made on this side when the connection broke under the request ("h2 protocol
            // error: error reading a body from connection ... broken pipe"): such a status
            // carries the transport error as its source; a member's own answer carries none.
            Code::Unknown | Code::Internal | Code::Cancelled | Code::Aborted => {
                std::error::Error::source(s).is_some()
            }
            _ => false,
        },
        _ => false,
    }
}

/// Whether the member refused the connection: nothing listens there (the process is gone).
pub(crate) fn connection_refused(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::IoError(io) => Some(io),
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::GRpcStatus(s) => Some(s),
        _ => None,
    };
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// The least time an attempt gets while more is left.
const MIN_SHARE: Duration = Duration::from_millis(300);
/// The most time an attempt gets before the write is sent to the next member too. A write that a
/// member forwarded to a leader that then died gets no answer at all; nothing commits before the
/// members elect a new leader (one to two election timeouts: etcd's default is 1 s), so sending
/// the write again about that often finds the new leader soon. (A slow but alive member's answer
/// is lost, not its write: the next attempt finds the write's marker.)
const MAX_SHARE: Duration = Duration::from_secs(1);
/// The pause after a round in which no member answered.
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// Lifetime of the markers' lease for an operation timeout.
pub(crate) fn marker_ttl(op_timeout: Duration) -> Duration {
    op_timeout * 2 + Duration::from_secs(4)
}

impl EtcdStore {
    /// One write: to the session's member, then to the next members while they do not answer,
    /// within the operation timeout. See the module docs. A refusal names the prefix; see
    /// [`EtcdStore::write_to`].
    pub(crate) async fn write(&self, g: Guarded) -> Result<Written, StoreError> {
        let keys = format!("keys under {}", self.shared.keys.prefix);
        self.write_to(g, &keys).await
    }

    /// [`EtcdStore::write`] of a write whose keys `keys` describes (for the error when etcd
    /// refuses this host's user: [`StoreError::PermissionDenied`]).
    pub(crate) async fn write_to(&self, g: Guarded, keys: &str) -> Result<Written, StoreError> {
        let shared = &self.shared;
        let timeout = shared.opts.op_timeout;
        let deadline = Instant::now() + timeout;
        let n = shared.opts.endpoints.len();
        let (first, session_client) = {
            let c = lock(&shared.conn);
            self.writable(&c)?;
            let session = c.client.clone().map(|client| (c.member_index, client));
            (c.write_hint, session)
        };
        let markers = Markers::new(&shared.keys, &shared.opts.host_id);
        let mut session_client = session_client;
        let mut txn: Option<Txn> = None;
        // The last reason per member, for the error.
        let mut why: Vec<Option<String>> = vec![None; n];
        'rounds: loop {
            // Whether every member refused the connection this round: nobody listens, etcd is
            // down, and waiting for the timeout would not help.
            let mut all_refused = true;
            for pos in 0..n {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break 'rounds;
                }
                let i = (first + pos) % n;
                // A member that does not answer at all (its host is cut off, or it forwarded the
                // write to a leader that died) leaves time for the others.
                let share = if left <= MIN_SHARE * 2 {
                    left
                } else {
                    (left / 2).clamp(MIN_SHARE, MAX_SHARE)
                };
                let endpoint = &shared.opts.endpoints[i];
                let on_session = matches!(&session_client, Some((Some(m), _)) if *m == i);
                let attempt = async {
                    let mut client = match &session_client {
                        Some((_, client)) if on_session => client.clone(),
                        _ => self.spare_client(i).await?,
                    };
                    if txn.is_none() {
                        let lease = self.marker_lease(&mut client).await?;
                        txn = Some(marked_txn(&g, &markers, lease));
                    }
                    let t = txn.clone().expect("built above");
                    client.txn(t).await
                };
                let err = match tokio::time::timeout(share, attempt).await {
                    Ok(Ok(r)) => {
                        lock(&shared.conn).write_hint = i;
                        let w = decide(&r);
                        if why.iter().any(Option::is_some) {
                            tracing::info!(store = %shared.location, member = %endpoint, result = ?w, "etcd write answered by another member after the first did not answer");
                        }
                        return Ok(w);
                    }
                    Ok(Err(e)) if retryable(&e) => {
                        all_refused &= connection_refused(&e);
                        e.to_string()
                    }
                    Ok(Err(e)) => {
                        if matches!(&e, etcd_client::Error::GRpcStatus(s) if s.code() == Code::NotFound)
                        {
                            // "requested lease not found": the next write takes a new markers'
                            // lease (this one may be what etcd did not find).
                            *lock(&shared.marker_lease) = None;
                        }
                        if refusal(&e) == Refusal::Auth && !on_session {
                            // A spare's token may be what etcd no longer knows: the next write
                            // connects (and authenticates) again.
                            lock(&shared.spares)[i] = None;
                        }
                        let keys = format!(
                            "{keys} (and this host's write markers under {})",
                            shared.keys.write_marker(&shared.opts.host_id, "")
                        );
                        return Err(self.refusal_error(endpoint, &e, &keys));
                    }
                    Err(_) => {
                        all_refused = false;
                        format!("no answer within {share:?}")
                    }
                };
                tracing::debug!(store = %shared.location, member = %endpoint, error = %err, "etcd write: the member did not answer; trying the next one");
                if on_session {
                    session_client = None;
                } else {
                    lock(&shared.spares)[i] = None;
                }
                lock(&shared.conn).write_hint = (i + 1) % n;
                why[i] = Some(format!("{endpoint}: {err}"));
            }
            if all_refused {
                // Writes fail at once from now on, until the session is connected again.
                lock(&shared.conn).moving = false;
                break;
            }
            // No member answered (one is dead, the others wait for a new leader): again after a
            // pause, while time is left.
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(ROUND_PAUSE.min(left)).await;
        }
        let why: Vec<String> = why.into_iter().flatten().collect();
        Err(self.unavailable(if why.is_empty() {
            format!("no answer within {timeout:?}")
        } else {
            why.join("; ")
        }))
    }

    /// Whether to try a write: the session is connected, or it is moving to another member (the
    /// write tries the members itself). Otherwise etcd is unreachable (every member failed), or
    /// not reached yet, or the store is closed: a write fails at once.
    pub(crate) fn writable(&self, c: &Conn) -> Result<(), StoreError> {
        if c.closed {
            return Err(self.unavailable("the store was closed"));
        }
        if c.client.is_some() || c.moving {
            return Ok(());
        }
        let why = c
            .last_error
            .clone()
            .unwrap_or_else(|| "not connected".into());
        Err(self.not_connected(why))
    }

    /// A client for member `i` other than the session's (kept until it fails or the session is
    /// connected again: a fresh one has a fresh auth token).
    async fn spare_client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        if let Some(c) = lock(&self.shared.spares)[i].clone() {
            return Ok(c);
        }
        let opts = session::connect_options(&self.shared)
            .map_err(etcd_client::Error::InvalidArgs)?
            .with_keep_alive_while_idle(false);
        let client = Client::connect([&self.shared.opts.endpoints[i]], Some(opts)).await?;
        lock(&self.shared.spares)[i] = Some(client.clone());
        Ok(client)
    }

    /// The markers' lease: the current one while at least half its life is left, else a new one.
    async fn marker_lease(&self, client: &mut Client) -> Result<i64, etcd_client::Error> {
        let ttl = marker_ttl(self.shared.opts.op_timeout);
        if let Some((id, granted)) = *lock(&self.shared.marker_lease) {
            if granted.elapsed() < ttl / 2 {
                return Ok(id);
            }
        }
        let granted = Instant::now();
        let id = client
            .lease_grant(ttl.as_secs().max(1) as i64, None)
            .await?
            .id();
        *lock(&self.shared.marker_lease) = Some((id, granted));
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, "x"))
    }

    #[test]
    fn only_a_member_that_did_not_answer_is_a_reason_to_try_another() {
        // The member is gone, cut off or without a leader.
        for code in [Code::Unavailable, Code::DeadlineExceeded] {
            assert!(retryable(&status(code)), "{code:?}");
        }
        assert!(retryable(&etcd_client::Error::IoError(
            std::io::ErrorKind::ConnectionRefused.into()
        )));
        // The connection broke under the request: tonic's status carries the transport error.
        let broken = tonic::Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )));
        assert!(std::error::Error::source(&broken).is_some());
        assert!(retryable(&etcd_client::Error::GRpcStatus(broken)));
        // A member's answer: never retried.
        for code in [
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::InvalidArgument, // "etcdserver: request is too large"
            Code::NotFound,        // "etcdserver: requested lease not found"
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::AlreadyExists,
            // Sent by the member itself (no transport error under it).
            Code::Unknown,
            Code::Internal,
            Code::Cancelled,
        ] {
            assert!(!retryable(&status(code)), "{code:?}");
        }
        assert!(!retryable(&etcd_client::Error::InvalidArgs("x".into())));
    }

    #[test]
    fn a_refused_connection_is_told_apart_from_other_failures() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(connection_refused(&etcd_client::Error::IoError(refused())));
        // As tonic reports it: a status whose source chain holds the io error.
        let s = tonic::Status::from_error(Box::new(refused()));
        assert!(connection_refused(&etcd_client::Error::GRpcStatus(s)));
        // "no leader", a reset: the member is there.
        assert!(!connection_refused(&status(Code::Unavailable)));
        assert!(!connection_refused(&etcd_client::Error::IoError(
            std::io::ErrorKind::ConnectionReset.into()
        )));
    }

    #[test]
    fn markers_are_fresh_per_write_and_ignored_by_the_mirror() {
        let keys = Keys::new("/p/").unwrap();
        let a = Markers::new(&keys, "host-a");
        let b = Markers::new(&keys, "host-a");
        assert_ne!(a, b);
        assert!(a.applied.starts_with("/p/writes/host-a/"), "{a:?}");
        assert_eq!(a.refused, format!("{}/refused", a.applied));
        assert_eq!(keys.parse(a.applied.as_bytes()), None);
        assert_eq!(keys.parse(a.refused.as_bytes()), None);
    }

    /// Attempts of one write replayed against a real etcd in the orders a dead member can cause:
    /// an attempt whose answer was lost and a retry, a retry that lost to someone else's write and
    /// the first attempt arriving after it.
    #[tokio::test]
    async fn a_write_is_applied_at_most_once_and_a_replay_knows_whether_it_was() {
        let etcd = tokio::task::spawn_blocking(tributary_fakes::etcd::Etcd::start)
            .await
            .unwrap();
        let keys = Keys::new("/t/").unwrap();
        let mut c = Client::connect([etcd.endpoint()], None).await.unwrap();
        let lease = c.lease_grant(30, None).await.unwrap().id();
        let create = |key: &str, value: &str| Guarded {
            compares: vec![Compare::create_revision(key, CompareOp::Equal, 0)],
            ops: vec![TxnOp::put(key, value, None)],
        };
        async fn send(c: &mut Client, t: &Txn) -> Written {
            decide(&c.txn(t.clone()).await.unwrap())
        }
        async fn version(c: &mut Client, key: &str) -> Option<(i64, Vec<u8>)> {
            let r = c.get(key, None).await.unwrap();
            r.kvs()
                .first()
                .map(|kv| (kv.version(), kv.value().to_vec()))
        }

        // Applied, the answer lost, sent again: success at the first revision, written once.
        let t = marked_txn(&create("/t/a", "mine"), &Markers::new(&keys, "h"), lease);
        let Written::Applied(rev) = send(&mut c, &t).await else {
            panic!("first attempt refused")
        };
        assert_eq!(send(&mut c, &t).await, Written::Applied(rev));
        assert_eq!(send(&mut c, &t).await, Written::Applied(rev));
        assert_eq!(version(&mut c, "/t/a").await, Some((1, b"mine".to_vec())));
        // An unguarded put too: a replay does not write it again.
        let put = Guarded {
            compares: vec![],
            ops: vec![TxnOp::put("/t/p", "v", None)],
        };
        let t = marked_txn(&put, &Markers::new(&keys, "h"), lease);
        let first = send(&mut c, &t).await;
        assert_eq!(send(&mut c, &t).await, first);
        assert_eq!(version(&mut c, "/t/p").await, Some((1, b"v".to_vec())));

        // Someone else's write makes the guard fail: refused, on every attempt.
        let t = marked_txn(&create("/t/a", "other"), &Markers::new(&keys, "h"), lease);
        assert!(matches!(send(&mut c, &t).await, Written::Refused(_)));
        assert!(matches!(send(&mut c, &t).await, Written::Refused(_)));
        assert_eq!(version(&mut c, "/t/a").await, Some((1, b"mine".to_vec())));

        // A retry refused (the name was taken), then the name freed, then the first attempt
        // arrives late: it is not applied either (the write answered "refused" stays refused).
        c.put("/t/b", "someone", None).await.unwrap();
        let t = marked_txn(&create("/t/b", "mine"), &Markers::new(&keys, "h"), lease);
        assert!(matches!(send(&mut c, &t).await, Written::Refused(_)));
        c.delete("/t/b", None).await.unwrap();
        assert!(matches!(send(&mut c, &t).await, Written::Refused(_)));
        assert_eq!(version(&mut c, "/t/b").await, None);

        // A removal applied, the answer lost, sent again: still "removed", not "there was none".
        let remove = Guarded {
            compares: vec![Compare::create_revision("/t/a", CompareOp::Greater, 0)],
            ops: vec![TxnOp::delete("/t/a", None)],
        };
        let t = marked_txn(&remove, &Markers::new(&keys, "h"), lease);
        let Written::Applied(rev) = send(&mut c, &t).await else {
            panic!("removal refused")
        };
        assert_eq!(send(&mut c, &t).await, Written::Applied(rev));
        // The markers are under the writer's host and go with their lease.
        let markers = c
            .get(
                "/t/writes/h/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        assert!(markers.kvs().iter().all(|kv| kv.lease() == lease));
        // Applied markers of a, p and the removal; refused markers of their replays (which found
        // the applied one) and of the two writes refused.
        assert_eq!(markers.kvs().len(), 8);
        c.lease_revoke(lease).await.unwrap();
        let markers = c
            .get(
                "/t/writes/",
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        assert!(markers.kvs().is_empty());
    }

    #[test]
    fn the_markers_outlive_every_attempt_of_a_write() {
        // Taken while half its life is left, the lease outlives the write's whole timeout.
        for t in [Duration::from_millis(100), Duration::from_secs(5)] {
            assert!(marker_ttl(t) / 2 > t);
        }
    }
}
