//! Daemon half, end to end: server changes applied through the module's live upstreams
//! API without a reload, everything else (and every live failure) by reload, and the outcome
//! saying which path was taken and why. Real daemon, real `static` plugin, real nginx with
//! `master_process on`, two workers and the combined-upstreams module loaded (its release `.so`,
//! found like `module/t` finds it; `scripts/test.sh` builds it first).

use crate::common;

use std::collections::BTreeSet;
use std::fs;

use common::{http, Daemon};
use serde_json::{json, Value};
use tributary_fakes::daemon::FAST;
use tributary_testkit::Nginx;

fn binding(targets: &str, directives: &[&str]) -> Value {
    json!({"plugin": "static", "provider": "static", "service": "web",
           "config": {"targets": targets}, "directives": directives})
}

fn put_wait(d: &Daemon, name: &str, body: &Value) -> Value {
    let (status, v) = d.api(
        "PUT",
        &format!("/api/v1/bindings/{name}?wait=true"),
        Some(&body.to_string()),
    );
    assert!(status == 200 || status == 201, "{status}: {v}");
    v["binding"]["last_outcome"].clone()
}

fn metric(d: &Daemon, series: &str) -> f64 {
    let (status, text) = http(d.port, "GET", "/metrics", Some(&d.token()), None);
    assert_eq!(status, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn live_nginx(location_extra: &str, backends: &[&str]) -> Nginx {
    let mut b = Nginx::builder().workers(2).live_api(location_extra);
    for name in backends {
        b = b.backend(name);
    }
    b.start()
}

fn daemon(root: &std::path::Path, nginx: &Nginx, extra: &[&str]) -> Daemon {
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend_from_slice(extra);
    Daemon::start_with(root, nginx, &args)
}

/// A daemon in live mode on `nginx`'s API, with `extra` options.
fn live_daemon(root: &std::path::Path, nginx: &Nginx, extra: &[&str]) -> Daemon {
    let api = nginx.live_api_address();
    let mut args = vec!["--apply", "live", "--live-api", &api];
    args.extend_from_slice(extra);
    daemon(root, nginx, &args)
}

fn targets(nginx: &Nginx, names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("127.0.0.1:{}", nginx.backend_port(n)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn worker_pids(nginx: &Nginx) -> BTreeSet<u32> {
    nginx.workers().into_iter().collect()
}

/// Many requests on new connections from several threads, right away (no polling): the set of
/// bodies seen and every non-200.
fn answers(nginx: &Nginx, path: &str) -> (BTreeSet<String>, Vec<(u16, String)>) {
    let all: Vec<(u16, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..40).map(|_| nginx.get(path)).collect::<Vec<_>>()))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let bad = all.iter().filter(|(s, _)| *s != 200).cloned().collect();
    (all.into_iter().map(|(_, b)| b).collect(), bad)
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A new binding goes by reload (nginx has no such upstream yet); then server changes go live:
/// visible on every worker at once, the same worker processes, no reload; a directive change goes
/// by reload again, and each outcome says why.
#[test]
fn server_changes_go_live_on_every_worker_without_a_reload_and_the_rest_by_reload() {
    let root = tempfile::tempdir().unwrap();
    let nginx = live_nginx("", &["a", "b", "c"]);
    let d = live_daemon(root.path(), &nginx, &[]);
    let path = Nginx::upstream_path("web");

    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "new_upstream", "{o}");
    assert!(
        o["applied_reason"]
            .as_str()
            .unwrap()
            .contains("new upstream"),
        "{o}"
    );
    let file = fs::read_to_string(nginx.upstreams_dir().join("web.conf")).unwrap();
    assert!(file.contains("\n    zone web 64k;\n"), "{file}");
    assert_eq!(answers(&nginx, &path), (set(&["a"]), vec![]));
    // A test resolution shows the exact bytes this mode writes, zone line included.
    let mut preview = binding(&targets(&nginx, &["a"]), &[]);
    preview["name"] = json!("web");
    let (status, p) = d.api("POST", "/api/v1/resolve", Some(&preview.to_string()));
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["rendered"], file.as_str(), "{p}");
    nginx
        .wait_settled(std::time::Duration::from_secs(10))
        .unwrap();

    let workers = worker_pids(&nginx);
    assert_eq!(workers.len(), 2, "{workers:?}");
    let reloads = nginx.reloads_seen();
    for (round, names) in [&["b"][..], &["b", "c"], &["a", "c"], &["a"]]
        .into_iter()
        .enumerate()
    {
        let o = put_wait(&d, "web", &binding(&targets(&nginx, names), &[]));
        assert_eq!(o["status"], "ok", "round {round}: {o}");
        assert_eq!(o["applied"], "live", "round {round}: {o}");
        assert_eq!(o["reloaded"], false, "round {round}: {o}");
        assert_eq!(
            answers(&nginx, &path),
            (set(names), vec![]),
            "round {round}: every worker uses the new set at once"
        );
        assert_eq!(worker_pids(&nginx), workers, "round {round}: same workers");
        assert_eq!(nginx.reloads_seen(), reloads, "round {round}: no reload");
        let file = fs::read_to_string(nginx.upstreams_dir().join("web.conf")).unwrap();
        for n in names {
            let port = nginx.backend_port(n);
            assert!(file.contains(&format!("127.0.0.1:{port} ")), "{file}");
        }
    }
    assert_eq!(
        metric(&d, "tributary_changes_applied_total{path=\"live\"}"),
        4.0
    );
    assert_eq!(
        metric(&d, "tributary_changes_applied_total{path=\"reload\"}"),
        1.0
    );
    let (ok, text) = d.cli_text(&["binding", "show", "web"]);
    assert!(ok && text.contains("applied live (no reload)"), "{text}");

    // A directive change: reload, and it says so.
    let o = put_wait(
        &d,
        "web",
        &binding(&targets(&nginx, &["b"]), &["keepalive 4;"]),
    );
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "directives_changed", "{o}");
    assert!(
        o["applied_reason"]
            .as_str()
            .unwrap()
            .contains("directives changed"),
        "{o}"
    );
    assert_eq!(o["reloaded"], true, "{o}");
    assert!(nginx.reloads_seen() > reloads);
    assert_eq!(answers(&nginx, &path), (set(&["b"]), vec![]));
    // After the reload the zone holds what the file says, and server changes go live again.
    nginx
        .wait_settled(std::time::Duration::from_secs(10))
        .unwrap();
    let o = put_wait(
        &d,
        "web",
        &binding(&targets(&nginx, &["c"]), &["keepalive 4;"]),
    );
    assert_eq!(o["applied"], "live", "{o}");
    assert_eq!(answers(&nginx, &path), (set(&["c"]), vec![]));
}

