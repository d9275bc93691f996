//! The apply transaction against a real nginx (Debian's, own prefix, loopback; see tributary-testkit).
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::common::*;
use tributary_apply::{
    Applier, ApplyError, ApplyOptions, ChangeOutcome, CommandError, CommandNginx,
    Nginx as ApplyNginx, RemoveOutcome,
};
use tributary_testkit::Nginx;

#[test]
fn new_file_is_written_tested_reloaded_and_traffic_moves() {
    let nginx = Nginx::builder().backend("a").backend("b").start();
    let (count, mut applier) = open(&nginx, fast());
    let path = Nginx::upstream_path("api");
    assert_eq!(nginx.get(&path).0, 502, "no upstream yet");

    let v1 = upstream_bytes("api", &[nginx.backend_port("a")], &["keepalive 4;"]);
    let out = applier.apply_batch(&[change("api", v1.clone())]);
    assert_eq!(
        out,
        vec![(name("api"), ChangeOutcome::Applied { reloaded: true })]
    );
    assert_eq!((count.tests(), count.reloads()), (1, 1));
    assert_eq!(
        fs::read(nginx.upstreams_dir().join("api.conf")).unwrap(),
        v1
    );
    assert_eq!(applier.read_current(&name("api")), Some(v1));
    nginx.wait_for_body(&path, "a", WAIT).unwrap();

    let v2 = upstream_bytes("api", &[nginx.backend_port("b")], &[]);
    let out = applier.apply_batch(&[change("api", v2)]);
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    assert_eq!((count.tests(), count.reloads()), (2, 2));
    nginx.wait_for_body(&path, "b", WAIT).unwrap();
    // Only our file and the lock: no temp or journal files left behind.
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
}

#[test]
fn unchanged_bytes_mean_no_write_no_test_no_reload() {
    let nginx = Nginx::builder().backend("a").start();
    let (count, mut applier) = open(&nginx, fast());
    let v1 = upstream_bytes("api", &[nginx.backend_port("a")], &[]);
    applier.apply_batch(&[change("api", v1.clone())]);
    let file = nginx.upstreams_dir().join("api.conf");
    let before = fs::metadata(&file).unwrap();
    let (tests, reloads) = (count.tests(), count.reloads());

    let out = applier.apply_batch(&[change("api", v1.clone()), change("api", v1)]);
    assert_eq!(out, vec![(name("api"), ChangeOutcome::Unchanged)]);
    assert_eq!((count.tests(), count.reloads()), (tests, reloads));
    let after = fs::metadata(&file).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec(), before.mtime()),
        (after.ino(), after.mtime_nsec(), after.mtime())
    );
}

#[test]
fn failing_test_restores_previous_bytes_and_records_nginx_message() {
    let nginx = Nginx::builder().backend("a").start();
    let (count, mut applier) = open(&nginx, fast());
    let path = Nginx::upstream_path("api");
    let good = upstream_bytes("api", &[nginx.backend_port("a")], &[]);
    applier.apply_batch(&[change("api", good.clone())]);
    nginx.wait_for_body(&path, "a", WAIT).unwrap();
    let reloads = count.reloads();

    let bad = upstream_bytes("api", &[nginx.backend_port("a")], &[BOGUS]);
    let out = applier.apply_batch(&[change("api", bad)]);
    let ChangeOutcome::TestFailed { nginx_error } = &out[0].1 else {
        panic!("expected TestFailed, got {out:?}")
    };
    assert!(
        nginx_error.contains("unknown directive \"bogus_directive\""),
        "{nginx_error}"
    );
    assert!(nginx_error.contains("api.conf"), "{nginx_error}");
    assert_eq!(applier.read_current(&name("api")), Some(good));
    assert_eq!(count.reloads(), reloads, "no reload after a failed test");
    assert_eq!(nginx.get(&path), (200, "a".to_string()));
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
    // What is on disk passes the test.
    CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd())
        .test()
        .unwrap();
}

