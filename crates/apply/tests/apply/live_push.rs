//! The live path of the applier: a change is pushed once its journal exists, before
//! its new file is written, and confirmed once the file is in place, before the test; pushes stand
//! only when the test passes, and are taken back before the files are restored when it fails.
use std::collections::HashMap;
use std::fs;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::common::{change, fake, fast, name, FakeNginx};
use tributary_apply::{Applier, Change, ChangeOutcome, CommandError, Nginx, Push, UndoError};
use tributary_core::{NeedsReload, ReloadReason};

/// What a [`Recorder`] runs at each push and undo.
type During = Box<dyn FnMut(&str, &Change)>;

/// A push that records what it was asked, refuses the upstreams in `refuse`, and fails its
/// undo when `undo_fails`. Each push, confirm and undo also runs `during` with its name.
#[derive(Default)]
struct Recorder {
    events: Vec<String>,
    refuse: Vec<&'static str>,
    undo_fails: bool,
    during: Option<During>,
}

impl Push for Recorder {
    fn push(&mut self, c: &Change) -> Result<(), NeedsReload> {
        self.events.push(format!("push {}", c.name));
        if let Some(f) = &mut self.during {
            f("push", c);
        }
        if self.refuse.contains(&c.name.as_str()) {
            return Err(NeedsReload::new(
                ReloadReason::LiveFailed,
                "409 from the API",
            ));
        }
        Ok(())
    }
    fn confirm(&mut self, c: &Change) -> Result<(), NeedsReload> {
        self.events.push(format!("confirm {}", c.name));
        if let Some(f) = &mut self.during {
            f("confirm", c);
        }
        Ok(())
    }
    fn undo(&mut self, c: &Change) -> Result<(), UndoError> {
        self.events.push(format!("undo {}", c.name));
        if let Some(f) = &mut self.during {
            f("undo", c);
        }
        if self.undo_fails {
            return Err("the live API did not answer".into());
        }
        Ok(())
    }
}

fn journals(dir: &std::path::Path) -> Vec<String> {
    fs::read_dir(dir.join("upstreams"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".conf."))
        .collect()
}

fn by_name(
    out: Vec<(
        tributary_core::UpstreamName,
        ChangeOutcome,
        Option<NeedsReload>,
    )>,
) -> HashMap<String, (ChangeOutcome, Option<NeedsReload>)> {
    out.into_iter()
        .map(|(n, o, w)| (n.as_str().to_string(), (o, w)))
        .collect()
}

/// A test command that passes only once a push has happened (waiting up to 5 s for it): proves
/// the push does not wait for the test.
struct WaitsForThePush {
    pushed: Arc<(Mutex<bool>, Condvar)>,
    inner: Arc<FakeNginx>,
}

impl Nginx for WaitsForThePush {
    fn test(&self) -> Result<(), CommandError> {
        let (lock, cv) = &*self.pushed;
        let (pushed, _) = cv
            .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(5), |p| !*p)
            .unwrap();
        if !*pushed {
            return Err(CommandError {
                command: "fake -t".into(),
                status: Some(1),
                stderr: "no push happened before the test ended".into(),
            });
        }
        self.inner.test()
    }
    fn reload(&self) -> Result<(), CommandError> {
        self.inner.reload()
    }
}

#[test]
fn the_push_does_not_wait_for_the_test_and_stands_when_it_passes() {
    let dir = tempfile::tempdir().unwrap();
    let nginx = fake(dir.path());
    let pushed = Arc::new((Mutex::new(false), Condvar::new()));
    let gate = WaitsForThePush {
        pushed: pushed.clone(),
        inner: nginx.clone(),
    };
    let mut a = Applier::open(dir.path(), Box::new(gate), fast()).unwrap();
    let up = dir.path().join("upstreams");
    let mut push = Recorder {
        during: Some(Box::new(move |event, _| match event {
            // Pushed once the journal exists ("there was no file"), before the file is written;
            // confirmed once it is in place.
            "push" => {
                assert!(up.join(".api.conf.none").exists() && !up.join("api.conf").exists());
                *pushed.0.lock().unwrap() = true;
                pushed.1.notify_all();
            }
            _ => assert_eq!(
                fs::read(up.join("api.conf")).unwrap(),
                b"server 10.0.0.1:80;"
            ),
        })),
        ..Recorder::default()
    };
    let out = a.apply_live_batch(
        &[change("api", b"server 10.0.0.1:80;".to_vec())],
        &mut push,
        true,
    );
    assert_eq!(
        out,
        vec![(
            name("api"),
            ChangeOutcome::Applied { reloaded: false },
            None
        )]
    );
    assert_eq!(push.events, ["push api", "confirm api"]);
    assert_eq!(a.last_steps().tests, 1);
    assert_eq!(nginx.reloads.load(Ordering::SeqCst), 0);
    assert!(journals(dir.path()).is_empty());
    assert!(a.is_live(&name("api"), b"server 10.0.0.1:80;"));
}