/// The API answers `GET` but refuses the `PUT` (403 from `limit_except`): the change falls back
/// to a reload, is applied, and the outcome says live failed and why.
#[test]
fn live_failure_falls_back_to_a_reload_with_the_reason() {
    let root = tempfile::tempdir().unwrap();
    let nginx = live_nginx("limit_except GET { deny all; }", &["a", "b"]);
    // The API's PUT denied on purpose: the daemon's live apply fails with a 403.
    nginx.expect_log("access forbidden by rule");
    let d = live_daemon(root.path(), &nginx, &[]);
    let path = Nginx::upstream_path("web");
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "new_upstream", "{o}");
    let reloads = nginx.reloads_seen();
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["b"]), &[]));
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "live_failed", "{o}");
    assert_eq!(o["reloaded"], true, "{o}");
    let why = o["applied_reason"].as_str().unwrap();
    assert!(
        why.contains("live apply failed") && why.contains("HTTP 403"),
        "{why}"
    );
    assert!(nginx.reloads_seen() > reloads);
    assert_eq!(answers(&nginx, &path), (set(&["b"]), vec![]));
    assert!(
        fs::read_dir(nginx.upstreams_dir()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".conf.")),
        "no journal left"
    );
}

/// A binding whose own `zone web 64k;` holds 40 servers but not 40 more beside them (a `PUT`
/// of a disjoint set needs room for both): the module answers 507 naming the size, the change is
/// applied by a reload (a new zone holds the new set alone), and the outcome says "zone too small"
/// with that size instead of a bare fallback.
#[test]
fn a_full_zone_reloads_and_the_outcome_says_zone_too_small_with_the_size() {
    let root = tempfile::tempdir().unwrap();
    let nginx = live_nginx("", &["a"]);
    let d = live_daemon(root.path(), &nginx, &[]);
    // Addresses nothing connects to (no request goes to this upstream).
    let set = |from: u16| {
        (from..from + 40)
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let own_zone = ["zone web 64k;"];
    let o = put_wait(&d, "web", &binding(&set(20000), &own_zone));
    assert_eq!(o["status"], "ok", "{o}");
    let o = put_wait(&d, "web", &binding(&set(21000), &own_zone));
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "zone_full", "{o}");
    assert_eq!(o["reloaded"], true, "{o}");
    let why = o["applied_reason"].as_str().unwrap();
    let need: u64 = why
        .strip_prefix("zone too small (need ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a zone-too-small reason: {why}"));
    assert!(need > 65536, "{why}");
    assert!(why.contains("zone is 65536"), "{why}");
    let (_, now) = live_set(&nginx, "web");
    assert_eq!(now.len(), 40);
    assert!(now.contains("127.0.0.1:21000"), "{now:?}");
}

