//! End to end: failures never empty an upstream; secrets stay write-only; a batch isolates the
//! binding nginx refuses. Real daemon, real plugin processes, real nginx.

use crate::common;

use common::{assert_fails, assert_ok, Daemon};
use serde_json::{json, Value};
use tributary_testkit::Nginx;

const SECRET: &str = "tok_live_S3CR3T_value_9f8e7d";

fn put(daemon: &Daemon, name: &str, body: &Value) -> (u16, Value) {
    daemon.api(
        "PUT",
        &format!("/api/v1/bindings/{name}?wait=true"),
        Some(&body.to_string()),
    )
}

fn testplug(service: &str, config: Value) -> Value {
    json!({"plugin": "testplug", "provider": "t", "service": service, "config": config})
}

#[test]
fn plugin_failures_keep_the_file_and_secrets_never_come_back() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().start();
    let daemon = Daemon::start_with(
        root.path(),
        &nginx,
        &[
            "--with-testplug",
            "--plugin-timeout-secs",
            "2",
            "--min-reload-gap-ms",
            "100",
            "--batch-quiet-ms",
            "50",
        ],
    );
    let file = nginx.upstreams_dir().join("sec.conf");

    let (status, v) = put(
        &daemon,
        "sec",
        &testplug("ok", json!({"token": SECRET, "note": "visible"})),
    );
    assert_eq!(status, 201, "{v}");
    let text = v.to_string();
    assert!(!text.contains(SECRET), "secret echoed: {text}");
    assert_eq!(v["binding"]["config"], json!({"note": "visible"}));
    assert_eq!(v["binding"]["secrets"], json!({"token": true}));
    assert_eq!(v["binding"]["last_outcome"]["status"], "ok", "{v}");
    let good = std::fs::read_to_string(&file).unwrap();
    assert!(good.contains("server 10.0.0.1:80 weight=1;"), "{good}");

    // Each failure keeps the file and records why; the secret (left out: kept) never shows.
    for (service, expect_code, kind) in [
        ("config-error", Some(-32003), "plugin_error"),
        ("provider-error", Some(-32000), "plugin_error"),
        ("hang", None, "plugin_no_answer"),
        ("exit", None, "plugin_no_answer"),
        ("garbage", None, "plugin_no_answer"),
        // An answer without a `targets` array is malformed: the plugin gave no usable answer.
        ("notargets", None, "plugin_no_answer"),
    ] {
        let (status, v) = put(
            &daemon,
            "sec",
            &testplug(service, json!({"note": "visible"})),
        );
        assert_eq!(status, 200, "{service}: {v}");
        let o = &v["binding"]["last_outcome"];
        assert_eq!(o["status"], "failed", "{service}: {v}");
        assert_eq!(o["failure"], kind, "{service}: the failure kind tag: {v}");
        assert!(
            o["why"].as_str().unwrap().contains("kept"),
            "{service}: {v}"
        );
        if let Some(code) = expect_code {
            assert_eq!(o["code"], code, "{service}: {v}");
        }
        if service == "config-error" {
            assert_eq!(o["field"], "token", "{v}");
        }
        assert_eq!(
            v["binding"]["secrets"],
            json!({"token": true}),
            "secret kept on replace"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), good, "{service}");
        assert_eq!(
            v["binding"]["servers"][0]["address"], "10.0.0.1",
            "{service}: {v}"
        );
        let (_, detail) = daemon.api("GET", "/api/v1/bindings/sec", None);
        assert!(!detail.to_string().contains(SECRET), "{service}: {detail}");
    }
    let out = daemon.cli(&["binding", "show", "sec"]);
    let text = assert_ok(&out, "binding show");
    assert!(text.contains("token: (secret, set)"), "{text}");
    assert!(!text.contains(SECRET));
    assert!(
        !daemon.log_text().contains(SECRET),
        "the secret reached the daemon's log"
    );
}

#[test]
fn batch_applies_good_bindings_and_isolates_the_one_nginx_refuses() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().backend("alpha").start();
    let alpha = nginx.backend_port("alpha");
    let daemon = Daemon::start(root.path(), &nginx);
    let target = format!("127.0.0.1:{alpha}");
    let binding = |name: &str, directives: Vec<&str>| {
        json!({"name": name, "plugin": "static", "provider": "static", "service": "demo",
               "config": {"targets": target}, "directives": directives})
    };
    // `keepalive abc;` passes our directive syntax check but fails `nginx -t`.
    let body = json!({"bindings": [
        binding("good1", vec![]),
        binding("bad", vec!["keepalive abc;"]),
        binding("good2", vec!["keepalive 4;"]),
    ]});
    let (status, v) = daemon.api("POST", "/api/v1/bindings/bulk", Some(&body.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 3);
    let has_outcome = |d: &Value| !d["binding"]["last_outcome"].is_null();
    let bad = daemon.wait_for("bad", has_outcome);
    let o = &bad["binding"]["last_outcome"];
    assert_eq!(o["status"], "failed", "{bad}");
    assert_eq!(o["failure"], "test_failed", "{bad}");
    assert!(
        o["nginx_error"]
            .as_str()
            .unwrap_or("")
            .contains("keepalive"),
        "nginx's own message is recorded: {bad}"
    );
    assert!(!nginx.upstreams_dir().join("bad.conf").exists());
    for name in ["good1", "good2"] {
        let d = daemon.wait_for(name, has_outcome);
        assert_eq!(d["binding"]["last_outcome"]["status"], "ok", "{d}");
        nginx
            .wait_for_body(
                &Nginx::upstream_path(name),
                "alpha",
                std::time::Duration::from_secs(20),
            )
            .unwrap();
    }

    // An empty answer ("no servers right now") keeps the file and records a failure.
    let before = std::fs::read_to_string(nginx.upstreams_dir().join("good1.conf")).unwrap();
    let mut empty = binding("good1", vec![]);
    empty["config"]["targets"] = json!(",");
    let (status, v) = put(&daemon, "good1", &empty);
    assert_eq!(status, 200, "{v}");
    let o = &v["binding"]["last_outcome"];
    assert_eq!(o["status"], "failed", "{v}");
    assert_eq!(o["failure"], "no_valid_target", "{v}");
    assert!(o["why"].as_str().unwrap().contains("no servers"), "{v}");
    assert_eq!(
        std::fs::read_to_string(nginx.upstreams_dir().join("good1.conf")).unwrap(),
        before
    );
    assert_eq!(
        nginx.get(&Nginx::upstream_path("good1")),
        (200, "alpha".to_string())
    );
}