#[test]
fn failing_test_of_a_new_file_removes_it() {
    let nginx = Nginx::builder().start();
    let (count, mut applier) = open(&nginx, fast());
    let bad = upstream_bytes("fresh", &[9], &[BOGUS]);
    let out = applier.apply_batch(&[change("fresh", bad)]);
    assert!(
        matches!(&out[0].1, ChangeOutcome::TestFailed { nginx_error } if nginx_error.contains("bogus_directive"))
    );
    assert_eq!(applier.read_current(&name("fresh")), None);
    assert!(!nginx.upstreams_dir().join("fresh.conf").exists());
    assert_eq!(count.reloads(), 0);
    assert_eq!(listing(&nginx.upstreams_dir()), vec![".tributary.lock"]);
}

#[test]
fn reload_failure_restores_and_retests() {
    let mut nginx = Nginx::builder().backend("a").backend("b").start();
    let (count, mut applier) = open(&nginx, fast());
    let v1 = upstream_bytes("api", &[nginx.backend_port("a")], &[]);
    assert!(applier.apply_batch(&[change("api", v1.clone())])[0]
        .1
        .is_ok());

    // With the master gone, `nginx -s reload` fails with nginx's own message; `nginx -t` still works.
    nginx.halt();
    let tests = count.tests();
    let v2 = upstream_bytes("api", &[nginx.backend_port("b")], &[]);
    let fresh = upstream_bytes("fresh", &[nginx.backend_port("b")], &[]);
    let out = applier.apply_batch(&[change("api", v2), change("fresh", fresh)]);
    for (n, o) in &out {
        let ChangeOutcome::ReloadFailed { cause, error } = o else {
            panic!("{n}: expected ReloadFailed, got {o:?}")
        };
        assert_eq!(*cause, tributary_apply::ReloadCause::Command, "{error}");
        assert!(error.contains("nginx.pid"), "nginx's message kept: {error}");
        assert!(
            error.contains("previous files restored; nginx -t passes"),
            "{error}"
        );
    }
    assert_eq!(
        count.tests(),
        tests + 2,
        "one test before, one re-test after the restore"
    );
    assert_eq!(applier.read_current(&name("api")), Some(v1));
    assert_eq!(applier.read_current(&name("fresh")), None);
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
}

#[test]
fn batch_isolates_the_bad_binding_and_applies_the_rest_with_one_reload() {
    let nginx = Nginx::builder()
        .backend("a")
        .backend("b")
        .backend("c")
        .start();
    let (count, mut applier) = open(&nginx, fast());
    let (pa, pb, pc) = (
        nginx.backend_port("a"),
        nginx.backend_port("b"),
        nginx.backend_port("c"),
    );
    let batch = vec![
        change("one", upstream_bytes("one", &[pa], &[])),
        change("two", upstream_bytes("two", &[pb], &[])),
        change("bad", upstream_bytes("bad", &[pa], &[BOGUS])),
        change("four", upstream_bytes("four", &[pc], &["keepalive 2;"])),
        change("five", upstream_bytes("five", &[pa, pb], &[])),
    ];
    let out = applier.apply_batch(&batch);
    let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["one", "two", "bad", "four", "five"],
        "input order kept"
    );
    for (n, o) in &out {
        if n.as_str() == "bad" {
            let ChangeOutcome::TestFailed { nginx_error } = o else {
                panic!("bad: {o:?}")
            };
            assert!(
                nginx_error.contains("bad.conf") && nginx_error.contains("bogus_directive"),
                "{nginx_error}"
            );
        } else {
            assert_eq!(o, &ChangeOutcome::Applied { reloaded: true }, "{n}");
        }
    }
    assert_eq!(count.reloads(), 1, "one reload for the whole batch");
    assert!(!nginx.upstreams_dir().join("bad.conf").exists());
    for (up, body) in [("one", "a"), ("two", "b"), ("four", "c")] {
        nginx
            .wait_for_body(&Nginx::upstream_path(up), body, WAIT)
            .unwrap();
    }
    assert_eq!(nginx.get(&Nginx::upstream_path("bad")).0, 502);
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![
            ".tributary.lock",
            "five.conf",
            "four.conf",
            "one.conf",
            "two.conf"
        ]
    );
}