/// One request to the live API on its unix socket: the answer's JSON body.
fn live_request(nginx: &Nginx, method: &str, name: &str, body: Option<&Value>) -> Value {
    common::live::module(nginx, method, name, body)
}

/// `GET <loc>/NAME`: (generation, server addresses).
fn live_set(nginx: &Nginx, name: &str) -> (u64, BTreeSet<String>) {
    let v = live_request(nginx, "GET", name, None);
    let servers = v["servers"].as_array().unwrap();
    (
        v["generation"].as_u64().unwrap(),
        servers
            .iter()
            .map(|s| s["address"].as_str().unwrap().to_string())
            .collect(),
    )
}

/// The daemon dies right after a `PUT` (the journal is linked first, the file not yet renamed):
/// nginx serves the pushed set, the file says the old one. The next start finds the journal,
/// tests and reloads: nginx serves what the file says again.
#[test]
fn a_crash_after_the_put_is_recovered_from_the_journal() {
    let root = tempfile::tempdir().unwrap();
    let nginx = live_nginx("", &["a", "b"]);
    let mut d = live_daemon(root.path(), &nginx, &[]);
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "new_upstream", "{o}");
    d.stop();
    nginx
        .wait_settled(std::time::Duration::from_secs(10))
        .unwrap();
    // The window: journal linked, set pushed, new file not written yet.
    let up = nginx.upstreams_dir();
    fs::hard_link(up.join("web.conf"), up.join(".web.conf.prev")).unwrap();
    let (generation, _) = live_set(&nginx, "web");
    let b = targets(&nginx, &["b"]);
    let put = json!({"servers": [{"address": b, "weight": 1}], "generation": generation});
    live_request(&nginx, "PUT", "web", Some(&put));
    let path = Nginx::upstream_path("web");
    assert_eq!(answers(&nginx, &path), (set(&["b"]), vec![]));
    let reloads = nginx.reloads_seen();

    let _d = live_daemon(root.path(), &nginx, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while up.join(".web.conf.prev").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the journal is never handled"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(nginx.reloads_seen() > reloads, "recovery reloaded");
    nginx
        .wait_settled(std::time::Duration::from_secs(10))
        .unwrap();
    assert_eq!(answers(&nginx, &path), (set(&["a"]), vec![]));
    assert_eq!(live_set(&nginx, "web").1, set(&[&targets(&nginx, &["a"])]));
}

