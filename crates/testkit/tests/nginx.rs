//! The fixture against the real nginx.
use std::fs;
use std::process::Command;
use std::time::Duration;
use tributary_testkit::{http_get, Nginx};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn serves_root_and_backends() {
    let nginx = Nginx::builder().backend("a").backend("b").start();
    assert_eq!(nginx.get("/"), (200, "tributary-testkit".to_string()));
    assert_eq!(
        http_get(nginx.backend_port("a"), "/x").unwrap(),
        (200, "a".to_string())
    );
    assert_eq!(
        http_get(nginx.backend_port("b"), "/").unwrap(),
        (200, "b".to_string())
    );
    assert!(nginx.conf_dir().join("upstreams").is_dir());
}

#[test]
fn a_named_port_is_written_into_snippets_and_held_across_a_reload() {
    let nginx = Nginx::builder()
        .named_port("front")
        .http_snippet("server { listen 127.0.0.1:{port:front}; include front/*.conf; }")
        .conf_file("front/a.conf", "location / { return 503; }\n")
        .start();
    let front = nginx.named_port("front");
    assert_ne!(front, nginx.port());
    let conf = fs::read_to_string(nginx.conf_path()).unwrap();
    assert!(
        conf.contains(&format!("listen 127.0.0.1:{front};")),
        "{conf}"
    );
    assert_eq!(http_get(front, "/").unwrap().0, 503);
    let dir = nginx.conf_dir().join("front");
    fs::write(dir.join("a.conf"), "location / { return 200 \"front\"; }\n").unwrap();
    let reload = nginx.reload_cmd();
    let out = Command::new(&reload[0])
        .args(&reload[1..])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let deadline = std::time::Instant::now() + WAIT;
    while http_get(front, "/").ok() != Some((200, "front".into())) {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(nginx.named_port("front"), front);
}

#[test]
fn missing_upstream_is_502_then_proxies_after_reload() {
    let nginx = Nginx::builder().backend("a").start();
    let path = Nginx::upstream_path("api");
    assert_eq!(nginx.get(&path).0, 502);
    let conf = format!(
        "upstream api {{\n    server 127.0.0.1:{} weight=1;\n}}\n",
        nginx.backend_port("a")
    );
    fs::write(nginx.upstreams_dir().join("api.conf"), conf).unwrap();
    let status = Command::new(&nginx.test_cmd()[0])
        .args(&nginx.test_cmd()[1..])
        .status()
        .unwrap();
    assert!(status.success());
    let status = Command::new(&nginx.reload_cmd()[0])
        .args(&nginx.reload_cmd()[1..])
        .status()
        .unwrap();
    assert!(status.success());
    nginx.wait_for_body(&path, "a", WAIT).unwrap();
    nginx
        .wait_until("/", WAIT, |_, _| nginx.reloads_seen() >= 1)
        .unwrap();
    // nginx logs two lines mentioning "reconfiguring" per SIGHUP; one reload counts once.
    assert_eq!(nginx.reloads_seen(), 1, "{}", nginx.error_log());
}

#[test]
fn test_cmd_fails_on_broken_include_and_drop_still_stops() {
    let mut nginx = Nginx::builder().start();
    let pid = nginx.pid().unwrap();
    fs::write(nginx.upstreams_dir().join("bad.conf"), "upstream bad {\n").unwrap();
    let out = Command::new(&nginx.test_cmd()[0])
        .args(&nginx.test_cmd()[1..])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected end of file"));
    assert!(nginx.is_running());
    drop(nginx);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "nginx master {pid} still running after drop"
    );
}

#[test]
fn snippets_and_conf_files() {
    let nginx = Nginx::builder()
        .without_upstreams_glob()
        .conf_file(
            "upstreams/api.conf",
            "upstream api {\n    server 127.0.0.1:9 weight=1;\n}\n",
        )
        .http_snippet("include upstreams/api.conf;")
        .start();
    let conf = fs::read_to_string(nginx.conf_path()).unwrap();
    assert!(conf.contains("include upstreams/api.conf;"));
    assert!(!conf.contains("upstreams/*.conf"));
    // The upstream exists (port 9 refuses): a 502 from the proxy, not a resolver error page.
    nginx.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    assert_eq!(nginx.get("/u/api/").0, 502);
}