#[test]
fn good_batch_is_one_test_and_one_reload() {
    let nginx = Nginx::builder().backend("a").start();
    let (count, mut applier) = open(&nginx, fast());
    let pa = nginx.backend_port("a");
    let batch: Vec<_> = (0..20)
        .map(|i| {
            change(
                &format!("u{i}"),
                upstream_bytes(&format!("u{i}"), &[pa], &[]),
            )
        })
        .collect();
    let out = applier.apply_batch(&batch);
    assert!(
        out.iter()
            .all(|(_, o)| *o == ChangeOutcome::Applied { reloaded: true }),
        "{out:?}"
    );
    assert_eq!((count.tests(), count.reloads()), (1, 1));
    nginx
        .wait_for_body(&Nginx::upstream_path("u19"), "a", WAIT)
        .unwrap();
}

#[test]
fn lock_file_refuses_a_second_applier() {
    let nginx = Nginx::builder().start();
    let (_c, first) = open(&nginx, fast());
    let second = Applier::open(
        &nginx.conf_dir(),
        Box::new(CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd())),
        fast(),
    );
    let err = second.unwrap_err();
    assert!(
        matches!(err, ApplyError::Locked { holder: Some(pid), .. } if pid == std::process::id())
    );
    let msg = err.to_string();
    assert!(
        msg.contains("locked by another tributary") && msg.contains(".tributary.lock"),
        "{msg}"
    );
    drop(first);
    let (_c, _again) = open(&nginx, fast());
}

/// A "daemon" that dies between writing and testing: its test panics.
struct CrashBeforeTest;
impl ApplyNginx for CrashBeforeTest {
    fn test(&self) -> Result<(), CommandError> {
        panic!("simulated crash between write and test")
    }
    fn reload(&self) -> Result<(), CommandError> {
        unreachable!()
    }
}

fn crash_while_applying(nginx: &Nginx, changes: &[tributary_apply::Change]) {
    let mut crashing = Applier::open(&nginx.conf_dir(), Box::new(CrashBeforeTest), fast()).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| crashing.apply_batch(changes)));
    assert!(r.is_err(), "the fake must crash");
    drop(crashing); // the process would be gone: its lock goes with it
}

#[test]
fn crash_recovery_restores_a_half_applied_file_that_fails_the_test() {
    let nginx = Nginx::builder().backend("a").start();
    let pa = nginx.backend_port("a");
    let good = upstream_bytes("api", &[pa], &[]);
    {
        let (_c, mut applier) = open(&nginx, fast());
        applier.apply_batch(&[change("api", good.clone())]);
    }
    crash_while_applying(
        &nginx,
        &[
            change("api", upstream_bytes("api", &[pa], &[BOGUS])),
            change("new", upstream_bytes("new", &[pa], &[BOGUS])),
        ],
    );
    // Left on disk: the bad bytes, written but never tested.
    let on_disk = fs::read_to_string(nginx.upstreams_dir().join("api.conf")).unwrap();
    assert!(on_disk.contains("bogus_directive"));
    assert!(CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd())
        .test()
        .is_err());

    let (count, applier) = open(&nginx, fast());
    let report = applier.recovery();
    assert_eq!(report.pending, vec![name("api"), name("new")]);
    assert!(report.restored);
    assert!(
        report
            .test_error
            .as_deref()
            .unwrap()
            .contains("bogus_directive"),
        "{report:?}"
    );
    assert_eq!(report.still_failing, None);
    assert_eq!(count.reloads(), 0);
    assert_eq!(applier.read_current(&name("api")), Some(good));
    assert_eq!(applier.read_current(&name("new")), None);
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
    count.inner.test().unwrap();
}

#[test]
fn crash_recovery_keeps_and_reloads_a_half_applied_file_that_passes() {
    let nginx = Nginx::builder().backend("a").backend("b").start();
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    {
        let (_c, mut applier) = open(&nginx, fast());
        applier.apply_batch(&[change("api", upstream_bytes("api", &[pa], &[]))]);
    }
    nginx
        .wait_for_body(&Nginx::upstream_path("api"), "a", WAIT)
        .unwrap();
    let v2 = upstream_bytes("api", &[pb], &[]);
    crash_while_applying(&nginx, &[change("api", v2.clone())]);

    let (count, applier) = open(&nginx, fast());
    let report = applier.recovery();
    assert_eq!(report.pending, vec![name("api")]);
    assert!(!report.restored);
    assert_eq!(report.reload, Some(Ok(())));
    assert_eq!(count.reloads(), 1);
    assert_eq!(applier.read_current(&name("api")), Some(v2));
    nginx
        .wait_for_body(&Nginx::upstream_path("api"), "b", WAIT)
        .unwrap();
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
}