/// `--live-test every`: the set is PUT, then `nginx -t` runs; when the test fails (here another
/// file of the configuration is broken) the set is PUT back before the file is restored: the
/// change is reported failed with nginx's message, traffic and file keep the old set, no reload.
#[test]
fn a_live_change_nginx_t_refuses_is_taken_back() {
    let root = tempfile::tempdir().unwrap();
    let nginx = live_nginx("", &["a", "b"]);
    let d = live_daemon(root.path(), &nginx, &["--live-test", "every"]);
    let path = Nginx::upstream_path("web");
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "new_upstream", "{o}");
    nginx
        .wait_settled(std::time::Duration::from_secs(10))
        .unwrap();
    let file = fs::read_to_string(nginx.upstreams_dir().join("web.conf")).unwrap();
    let old = set(&[&targets(&nginx, &["a"])]);
    let (generation, servers) = live_set(&nginx, "web");
    assert_eq!(servers, old);
    let reloads = nginx.reloads_seen();

    let broken = nginx.upstreams_dir().join("broken.conf");
    fs::write(&broken, "bogus_directive on;\n").unwrap();
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["b"]), &[]));
    assert_eq!(
        (&o["status"], &o["failure"]),
        (&json!("failed"), &json!("test_failed")),
        "{o}"
    );
    let error = o["nginx_error"].as_str().unwrap_or_default();
    assert!(error.contains("bogus_directive"), "{o}");
    assert_eq!(
        live_set(&nginx, "web"),
        (generation + 2, old),
        "pushed during the test (one generation), put back after it failed (another)"
    );
    assert_eq!(answers(&nginx, &path), (set(&["a"]), vec![]));
    assert_eq!(
        fs::read_to_string(nginx.upstreams_dir().join("web.conf")).unwrap(),
        file
    );
    assert_eq!(nginx.reloads_seen(), reloads, "no reload");

    // With the configuration whole again server changes go live.
    fs::remove_file(&broken).unwrap();
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a", "b"]), &[]));
    assert_eq!(
        (&o["status"], &o["applied"]),
        (&json!("ok"), &json!("live")),
        "{o}"
    );
    assert_eq!(answers(&nginx, &path), (set(&["a", "b"]), vec![]));
    assert_eq!(nginx.reloads_seen(), reloads, "no reload");
}

/// Saves `web` on the backends `names`: applied live, and every answer comes from them.
fn goes_live(d: &Daemon, nginx: &Nginx, names: &[&str]) {
    let o = put_wait(d, "web", &binding(&targets(nginx, names), &[]));
    assert_eq!(
        (&o["status"], &o["applied"]),
        (&json!("ok"), &json!("live")),
        "{o}"
    );
    let path = Nginx::upstream_path("web");
    assert_eq!(answers(nginx, &path), (set(names), vec![]));
}

/// `--live-test first` (the default): an upstream's first live change after a start is tested,
/// later ones are not (only server addresses and weights differ from a tested file). Shown with a
/// broken file elsewhere in the configuration, which fails every `nginx -t`.
#[test]
fn by_default_only_an_upstreams_first_live_change_after_start_is_tested() {
    let root = tempfile::tempdir().unwrap();
    let nginx = live_nginx("", &["a", "b", "c"]);
    let mut d = live_daemon(root.path(), &nginx, &[]);
    let path = Nginx::upstream_path("web");
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "new_upstream", "{o}");
    nginx
        .wait_settled(std::time::Duration::from_secs(10))
        .unwrap();
    let broken = nginx.upstreams_dir().join("broken.conf");
    fs::write(&broken, "bogus_directive on;\n").unwrap();
    // Tested by the reload that created it: server changes go live without a test.
    for names in [&["b"][..], &["b", "c"]] {
        goes_live(&d, &nginx, names);
    }
    // Anything else is tested (and refused here).
    let o = put_wait(
        &d,
        "web",
        &binding(&targets(&nginx, &["c"]), &["keepalive 4;"]),
    );
    assert_eq!(o["failure"], "test_failed", "{o}");
    d.stop();

    // After a restart the file was not tested by this daemon: its first live change is.
    let d = live_daemon(root.path(), &nginx, &[]);
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["failure"], "test_failed", "{o}");
    assert_eq!(answers(&nginx, &path), (set(&["b", "c"]), vec![]));
    fs::remove_file(&broken).unwrap();
    for names in [&["a", "b"][..], &["c"]] {
        goes_live(&d, &nginx, names);
    }
}

