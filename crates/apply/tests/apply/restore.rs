//! Section 2: restoring never loses the good copy. The upstreams folder is a small tmpfs
//! (mounted by the test; needs root) so the disk can be full, or the folder immutable, at the
//! worst moment.
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::*;
use tributary_apply::{Applier, ChangeOutcome, CommandError, CommandNginx, Nginx as ApplyNginx};
use tributary_testkit::{Nginx, TmpfsMount};

// The appliers below confirm their reloads (`confirmed`): the good change's reload is handled by
// the master before the test writes the bogus one. Unconfirmed (`fast()`), a SIGHUP the master
// handled late made it read the bogus file under load (an `[emerg]` in its error log).

/// The real `nginx -t`, with something done to the file system first once armed.
struct Sabotage {
    inner: CommandNginx,
    armed: AtomicBool,
    mount: Arc<TmpfsMount>,
    fill: bool,
}

impl ApplyNginx for Sabotage {
    fn test(&self) -> Result<(), CommandError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            if self.fill {
                self.mount.fill("filler.bin");
            } else {
                self.mount.set_immutable(true).unwrap();
            }
        }
        self.inner.test()
    }
    fn reload(&self) -> Result<(), CommandError> {
        self.inner.reload()
    }
}

fn mount_upstreams(nginx: &Nginx) -> Option<Arc<TmpfsMount>> {
    match TmpfsMount::mount(&nginx.upstreams_dir(), 512 * 1024) {
        Ok(m) => Some(Arc::new(m)),
        Err(e) => {
            eprintln!("SKIPPED: this test needs to mount a tmpfs (root or CAP_SYS_ADMIN): {e}");
            None
        }
    }
}

#[test]
fn restore_on_a_full_file_system_renames_the_journal_back() {
    let nginx = Nginx::builder().backend("a").start();
    let Some(mount) = mount_upstreams(&nginx) else {
        return;
    };
    let pa = nginx.backend_port("a");
    let sabotage = Arc::new(Sabotage {
        inner: CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()),
        armed: AtomicBool::new(false),
        mount: mount.clone(),
        fill: true,
    });
    let mut applier = Applier::open(
        &nginx.conf_dir(),
        Box::new(sabotage.clone()),
        confirmed(&nginx),
    )
    .unwrap();
    let good = upstream_bytes("api", &[pa], &["keepalive 4;"]);
    assert!(applier.apply_batch(&[change("api", good.clone())])[0]
        .1
        .is_ok());

    // The disk fills up between the write and the test; the test then fails.
    sabotage.armed.store(true, Ordering::SeqCst);
    let out = applier.apply_batch(&[
        change("api", upstream_bytes("api", &[pa], &[BOGUS])),
        change("fresh", upstream_bytes("fresh", &[pa], &[BOGUS])),
    ]);
    for (n, o) in &out {
        assert!(
            matches!(o, ChangeOutcome::TestFailed { nginx_error } if nginx_error.contains("bogus_directive")),
            "{n}: {o:?}"
        );
    }
    // The disk really is full: nothing new can be written there.
    let full = fs::write(nginx.upstreams_dir().join("probe"), vec![0u8; 64 * 1024]);
    assert_eq!(
        full.map_err(|e| e.raw_os_error()),
        Err(Some(28)),
        "ENOSPC expected"
    );
    let _ = fs::remove_file(nginx.upstreams_dir().join("probe"));
    assert_eq!(
        fs::read(nginx.upstreams_dir().join("api.conf")).unwrap(),
        good
    );
    assert!(!nginx.upstreams_dir().join("fresh.conf").exists());
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf", "filler.bin"],
        "journals dropped after the restore"
    );
    sabotage
        .inner
        .test()
        .expect("nginx -t passes after the restore");
    drop(applier);
}

#[test]
fn failed_restore_is_an_error_in_the_outcome_keeps_the_journal_and_is_retried() {
    let nginx = Nginx::builder().backend("a").start();
    let Some(mount) = mount_upstreams(&nginx) else {
        return;
    };
    let pa = nginx.backend_port("a");
    let sabotage = Arc::new(Sabotage {
        inner: CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()),
        armed: AtomicBool::new(false),
        mount: mount.clone(),
        fill: false,
    });
    let mut applier = Applier::open(
        &nginx.conf_dir(),
        Box::new(sabotage.clone()),
        confirmed(&nginx),
    )
    .unwrap();
    let good = upstream_bytes("api", &[pa], &[]);
    assert!(applier.apply_batch(&[change("api", good.clone())])[0]
        .1
        .is_ok());

    // The folder turns immutable between the write and the test: nothing can be put back.
    sabotage.armed.store(true, Ordering::SeqCst);
    let out = applier.apply_batch(&[change("api", upstream_bytes("api", &[pa], &[BOGUS]))]);
    let ChangeOutcome::RestoreFailed { cause, error } = &out[0].1 else {
        panic!("expected RestoreFailed, got {out:?}")
    };
    assert!(cause.contains("bogus_directive"), "{cause}");
    assert!(error.contains("Operation not permitted"), "{error}");
    // The good copy is still there, in the journal.
    assert_eq!(
        fs::read(nginx.upstreams_dir().join(".api.conf.prev")).unwrap(),
        good
    );

    // Mutable again: the next operation first finishes the restore, then applies.
    mount.set_immutable(false).unwrap();
    let out = applier.apply_batch(&[change("api", good.clone())]);
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    assert_eq!(
        fs::read(nginx.upstreams_dir().join("api.conf")).unwrap(),
        good
    );
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
    sabotage.inner.test().unwrap();
    drop(applier);
}

#[test]
fn failed_restore_is_finished_by_recovery_at_the_next_start() {
    let nginx = Nginx::builder().backend("a").start();
    let Some(mount) = mount_upstreams(&nginx) else {
        return;
    };
    let pa = nginx.backend_port("a");
    let sabotage = Arc::new(Sabotage {
        inner: CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()),
        armed: AtomicBool::new(false),
        mount: mount.clone(),
        fill: false,
    });
    let good = upstream_bytes("svc.tmp-1", &[pa], &[]);
    {
        let mut applier = Applier::open(
            &nginx.conf_dir(),
            Box::new(sabotage.clone()),
            confirmed(&nginx),
        )
        .unwrap();
        assert!(applier.apply_batch(&[change("svc.tmp-1", good.clone())])[0]
            .1
            .is_ok());
        sabotage.armed.store(true, Ordering::SeqCst);
        let out = applier.apply_batch(&[change(
            "svc.tmp-1",
            upstream_bytes("svc.tmp-1", &[pa], &[BOGUS]),
        )]);
        assert!(
            matches!(&out[0].1, ChangeOutcome::RestoreFailed { .. }),
            "{out:?}"
        );
    }
    mount.set_immutable(false).unwrap();
    let (_count, applier) = open(&nginx, fast());
    let report = applier.recovery();
    assert_eq!(report.pending, vec![name("svc.tmp-1")]);
    assert!(report.restored, "{report:?}");
    assert_eq!(applier.read_current(&name("svc.tmp-1")), Some(good));
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "svc.tmp-1.conf"]
    );
    sabotage.inner.test().unwrap();
    drop(applier);
}