#[test]
fn a_failed_test_takes_every_push_back_then_the_good_ones_go_after_their_own_test() {
    let dir = tempfile::tempdir().unwrap();
    let nginx = fake(dir.path());
    let mut a = Applier::open(dir.path(), Box::new(nginx.clone()), fast()).unwrap();
    let bad_file = dir.path().join("upstreams/bad.conf");
    let mut push = Recorder {
        refuse: vec!["refused"],
        during: Some(Box::new(move |event, c| {
            // The push comes before the bad file is written, the undo before it is restored.
            if c.name.as_str() == "bad" {
                assert_eq!(bad_file.exists(), event != "push", "{event}");
            }
        })),
        ..Recorder::default()
    };
    let out = a.apply_live_batch(
        &[
            change("ok", b"server 10.0.0.1:80;".to_vec()),
            change("refused", b"server 10.0.0.2:80;".to_vec()),
            change("bad", b"BAD".to_vec()),
        ],
        &mut push,
        true,
    );
    assert_eq!(
        push.events,
        [
            // as the journals are made, then confirmed once the files are in place
            "push ok",
            "push refused",
            "push bad",
            "confirm ok",
            "confirm bad",
            // the batch's test fails: taken back (the refused push changed nothing)
            "undo ok",
            "undo bad",
            // the good ones, after the bisection's tests
            "push ok",
            "confirm ok",
            "push refused",
        ]
    );
    let by = by_name(out);
    assert_eq!(by["ok"], (ChangeOutcome::Applied { reloaded: false }, None));
    assert_eq!(
        by["refused"],
        (
            ChangeOutcome::Applied { reloaded: true },
            Some(NeedsReload::new(
                ReloadReason::LiveFailed,
                "409 from the API"
            ))
        )
    );
    let (ChangeOutcome::TestFailed { nginx_error }, None) = &by["bad"] else {
        panic!("{:?}", by["bad"])
    };
    assert!(nginx_error.contains("BAD in"), "{nginx_error}");
    assert!(!dir.path().join("upstreams/bad.conf").exists());
    assert_eq!(
        nginx.reloads.load(Ordering::SeqCst),
        1,
        "one reload for the fallback"
    );
    assert!(
        journals(dir.path()).is_empty(),
        "{:?}",
        journals(dir.path())
    );
    // The same bytes again: unchanged, nothing pushed.
    let mut again = Recorder::default();
    let out = a.apply_live_batch(
        &[change("ok", b"server 10.0.0.1:80;".to_vec())],
        &mut again,
        true,
    );
    assert_eq!(out[0].1, ChangeOutcome::Unchanged);
    assert!(again.events.is_empty(), "{:?}", again.events);
}

#[test]
fn a_push_that_cannot_be_taken_back_is_said_and_the_upstream_is_no_longer_taken_as_live() {
    let dir = tempfile::tempdir().unwrap();
    let nginx = fake(dir.path());
    let mut a = Applier::open(dir.path(), Box::new(nginx.clone()), fast()).unwrap();
    let first = a.apply_batch(&[change("api", b"server 10.0.0.1:80;".to_vec())]);
    assert_eq!(first[0].1, ChangeOutcome::Applied { reloaded: true });
    let mut push = Recorder {
        undo_fails: true,
        ..Recorder::default()
    };
    let out = a.apply_live_batch(&[change("api", b"BAD".to_vec())], &mut push, true);
    assert_eq!(push.events, ["push api", "confirm api", "undo api"]);
    let ChangeOutcome::TestFailed { nginx_error } = &out[0].1 else {
        panic!("{out:?}")
    };
    assert!(
        nginx_error.contains("could not be taken back: the live API did not answer")
            && nginx_error.contains("until the next reload"),
        "{nginx_error}"
    );
    assert_eq!(
        a.read_current(&name("api")).unwrap(),
        b"server 10.0.0.1:80;"
    );
    // nginx may serve the pushed set: the file is not taken as live, so the next change of the
    // same bytes is applied again (the daemon sends it down the reload path).
    assert_eq!(a.live_bytes(&name("api")), None);
    let again = a.apply_batch(&[change("api", b"server 10.0.0.1:80;".to_vec())]);
    assert_eq!(again[0].1, ChangeOutcome::Applied { reloaded: true });
}