#[test]
fn clean_open_recovers_nothing_and_removes_stale_temp_files() {
    let nginx = Nginx::builder().start();
    fs::write(nginx.upstreams_dir().join(".api.conf.tmp-1-1"), "half").unwrap();
    let (count, applier) = open(&nginx, fast());
    assert_eq!(
        applier.recovery(),
        &tributary_apply::RecoveryReport::default()
    );
    assert_eq!((count.tests(), count.reloads()), (0, 0));
    assert_eq!(listing(&nginx.upstreams_dir()), vec![".tributary.lock"]);
}

#[test]
fn minimum_gap_between_reloads_is_respected() {
    let gap = Duration::from_millis(700);
    let nginx = Nginx::builder().backend("a").backend("b").start();
    let (count, mut applier) = open(
        &nginx,
        ApplyOptions {
            min_reload_gap: gap,
            ..ApplyOptions::default()
        },
    );
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    for ports in [[pa], [pb], [pa]] {
        let out = applier.apply_batch(&[change("api", upstream_bytes("api", &ports, &[]))]);
        assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    }
    let times = count.reloads.lock().unwrap().clone();
    assert_eq!(times.len(), 3);
    for pair in times.windows(2) {
        let between = pair[1] - pair[0];
        assert!(
            between >= gap,
            "reloads only {between:?} apart; the gap is {gap:?}"
        );
    }
}

#[test]
fn remove_refuses_when_nginx_needs_the_file() {
    let content = "upstream api {\n    server 127.0.0.1:9 weight=1;\n}\n";
    let nginx = Nginx::builder()
        .without_upstreams_glob()
        .conf_file("upstreams/api.conf", content)
        .http_snippet("include upstreams/api.conf;")
        .start();
    let (count, mut applier) = open(&nginx, fast());
    let out = applier.remove(&name("api")).unwrap();
    let RemoveOutcome::Refused { nginx_error } = &out else {
        panic!("expected Refused, got {out:?}")
    };
    assert!(
        nginx_error.contains("remove the include line first"),
        "{nginx_error}"
    );
    assert!(
        nginx_error.contains("api.conf"),
        "nginx's own message: {nginx_error}"
    );
    assert_eq!(
        fs::read_to_string(nginx.upstreams_dir().join("api.conf")).unwrap(),
        content
    );
    assert_eq!(count.reloads(), 0);
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
}

