//! The client's HTTP/2 keep-alive against etcd's minimum ("Scale"): etcd closes a
//! connection whose client pings more often than its `--grpc-keepalive-min-time` (5 s by default)
//! with `too_many_pings`, which ends the session (it moves to another member and reads the prefix
//! again). With a long lease TTL the connection is idle between the lease keep-alives (every
//! TTL/3), so the client's pings are all the member sees: a session of a store left alone for
//! 25 s on a cluster with etcd's defaults must not end.

use std::time::Duration;

use tokio::sync::broadcast::error::TryRecvError;
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_store::{BindingStore, EtcdOptions, EtcdStore, SecretKeys, StoreEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_not_closed_by_etcd_for_pinging_too_often() {
    let cluster = tokio::task::block_in_place(|| EtcdCluster::start(3));
    let dir = tempfile::tempdir().unwrap();
    let mut opts = EtcdOptions::new(
        cluster.endpoints(),
        "/keepalive/",
        "host-a",
        &dir.path().join("a.db"),
    );
    // Lease keep-alives every 20 s: none during the observation after the first.
    opts.lease_ttl = Duration::from_secs(60);
    let keys = SecretKeys::from_bytes(&[&[42u8; 32]]).unwrap();
    let store = EtcdStore::open(opts, keys).unwrap();
    assert!(store.wait_connected(Duration::from_secs(15)).await);
    let mut rx = store.subscribe();
    let at_start = store.status().location;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let mut status_events = 0;
    loop {
        match rx.try_recv() {
            Ok(StoreEvent::Status) => status_events += 1,
            Ok(_) => {}
            Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            Err(TryRecvError::Lagged(_)) => status_events += 1,
        }
    }
    let st = store.status();
    assert_eq!(
        status_events, 0,
        "the session ended: {:?} (was {at_start})",
        st.last_error
    );
    assert!(st.connected, "{st:?}");
    assert_eq!(st.location, at_start);
    store.close().await;
}