#[test]
fn removal_is_refused_while_nginx_still_includes_the_file() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder()
        .backend("alpha")
        .without_upstreams_glob()
        .http_snippet("include upstreams/pinned.conf;")
        .conf_file(
            "upstreams/pinned.conf",
            "upstream pinned { server 127.0.0.1:9; }\n",
        )
        .start();
    let alpha = nginx.backend_port("alpha");
    let daemon = Daemon::start(root.path(), &nginx);
    let out = daemon.cli(&[
        "binding",
        "add",
        "pinned",
        "--plugin",
        "static",
        "--provider",
        "static",
        "--service",
        "demo",
        "--config",
        &format!("targets=127.0.0.1:{alpha}"),
    ]);
    assert_ok(&out, "binding add");
    let out = daemon.cli(&["binding", "rm", "pinned"]);
    let text = assert_fails(&out, "rm of an included upstream");
    assert!(text.contains("remove the include line first"), "{text}");
    assert!(nginx.upstreams_dir().join("pinned.conf").exists());
    let out = daemon.cli(&["binding", "show", "pinned"]);
    assert_ok(&out, "the binding is still there");
}

#[test]
fn plugin_list_and_check() {
    let root = tempfile::tempdir().unwrap();
    let dir = common::static_plugins_dir(root.path());
    std::fs::create_dir_all(dir.join("broken")).unwrap();
    std::fs::write(dir.join("broken/plugin.json"), "{\"name\": \"broken\"}").unwrap();
    let out = std::process::Command::new(common::tributary_bin())
        .args(["plugin", "list", "--json", "--plugins-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let text = assert_ok(&out, "plugin list");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["plugins"][0]["name"], "static", "{v}");
    assert_eq!(v["plugins"][0]["providers"][0]["code"], "static", "{v}");
    assert_eq!(v["errors"].as_array().unwrap().len(), 1, "{v}");
    assert!(v["errors"][0].as_str().unwrap().contains("broken"), "{v}");

    let out = std::process::Command::new(common::tributary_bin())
        .args(["plugin", "check"])
        .arg(common::workspace_root().join("plugins/static"))
        .output()
        .unwrap();
    let text = assert_ok(&out, "plugin check static");
    assert!(text.contains("PASS"), "{text}");
    let out = std::process::Command::new(common::tributary_bin())
        .args(["plugin", "check"])
        .arg(dir.join("broken"))
        .output()
        .unwrap();
    assert_fails(&out, "plugin check of a broken manifest");
}

#[test]
fn changes_ready_together_are_applied_in_one_batch_with_one_reload() {
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().backend("alpha").backend("beta").start();
    let (alpha, beta) = (nginx.backend_port("alpha"), nginx.backend_port("beta"));
    // A generous collection window: the assertion is about batching, not speed.
    let daemon = Daemon::start_with(
        root.path(),
        &nginx,
        &[
            "--batch-quiet-ms",
            "1000",
            "--batch-max-ms",
            "10000",
            "--min-reload-gap-ms",
            "100",
        ],
    );
    let sighups = || {
        nginx
            .error_log()
            .lines()
            .filter(|l| l.contains("signal 1 (SIGHUP) received"))
            .count()
    };
    let all = |port: u16| {
        let list: Vec<Value> = (0..50)
            .map(|i| {
                json!({"name": format!("b{i:02}"), "plugin": "static", "provider": "static",
                       "service": "demo", "config": {"targets": format!("127.0.0.1:{port}")}})
            })
            .collect();
        json!({ "bindings": list }).to_string()
    };
    let wait_all_ok = |port: u16| {
        for i in 0..50 {
            daemon.wait_for(&format!("b{i:02}"), |d| {
                d["binding"]["last_outcome"]["status"] == "ok"
                    && d["binding"]["servers"][0]["port"] == port
            });
        }
    };
    let (status, v) = daemon.api("POST", "/api/v1/bindings/bulk", Some(&all(alpha)));
    assert_eq!(status, 200, "{v}");
    wait_all_ok(alpha);
    let (_, s0) = daemon.api("GET", "/api/v1/stats", None);
    let reloads0 = sighups();

    // Every binding's targets change at once.
    let (status, v) = daemon.api("POST", "/api/v1/bindings/bulk", Some(&all(beta)));
    assert_eq!(status, 200, "{v}");
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["result"] == "updated"));
    wait_all_ok(beta);
    let (_, s1) = daemon.api("GET", "/api/v1/stats", None);
    let batches = s1["batches"].as_u64().unwrap() - s0["batches"].as_u64().unwrap();
    assert_eq!(batches, 1, "50 changes ready together make one batch");
    // nginx logs the SIGHUP asynchronously: wait for it, then make sure there was only one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sighups() == reloads0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(sighups() - reloads0, 1, "one reload for the whole batch");
    nginx
        .wait_for_body(
            &Nginx::upstream_path("b49"),
            "beta",
            std::time::Duration::from_secs(20),
        )
        .unwrap();
}
