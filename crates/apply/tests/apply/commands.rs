//! Commands, `nginx -V` parsing, and batch isolation at scale with a fake nginx whose "test"
//! reads the files (fails when any contains BAD) — cheap enough to count tests for many bindings.
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{change, fake, fast, name};
use tributary_apply::{parse_conf_dir, run_command, Applier, ChangeOutcome, CommandNginx, Nginx};

fn argv(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn command_error_shows_output_verbatim() {
    let n = CommandNginx::new(
        argv(&["sh", "-c", "echo 'nginx: [emerg] unknown directive \"x\" in /a.conf:3' >&2; echo second >&2; exit 1"]),
        argv(&["true"]),
    );
    let err = n.test().unwrap_err();
    assert_eq!(err.status, Some(1));
    assert_eq!(
        err.output(),
        "nginx: [emerg] unknown directive \"x\" in /a.conf:3\nsecond"
    );
    let shown = err.to_string();
    assert!(shown.starts_with("`sh -c "), "{shown}");
    assert!(
        shown.ends_with(":\nnginx: [emerg] unknown directive \"x\" in /a.conf:3\nsecond"),
        "{shown}"
    );
    n.reload().unwrap();
}

#[test]
fn missing_program_empty_command_and_timeout_are_errors() {
    let n = CommandNginx::new(argv(&["/nonexistent/nginx", "-t"]), vec![]);
    let err = n.test().unwrap_err();
    assert_eq!(err.status, None);
    assert!(
        err.output().contains("could not run /nonexistent/nginx"),
        "{err}"
    );
    assert_eq!(n.reload().unwrap_err().output(), "empty command");

    let err = run_command(&argv(&["sleep", "5"]), Duration::from_millis(200)).unwrap_err();
    assert!(err.output().contains("timed out"), "{err}");
    assert_eq!(
        run_command(&argv(&["echo", "hi"]), Duration::from_secs(5)).unwrap(),
        "hi\n"
    );
}

#[test]
fn default_commands() {
    let n = CommandNginx::default();
    assert_eq!(n.test_cmd(), ["nginx", "-t"]);
    assert_eq!(n.reload_cmd(), ["nginx", "-s", "reload"]);
}

#[test]
fn conf_dir_from_nginx_v_text() {
    let cases: [(&str, Option<&str>); 6] = [
        (
            "nginx version: nginx/1.22.1\nconfigure arguments: --with-cc-opt='-g -O2' --prefix=/usr/share/nginx --conf-path=/etc/nginx/nginx.conf --http-log-path=/var/log/nginx/access.log",
            Some("/etc/nginx"),
        ),
        ("configure arguments: --prefix=/opt/ngx", Some("/opt/ngx/conf")),
        ("configure arguments: --prefix=/opt/ngx --conf-path=etc/main.conf", Some("/opt/ngx/etc")),
        ("configure arguments: --conf-path='/srv/nginx/nginx.conf'", Some("/srv/nginx")),
        ("configure arguments: --conf-path=\"/x/y/nginx.conf\"", Some("/x/y")),
        ("nginx version: nginx/1.22.1\nconfigure arguments: --with-debug", None),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_conf_dir(text), expected.map(PathBuf::from), "{text}");
    }
}