#[test]
fn a_file_recovery_puts_back_is_not_taken_as_live() {
    // A crash after a set was pushed and before the test passed: the new file and its journal are
    // on disk, nginx serves the pushed set. Recovery restores the file (the test fails with it);
    // nginx may still serve the pushed set, so the restored file must not count as live.
    let dir = tempfile::tempdir().unwrap();
    let nginx = fake(dir.path());
    let good = b"server 10.0.0.1:80;".to_vec();
    {
        let mut a = Applier::open(dir.path(), Box::new(nginx.clone()), fast()).unwrap();
        a.apply_batch(&[change("api", good.clone())]);
        assert!(a.is_live(&name("api"), &good));
    }
    let up = dir.path().join("upstreams");
    fs::hard_link(up.join("api.conf"), up.join(".api.conf.prev")).unwrap();
    fs::write(up.join(".api.conf.tmp-1-1"), "BAD").unwrap();
    fs::rename(up.join(".api.conf.tmp-1-1"), up.join("api.conf")).unwrap();
    let mut a = Applier::open(dir.path(), Box::new(nginx.clone()), fast()).unwrap();
    assert!(a.recovery().restored, "{:?}", a.recovery());
    assert_eq!(a.read_current(&name("api")), Some(good.clone()));
    assert_eq!(a.live_bytes(&name("api")), None);
    let reloads = nginx.reloads.load(Ordering::SeqCst);
    let out = a.apply_batch(&[change("api", good)]);
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    assert_eq!(nginx.reloads.load(Ordering::SeqCst), reloads + 1);
}

#[test]
fn on_the_callers_word_the_test_is_skipped_once_the_upstream_passed_one() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("upstreams")).unwrap();
    fs::write(dir.path().join("upstreams/api.conf"), "server 10.0.0.1:80;").unwrap();
    let nginx = fake(dir.path());
    let mut a = Applier::open(dir.path(), Box::new(nginx.clone()), fast()).unwrap();
    let tests = || nginx.tests.load(Ordering::SeqCst);
    let mut push = Recorder::default();
    // Found at open: live, but not tested by this Applier — the first change is tested anyway.
    assert!(a.is_live(&name("api"), b"server 10.0.0.1:80;") && !a.tested(&name("api")));
    let out = a.apply_live_batch(
        &[change("api", b"server 10.0.0.2:80;".to_vec())],
        &mut push,
        false,
    );
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: false });
    assert_eq!((tests(), a.last_steps().tests), (1, 1));
    assert!(a.tested(&name("api")));
    // Now the caller's word is enough: pushed, no test, journal gone.
    let out = a.apply_live_batch(
        &[change("api", b"server 10.0.0.3:80;".to_vec())],
        &mut push,
        false,
    );
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: false });
    assert_eq!((tests(), a.last_steps().tests), (1, 0));
    assert!(journals(dir.path()).is_empty());
    assert_eq!(
        a.read_current(&name("api")).unwrap(),
        b"server 10.0.0.3:80;"
    );
    // One upstream of the batch not tested yet: the batch is tested.
    let out = a.apply_live_batch(
        &[
            change("api", b"server 10.0.0.4:80;".to_vec()),
            change("new", b"server 10.0.0.5:80;".to_vec()),
        ],
        &mut push,
        false,
    );
    assert!(out
        .iter()
        .all(|(_, o, _)| *o == ChangeOutcome::Applied { reloaded: false }));
    assert_eq!(tests(), 2);
    // `true` tests every time.
    a.apply_live_batch(
        &[change("api", b"server 10.0.0.6:80;".to_vec())],
        &mut push,
        true,
    );
    assert_eq!(tests(), 3);
    // A push that could not be taken back: not live, not tested — tested again next time.
    let mut stuck = Recorder {
        undo_fails: true,
        ..Recorder::default()
    };
    a.apply_live_batch(&[change("api", b"BAD".to_vec())], &mut stuck, true);
    assert!(!a.tested(&name("api")));
    let before = tests();
    let out = a.apply_live_batch(
        &[change("api", b"server 10.0.0.7:80;".to_vec())],
        &mut push,
        false,
    );
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: false });
    assert_eq!(tests(), before + 1);
}

#[test]
fn a_push_whose_file_cannot_be_written_is_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let up = dir.path().join("upstreams");
    fs::create_dir_all(&up).unwrap();
    let mount = match tributary_testkit::TmpfsMount::mount(&up, 256 * 1024) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("SKIPPED: this test needs to mount a tmpfs (root or CAP_SYS_ADMIN): {e}");
            return;
        }
    };
    let nginx = fake(dir.path());
    let mut a = Applier::open(dir.path(), Box::new(nginx.clone()), fast()).unwrap();
    let old = b"server 10.0.0.1:80;".to_vec();
    a.apply_batch(&[change("api", old.clone())]);
    // The disk fills up right after the push: the new file cannot be written.
    let full = mount.clone();
    let mut push = Recorder {
        during: Some(Box::new(move |event, _| {
            if event == "push" {
                full.fill("filler.bin");
            }
        })),
        ..Recorder::default()
    };
    let new = vec![b'#'; 64 * 1024];
    let out = a.apply_live_batch(&[change("api", new)], &mut push, true);
    assert!(
        matches!(&out[0].1, ChangeOutcome::WriteFailed { error } if error.contains("No space left")),
        "{out:?}"
    );
    assert_eq!(push.events, ["push api", "undo api"]);
    assert_eq!(a.read_current(&name("api")), Some(old));
    assert!(
        journals(dir.path()).is_empty(),
        "{:?}",
        journals(dir.path())
    );
    drop(a);
}