/// `auto` (the default) with an API that does not answer: reloads, with the reason; without
/// `--live-api`: reloads and the file is the seed's exact render (no zone line).
#[test]
fn auto_mode_without_a_reachable_api_uses_reload() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder()
        .workers(2)
        .backend("a")
        .backend("b")
        .start();
    let gone = root.path().join("no-such.sock");
    let api = format!("unix:{}:/api/", gone.display());
    let mut d = daemon(root.path(), &nginx, &["--live-api", &api]);
    let path = Nginx::upstream_path("web");
    put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["b"]), &[]));
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "api_down", "{o}");
    let why = o["applied_reason"].as_str().unwrap();
    assert!(
        why.contains("live API unavailable") && why.contains("cannot reach"),
        "{why}"
    );
    assert_eq!(answers(&nginx, &path), (set(&["b"]), vec![]));
    d.stop();

    let root2 = tempfile::tempdir().unwrap();
    let d = daemon(root2.path(), &nginx, &[]);
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "no_live_api", "{o}");
    assert!(
        o["applied_reason"]
            .as_str()
            .unwrap()
            .contains("no live API configured"),
        "{o}"
    );
    let file = fs::read_to_string(nginx.upstreams_dir().join("web.conf")).unwrap();
    assert!(!file.contains("zone"), "{file}");
    assert_eq!(answers(&nginx, &path), (set(&["a"]), vec![]));
}

/// `--apply live` without `--live-api`, or with a remote address, is refused at start with a
/// clear message.
#[test]
fn live_mode_needs_a_local_api() {
    let bin = common::tributary_bin();
    for (args, expect) in [
        (&["--apply", "live"][..], "--apply live needs --live-api"),
        (
            &["--live-api", "http://10.1.2.3:8080/api/"][..],
            "only a loopback address",
        ),
    ] {
        let out = std::process::Command::new(&bin)
            .arg("serve")
            .args(["--conf-dir", "/nonexistent-tributary-conf"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(text.contains(expect), "{args:?}: {text}");
    }
}

/// A read-only API (`upstreams_api;` without `write=on`): `--apply live` refuses to start with
/// the fix in its error; `auto` starts, and its changes take the reload path with the reason.
#[test]
fn a_read_only_api_stops_live_mode_and_auto_reloads() {
    let nginx = Nginx::builder()
        .workers(2)
        .live_api_read_only()
        .backend("a")
        .backend("b")
        .start();
    let api = nginx.live_api_address();
    let mut child = std::process::Command::new(common::tributary_bin())
        .arg("serve")
        .args(["--conf-dir", "/nonexistent-tributary-conf"])
        .args(["--apply", "live", "--live-api", &api])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let status = status.expect("--apply live with a read-only API kept running");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut text).unwrap();
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("read-only") && text.contains("upstreams_api write=on;"),
        "{text}"
    );

    let root = tempfile::tempdir().unwrap();
    let d = daemon(
        root.path(),
        &nginx,
        &["--apply", "auto", "--live-api", &api],
    );
    let path = Nginx::upstream_path("web");
    put_wait(&d, "web", &binding(&targets(&nginx, &["a"]), &[]));
    let o = put_wait(&d, "web", &binding(&targets(&nginx, &["b"]), &[]));
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["applied"], "reload", "{o}");
    assert_eq!(o["reload_reason"], "not_listed", "{o}");
    let why = o["applied_reason"].as_str().unwrap();
    assert!(
        why.contains("read-only") && why.contains("upstreams_api write=on;"),
        "{why}"
    );
    assert_eq!(answers(&nginx, &path), (set(&["b"]), vec![]));
}