#[test]
fn bisection_isolates_few_bad_among_many_with_few_tests() {
    let conf = tempfile::tempdir().unwrap();
    let nginx = fake(conf.path());
    let mut applier = Applier::open(conf.path(), Box::new(nginx.clone()), fast()).unwrap();
    let bad = [17usize, 500];
    let batch: Vec<_> = (0..1000)
        .map(|i| {
            let body = if bad.contains(&i) { "BAD" } else { "ok" };
            change(
                &format!("u{i}"),
                format!("upstream u{i} {{ {body} }}\n").into_bytes(),
            )
        })
        .collect();
    let out = applier.apply_batch(&batch);
    assert_eq!(out.len(), 1000);
    for (i, (n, o)) in out.iter().enumerate() {
        if bad.contains(&i) {
            let ChangeOutcome::TestFailed { nginx_error } = o else {
                panic!("{n}: {o:?}")
            };
            assert!(nginx_error.contains(&format!("u{i}.conf")), "{nginx_error}");
            assert!(!conf.path().join(format!("upstreams/u{i}.conf")).exists());
        } else {
            assert_eq!(o, &ChangeOutcome::Applied { reloaded: true }, "{n}");
        }
    }
    assert_eq!(nginx.reloads.load(Ordering::SeqCst), 1);
    let tests = nginx.tests.load(Ordering::SeqCst);
    // 1 batch test + 1 baseline + bisection: about 2·log2(1000) per bad binding; a naive
    // one-by-one search would need 1,000.
    assert!(tests <= 50, "{tests} tests");
    let left: Vec<_> = fs::read_dir(conf.path().join("upstreams"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n != ".tributary.lock")
        .collect();
    assert!(left.is_empty(), "journals or temp files left: {left:?}");
}

#[test]
fn failure_not_caused_by_the_batch_fails_every_change_and_changes_nothing() {
    let conf = tempfile::tempdir().unwrap();
    let nginx = fake(conf.path());
    let mut applier = Applier::open(conf.path(), Box::new(nginx.clone()), fast()).unwrap();
    // Someone else's broken file already in the folder.
    fs::write(conf.path().join("upstreams/other.conf"), "BAD").unwrap();
    let out = applier.apply_batch(&[change("a", b"a".to_vec()), change("b", b"b".to_vec())]);
    for (_, o) in &out {
        let ChangeOutcome::TestFailed { nginx_error } = o else {
            panic!("{o:?}")
        };
        assert!(
            nginx_error.contains("other.conf") && nginx_error.contains("even without"),
            "{nginx_error}"
        );
    }
    assert_eq!(nginx.tests.load(Ordering::SeqCst), 2);
    assert_eq!(applier.read_current(&name("a")), None);
    assert_eq!(applier.read_current(&name("b")), None);
}

#[test]
fn write_failure_is_reported_and_changes_nothing() {
    let conf = tempfile::tempdir().unwrap();
    let nginx = fake(conf.path());
    let mut applier = Applier::open(conf.path(), Box::new(nginx.clone()), fast()).unwrap();
    // A directory where the journal of "blocked" goes: staging it fails half-way.
    fs::create_dir(conf.path().join("upstreams/.blocked.conf.none")).unwrap();
    let out = applier.apply_batch(&[
        change("blocked", b"x".to_vec()),
        change("fine", b"y".to_vec()),
    ]);
    assert!(
        matches!(&out[0].1, ChangeOutcome::WriteFailed { .. }),
        "{out:?}"
    );
    assert_eq!(out[1].1, ChangeOutcome::Applied { reloaded: true });
    assert_eq!(applier.read_current(&name("fine")), Some(b"y".to_vec()));
    assert_eq!(applier.read_current(&name("blocked")), None);
    assert_eq!(nginx.reloads.load(Ordering::SeqCst), 1);
}

#[test]
fn applier_can_move_to_a_blocking_task() {
    fn assert_send<T: Send>() {}
    assert_send::<Applier>();
    assert_send::<tributary_apply::ApplyError>();
}

#[test]
fn remove_when_the_configuration_is_broken_elsewhere_says_so() {
    let conf = tempfile::tempdir().unwrap();
    let nginx = fake(conf.path());
    let mut applier = Applier::open(conf.path(), Box::new(nginx.clone()), fast()).unwrap();
    applier.apply_batch(&[change("a", b"fine".to_vec())]);
    fs::write(conf.path().join("upstreams/other.conf"), "BAD").unwrap();
    let out = applier.remove(&name("a")).unwrap();
    let tributary_apply::RemoveOutcome::Refused { nginx_error } = out else {
        panic!("{out:?}")
    };
    assert!(
        nginx_error.contains("fails with and without the file"),
        "{nginx_error}"
    );
    assert!(
        !nginx_error.contains("remove the include line"),
        "{nginx_error}"
    );
    assert_eq!(applier.read_current(&name("a")), Some(b"fine".to_vec()));
}
