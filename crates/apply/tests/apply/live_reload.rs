//! Section 1: a reload counts only once nginx has made the new configuration live
//! (new workers, old ones shutting down), against a real nginx with `master_process on` and two
//! workers.
use std::collections::HashSet;
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use crate::common::*;
use tributary_apply::{Applier, ChangeOutcome, ReloadCause, ReloadConfirm};
use tributary_testkit::{procfs, Nginx};

fn two_workers() -> Nginx {
    Nginx::builder()
        .workers(2)
        .backend("a")
        .backend("b")
        .start()
}

/// Adds a server listening on `port` to the main nginx.conf: `nginx -t` passes (it does not
/// bind), the master's reload fails when another socket holds the port.
fn add_listen_to_main_conf(nginx: &Nginx, port: u16) {
    let conf = fs::read_to_string(nginx.conf_path()).unwrap();
    let conf = conf.replacen(
        "http {\n",
        &format!("http {{\n    server {{ listen 127.0.0.1:{port}; return 204; }}\n"),
        1,
    );
    fs::write(nginx.conf_path(), conf).unwrap();
}

fn serving_workers(nginx: &Nginx) -> HashSet<u32> {
    nginx
        .workers()
        .into_iter()
        .filter(|p| {
            let t = procfs::title(*p);
            t.contains("worker process") && !t.contains("shutting down")
        })
        .collect()
}

#[test]
fn reload_rejected_by_the_master_is_a_failure_with_nginx_emerg_text_and_the_file_restored() {
    let nginx = two_workers();
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    let path = Nginx::upstream_path("api");
    let (count, mut applier) = open(&nginx, confirmed(&nginx));
    let v1 = upstream_bytes("api", &[pa], &[]);
    assert_eq!(
        applier.apply_batch(&[change("api", v1.clone())])[0].1,
        ChangeOutcome::Applied { reloaded: true }
    );
    nginx.wait_for_body(&path, "a", WAIT).unwrap();
    let workers_before = serving_workers(&nginx);

    // Another socket holds a port the main configuration now wants.
    let holder = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let held = holder.local_addr().unwrap().port();
    // The master's reload fails on purpose on this held port (nginx retries the bind, then gives up).
    nginx.expect_log(&format!("bind() to 127.0.0.1:{held} failed"));
    nginx.expect_log("still could not bind()");
    add_listen_to_main_conf(&nginx, held);
    nginx_t(&nginx).expect("nginx -t does not bind ports, so it passes");

    let v2 = upstream_bytes("api", &[pb], &[]);
    let out = applier.apply_batch(&[change("api", v2.clone())]);
    let ChangeOutcome::ReloadFailed { cause, error } = &out[0].1 else {
        panic!("expected ReloadFailed, got {out:?}")
    };
    assert_eq!(*cause, ReloadCause::Rejected, "{error}");
    assert!(
        error.contains("nginx rejected the new configuration"),
        "{error}"
    );
    assert!(
        error.contains("[emerg]")
            && error.contains(&format!("bind() to 127.0.0.1:{held} failed"))
            && error.contains("Address already in use"),
        "nginx's own [emerg] text: {error}"
    );
    assert!(
        error.contains("previous files restored; nginx -t passes"),
        "{error}"
    );
    assert_eq!(applier.read_current(&name("api")), Some(v1.clone()));
    assert_eq!(
        listing(&nginx.upstreams_dir()),
        vec![".tributary.lock", "api.conf"]
    );
    // The old workers still serve the old configuration.
    assert_eq!(serving_workers(&nginx), workers_before);
    assert_eq!(nginx.get(&path), (200, "a".to_string()));

    // A later refresh with the same new bytes is not "unchanged": it is tried (and fails) again.
    let reloads = count.reloads();
    let out = applier.apply_batch(&[change("api", v2.clone())]);
    assert!(
        matches!(&out[0].1, ChangeOutcome::ReloadFailed { error, .. } if error.contains("[emerg]")),
        "{out:?}"
    );
    assert_eq!(count.reloads(), reloads + 1);

    // Once the port is free, the same change goes live.
    drop(holder);
    let out = applier.apply_batch(&[change("api", v2)]);
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    assert_eq!(nginx.get(&path), (200, "b".to_string()));
    assert!(serving_workers(&nginx).is_disjoint(&workers_before));
}

#[test]
fn file_on_disk_that_nginx_has_not_confirmed_is_never_unchanged() {
    let nginx = two_workers();
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    let path = Nginx::upstream_path("api");
    let (count, mut applier) = open(&nginx, confirmed(&nginx));
    let v1 = upstream_bytes("api", &[pa], &[]);
    applier.apply_batch(&[change("api", v1.clone())]);
    nginx.wait_for_body(&path, "a", WAIT).unwrap();
    assert!(applier.is_live(&name("api"), &v1));

    // The file gets the new bytes behind nginx's back (as a reload that never took effect left
    // it): equal bytes on disk are not enough.
    let v2 = upstream_bytes("api", &[pb], &[]);
    fs::write(nginx.upstreams_dir().join("api.conf"), &v2).unwrap();
    let (tests, reloads) = (count.tests(), count.reloads());
    let out = applier.apply_batch(&[change("api", v2.clone())]);
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    assert_eq!((count.tests(), count.reloads()), (tests + 1, reloads + 1));
    assert_eq!(nginx.get(&path), (200, "b".to_string()));
    // Now it is live, and the same bytes are unchanged.
    assert!(applier.is_live(&name("api"), &v2));
    let out = applier.apply_batch(&[change("api", v2)]);
    assert_eq!(out[0].1, ChangeOutcome::Unchanged);
    assert_eq!(count.reloads(), reloads + 1);
}