#[test]
fn one_worker_after_start_and_settles_after_reload() {
    let nginx = Nginx::builder().backend("a").start();
    nginx.wait_settled(WAIT).unwrap();
    let before = nginx.workers();
    assert_eq!(before.len(), 1, "{before:?}");
    let title = tributary_testkit::procfs::title(before[0]);
    assert!(title.contains("worker process"), "{title}");
    let conf = format!(
        "upstream api {{\n    server 127.0.0.1:{};\n}}\n",
        nginx.backend_port("a")
    );
    fs::write(nginx.upstreams_dir().join("api.conf"), conf).unwrap();
    let status = Command::new(&nginx.reload_cmd()[0])
        .args(&nginx.reload_cmd()[1..])
        .status()
        .unwrap();
    assert!(status.success());
    nginx.wait_for_body("/u/api/", "a", WAIT).unwrap();
    let after = nginx.workers();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0], before[0], "a new worker serves after the reload");
    for _ in 0..20 {
        assert_eq!(nginx.get("/u/api/"), (200, "a".to_string()));
    }
}

#[test]
fn test_cmd_reports_an_unresolvable_host_without_leaving_the_machine() {
    let nginx = Nginx::builder().start();
    fs::write(
        nginx.upstreams_dir().join("ghost.conf"),
        "upstream ghost {\n    server nonexistent.invalid:80 weight=1;\n}\n",
    )
    .unwrap();
    let cmd = nginx.test_cmd();
    if tributary_testkit::network_isolation_available() {
        // In its own network namespace nginx has no route to any resolver: no DNS query leaves.
        assert_eq!(cmd[..2], ["unshare", "-n"]);
    }
    let out = Command::new(&cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("host not found in upstream \"nonexistent.invalid:80\""),
        "{stderr}"
    );
}

/// The fixture with an upstream whose server refuses (port 9), for the error-log check.
fn refusing_upstream() -> tributary_testkit::NginxBuilder {
    Nginx::builder().conf_file(
        "upstreams/api.conf",
        "upstream api {\n    server 127.0.0.1:9 weight=1;\n}\n",
    )
}

const REFUSED: &str = "connect() failed (111: Connection refused) while connecting to upstream";

/// A request to an upstream whose server refuses: nginx logs `[error] connect() failed`.
/// Undeclared, it fails the test when nginx is dropped.
#[test]
#[should_panic(expected = "unexpected error-log lines")]
fn an_undeclared_error_line_fails_the_test_on_drop() {
    let nginx = refusing_upstream().start();
    assert_eq!(nginx.get(&Nginx::upstream_path("api")).0, 502);
    nginx
        .wait_until("/", WAIT, |_, _| nginx.error_log().contains("[error]"))
        .unwrap();
}

/// The same line declared (on the running nginx or in the builder) does not fail the test;
/// another one still would. The fixture's own line for an upstream that does not exist is
/// always expected.
#[test]
fn declared_error_lines_do_not_fail_the_test() {
    let nginx = refusing_upstream().start();
    assert_eq!(nginx.get(&Nginx::upstream_path("api")).0, 502);
    assert_eq!(nginx.get(&Nginx::upstream_path("missing")).0, 502);
    let problems = nginx.log_problems();
    assert!(
        problems.len() == 1 && problems[0].contains(REFUSED),
        "{problems:?}\n{}",
        nginx.error_log()
    );
    assert!(nginx
        .error_log()
        .contains("no resolver defined to resolve missing"));
    nginx.expect_log(REFUSED);
    assert_eq!(nginx.log_problems(), Vec::<String>::new());
    drop(nginx);

    let nginx = refusing_upstream().expect_log(REFUSED).start();
    assert_eq!(nginx.get(&Nginx::upstream_path("api")).0, 502);
    assert_eq!(nginx.log_problems(), Vec::<String>::new());
}