#[test]
fn remove_deletes_and_reloads_when_nginx_passes_without_the_file() {
    let nginx = Nginx::builder().backend("a").start();
    let (count, mut applier) = open(&nginx, fast());
    let path = Nginx::upstream_path("api");
    applier.apply_batch(&[change(
        "api",
        upstream_bytes("api", &[nginx.backend_port("a")], &[]),
    )]);
    nginx.wait_for_body(&path, "a", WAIT).unwrap();
    assert_eq!(
        applier.remove(&name("api")).unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(count.reloads(), 2);
    assert!(!nginx.upstreams_dir().join("api.conf").exists());
    nginx.wait_until(&path, WAIT, |s, _| s == 502).unwrap();
    assert_eq!(
        applier.remove(&name("api")).unwrap(),
        RemoveOutcome::NotFound
    );
    assert_eq!(listing(&nginx.upstreams_dir()), vec![".tributary.lock"]);
}

#[test]
fn conf_dir_from_the_real_nginx_v() {
    let dir = tributary_apply::conf_dir_from_nginx_v(&tributary_testkit::nginx_binary()).unwrap();
    // Debian's package is configured with --conf-path=/etc/nginx/nginx.conf.
    assert_eq!(dir, std::path::PathBuf::from("/etc/nginx"));
    let err = tributary_apply::conf_dir_from_nginx_v(std::path::Path::new("/nonexistent/nginx"))
        .unwrap_err();
    assert!(err.to_string().contains("could not run"), "{err}");
}

#[test]
fn lock_is_visible_to_other_processes_and_released_on_drop() {
    let nginx = Nginx::builder().start();
    let lock = nginx.upstreams_dir().join(tributary_apply::LOCK_FILE);
    let try_lock = || {
        std::process::Command::new("flock")
            .args(["-n", "-E", "75"])
            .arg(&lock)
            .arg("true")
            .status()
            .expect("util-linux `flock` is needed for this test")
            .code()
    };
    let (_c, applier) = open(&nginx, fast());
    assert_eq!(
        try_lock(),
        Some(75),
        "another process must not get the lock"
    );
    assert_eq!(
        fs::read_to_string(&lock).unwrap().trim(),
        std::process::id().to_string()
    );
    drop(applier);
    assert_eq!(try_lock(), Some(0), "the lock is released with the Applier");
}

/// Not a test on its own: the child process of `kill_9_between_write_and_test_is_recovered`. It
/// does nothing unless that test starts it with `TRIBUTARY_CRASH_HELPER_CONF` set; then it writes
/// a change and hangs in `nginx -t` until it is killed.
#[test]
fn crash_helper_child_process() {
    let Ok(conf) = std::env::var("TRIBUTARY_CRASH_HELPER_CONF") else {
        return;
    };
    let bytes = std::env::var("TRIBUTARY_CRASH_HELPER_BYTES").unwrap();
    let upstream = std::env::var("TRIBUTARY_CRASH_HELPER_NAME").unwrap();
    struct Hang;
    impl ApplyNginx for Hang {
        fn test(&self) -> Result<(), CommandError> {
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        fn reload(&self) -> Result<(), CommandError> {
            unreachable!()
        }
    }
    let mut applier = Applier::open(std::path::Path::new(&conf), Box::new(Hang), fast()).unwrap();
    applier.apply_batch(&[change(&upstream, bytes.into_bytes())]);
    unreachable!("the parent kills this process while it tests");
}

#[test]
fn kill_9_between_write_and_test_is_recovered() {
    kill_9_between_write_and_test("api");
}

/// A name holding the temp-file marker (`.tmp-`) kept its journal through a crash.
#[test]
fn kill_9_between_write_and_test_is_recovered_for_a_name_like_svc_tmp_1() {
    kill_9_between_write_and_test("svc.tmp-1");
}

fn kill_9_between_write_and_test(upstream: &str) {
    let nginx = Nginx::builder().backend("a").start();
    let pa = nginx.backend_port("a");
    let good = upstream_bytes(upstream, &[pa], &[]);
    {
        let (_c, mut applier) = open(&nginx, fast());
        applier.apply_batch(&[change(upstream, good.clone())]);
    }
    let bad = String::from_utf8(upstream_bytes(upstream, &[pa], &[BOGUS])).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "real_nginx::crash_helper_child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("TRIBUTARY_CRASH_HELPER_CONF", nginx.conf_dir())
        .env("TRIBUTARY_CRASH_HELPER_BYTES", &bad)
        .env("TRIBUTARY_CRASH_HELPER_NAME", upstream)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let file = nginx.upstreams_dir().join(format!("{upstream}.conf"));
    let deadline = std::time::Instant::now() + WAIT;
    while fs::read_to_string(&file).unwrap_or_default() != bad {
        assert!(
            std::time::Instant::now() < deadline,
            "the child never wrote the file"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no cleanup
    child.wait().unwrap();
    assert!(
        listing(&nginx.upstreams_dir()).contains(&format!(".{upstream}.conf.prev")),
        "the journal is on disk: {:?}",
        listing(&nginx.upstreams_dir())
    );
    assert!(
        nginx_t(&nginx).is_err(),
        "the bad bytes fail nginx -t before recovery"
    );

    let (count, applier) = open(&nginx, fast());
    let report = applier.recovery();
    assert_eq!(report.pending, vec![name(upstream)]);
    assert!(report.restored, "{report:?}");
    assert_eq!(report.restore_error, None);
    assert_eq!(applier.read_current(&name(upstream)), Some(good));
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock".to_string(), format!("{upstream}.conf")]
    );
    count.inner.test().unwrap();
}

fn nginx_t(nginx: &Nginx) -> Result<(), CommandError> {
    CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()).test()
}
