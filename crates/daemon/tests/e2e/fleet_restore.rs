//! etcd restored from a backup while the fleet runs: a real 3-member etcd cluster,
//! three real daemons with their own nginx (the harness: `common/fleet.rs`). The restored etcd's
//! revisions are below the ones the hosts saw, so are the generations of the sets published after
//! it: every host must rebuild its mirror, drop the bindings etcd no longer has, and apply the
//! sets published after the restore (`docs/fleet.md`, "When etcd is restored from a backup").

use crate::common;

use common::fleet::{Fleet, ALL, WAIT};
use tributary_fakes::wait::poll_for;

/// Waits until every host's store is connected again (after the cluster was stopped).
fn connected(f: &Fleet) {
    for h in &f.hosts {
        poll_for(&format!("{} reconnects", h.id), WAIT, || {
            let (st, v) = h.daemon.api("GET", "/api/v1/store", None);
            if st == 200 && v["connected"] == true {
                Ok(())
            } else {
                Err(format!("{st} {v}"))
            }
        });
    }
}

#[test]
fn after_etcd_is_restored_from_a_backup_every_host_follows_the_restored_store() {
    let mut f = Fleet::start(["", "", ""]);
    f.add(0, "web");
    f.wait_served(&ALL, "web", "one");
    let backup = tempfile::tempdir().unwrap();
    f.cluster.backup(backup.path());
    connected(&f);

    // After the backup: bindings created (etcd's revision moves well past the backup's) and a
    // registry change applied everywhere (the hosts applied a set of a high generation).
    for i in 0..12 {
        f.add(i % 3, &format!("filler{i}"));
    }
    f.registry("two");
    f.wait_served(&ALL, "web", "two");
    f.wait_served(&ALL, "filler11", "two");

    f.cluster.restore(backup.path());
    connected(&f);
    // The bindings created after the backup are gone from etcd: gone from every host.
    for h in &f.hosts {
        poll_for(&format!("{}: the fillers gone", h.id), WAIT, || {
            let (st, v) = h.daemon.api("GET", "/api/v1/bindings", None);
            let text = v.to_string();
            if st == 200 && text.contains("\"web\"") && !text.contains("filler") {
                Ok(())
            } else {
                Err(format!("{st} {text:.300}"))
            }
        });
    }
    // A registry change after the restore: its set has a generation below the ones the hosts
    // applied before, and every host applies it.
    f.registry("one");
    f.wait_served(&ALL, "web", "one");
}