#[test]
fn confirmed_reload_leaves_only_new_workers_accepting_so_every_next_request_sees_it() {
    let nginx = two_workers();
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    let path = Nginx::upstream_path("api");
    let (_count, mut applier) = open(&nginx, confirmed(&nginx));
    for (round, (port, body)) in [(pa, "a"), (pb, "b"), (pa, "a"), (pb, "b")]
        .into_iter()
        .enumerate()
    {
        let before = serving_workers(&nginx);
        let out = applier.apply_batch(&[change("api", upstream_bytes("api", &[port], &[]))]);
        assert_eq!(
            out[0].1,
            ChangeOutcome::Applied { reloaded: true },
            "round {round}"
        );
        // No polling: the very next requests must reach the new workers.
        let after = serving_workers(&nginx);
        assert!(
            !after.is_empty() && after.is_disjoint(&before),
            "round {round}: {before:?} -> {after:?}"
        );
        for i in 0..50 {
            assert_eq!(
                nginx.get(&path),
                (200, body.to_string()),
                "round {round}, request {i}"
            );
        }
    }
}

#[test]
fn reload_without_a_running_master_is_not_sent_and_the_files_are_restored() {
    let mut nginx = two_workers();
    let (pa, pb) = (nginx.backend_port("a"), nginx.backend_port("b"));
    let (count, mut applier) = open(&nginx, confirmed(&nginx));
    let v1 = upstream_bytes("api", &[pa], &[]);
    assert!(applier.apply_batch(&[change("api", v1.clone())])[0]
        .1
        .is_ok());
    nginx.halt();
    let reloads = count.reloads();
    let out = applier.apply_batch(&[change("api", upstream_bytes("api", &[pb], &[]))]);
    let ChangeOutcome::ReloadFailed { cause, error } = &out[0].1 else {
        panic!("expected ReloadFailed, got {out:?}")
    };
    assert_eq!(*cause, ReloadCause::CannotConfirm, "{error}");
    assert!(
        error.contains("cannot confirm a reload") && error.contains("nginx.pid"),
        "{error}"
    );
    assert_eq!(count.reloads(), reloads, "no signal sent");
    assert_eq!(applier.read_current(&name("api")), Some(v1));
}

#[test]
fn a_master_that_never_starts_new_workers_times_out() {
    // A reload command that exits 0 without signalling anything: nothing changes in nginx.
    let nginx = two_workers();
    let mut confirm = ReloadConfirm::new(nginx.pid_file(), Some(nginx.error_log_path()));
    confirm.timeout = Duration::from_millis(600);
    let opts = tributary_apply::ApplyOptions {
        min_reload_gap: Duration::ZERO,
        confirm: Some(confirm),
    };
    let silent = tributary_apply::CommandNginx::new(nginx.test_cmd(), vec!["true".into()]);
    let mut applier = Applier::open(&nginx.conf_dir(), Box::new(silent), opts).unwrap();
    let v1 = upstream_bytes("api", &[nginx.backend_port("a")], &[]);
    let out = applier.apply_batch(&[change("api", v1.clone())]);
    let ChangeOutcome::ReloadFailed { cause, error } = &out[0].1 else {
        panic!("expected ReloadFailed, got {out:?}")
    };
    assert_eq!(*cause, ReloadCause::Timeout, "{error}");
    assert!(
        error.contains("did not confirm the reload within 600 ms")
            && error
                .contains("0 new worker(s); 2 worker(s) from before the signal still accepting"),
        "{error}"
    );
    assert_eq!(applier.read_current(&name("api")), None);
    assert!(!applier.is_live(&name("api"), &v1));
}

fn nginx_t(nginx: &Nginx) -> Result<(), tributary_apply::CommandError> {
    use tributary_apply::Nginx as _;
    tributary_apply::CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()).test()
}

#[test]
fn pid_file_and_error_log_are_found_from_the_test_command() {
    let nginx = two_workers();
    let found = tributary_apply::discover_reload_paths(nginx.binary(), &nginx.test_cmd());
    assert_eq!(found.pid_file, Some(nginx.pid_file()));
    assert_eq!(found.error_log, Some(nginx.error_log_path()));
    // A test command that cannot dump the configuration: nginx's built-in paths (Debian's).
    let fallback =
        tributary_apply::discover_reload_paths(nginx.binary(), &["/nonexistent/nginx".into()]);
    assert_eq!(
        fallback.pid_file,
        Some(std::path::PathBuf::from("/run/nginx.pid"))
    );
    // Debian builds nginx with --error-log-path=stderr: not a file to read.
    assert_eq!(fallback.error_log, None);
}
