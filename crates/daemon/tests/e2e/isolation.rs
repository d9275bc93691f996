//! Section "plugins get only what they need", end to end: the real `tributary serve` running the
//! real `tributary-testplug` (and the `static` plugin), with a real nginx.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{assert_fails, assert_ok, tributary_bin, Daemon};
use serde_json::{json, Value};
use tributary_testkit::Nginx;

#[test]
fn a_plugin_run_by_the_daemon_sees_none_of_the_daemons_settings() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_with(root.path(), &nginx, &["--with-testplug"]);
    let token = d.token();
    d.stop();
    // The daemon's own settings in its environment, and a variable nobody declared.
    d.env = vec![
        ("TRIBUTARY_TOKEN".into(), token.clone().into()),
        (
            "TRIBUTARY_UI_PASSWORD".into(),
            "ui-password-e2e-4711".into(),
        ),
        ("TRIBUTARY_API".into(), "http://127.0.0.1:1".into()),
        (
            "UNDECLARED_DAEMON_SECRET".into(),
            "undeclared-e2e-0815".into(),
        ),
    ];
    d.spawn();
    let body = json!({"name": "envdump", "plugin": "testplug", "provider": "t",
                      "service": "env", "config": {"token": "plugin-token-e2e-1234"}});
    let (status, v) = d.api("POST", "/api/v1/resolve", Some(&body.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "ok", "{v}");
    let home = d.data_dir.join("plugin-homes/testplug");
    let dump: Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("env.json")).unwrap()).unwrap();
    let env = dump["env"].as_object().unwrap();
    let mut keys: Vec<&str> = env.keys().map(String::as_str).collect();
    keys.sort();
    for k in &keys {
        assert!(
            ["HOME", "LANG", "PATH", "TZ"].contains(k),
            "{k} reached the plugin: {keys:?}"
        );
    }
    assert_eq!(
        env["HOME"],
        std::path::absolute(&home).unwrap().display().to_string()
    );
    assert_eq!(dump["home_mode"], "700");
    let text = dump.to_string();
    for secret in [
        token.as_str(),
        "ui-password-e2e-4711",
        "undeclared-e2e-0815",
        "127.0.0.1:1",
    ] {
        assert!(
            !text.contains(secret),
            "{secret} reached the plugin: {text}"
        );
    }
}

/// `tributary binding add` through the CLI with `--config` values from the command line.
fn add(d: &Daemon, name: &str, config: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut args = vec![
        "binding",
        "add",
        name,
        "--plugin",
        "testplug",
        "--provider",
        "t",
        "--service",
        "ok",
    ];
    for c in config {
        args.extend(["--config", c]);
    }
    let port = d.port.to_string();
    let api = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(tributary_bin())
        .args(&args)
        .args(["--api", &api, "--data-dir"])
        .arg(&d.data_dir)
        .env_remove("TRIBUTARY_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

#[test]
fn secret_config_values_come_from_a_file_or_stdin_never_from_the_command_line() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(root.path(), &nginx, &["--with-testplug"]);
    // Inline: refused before anything is sent, naming the field and the two ways.
    let out = add(&d, "inline", &["token=s3cr3t-inline-value", "note=x"], None);
    let text = assert_fails(&out, "a secret given inline");
    assert!(text.contains("\"token\" is a secret field"), "{text}");
    assert!(
        text.contains("token=@FILE") && text.contains("token=-"),
        "{text}"
    );
    assert!(!text.contains("s3cr3t-inline-value"), "{text}");
    let (status, _) = d.api("GET", "/api/v1/bindings/inline", None);
    assert_eq!(status, 404, "nothing was saved");
    // From a file (one final newline dropped).
    let file = root.path().join("token.txt");
    std::fs::write(&file, "s3cr3t-from-file\n").unwrap();
    let arg = format!("token=@{}", file.display());
    let out = add(&d, "fromfile", &[&arg, "note=inline is fine here"], None);
    assert_ok(&out, "a secret from a file");
    let b = d.show("fromfile");
    assert_eq!(b["secrets"]["token"], true, "{b}");
    assert_eq!(b["config"]["note"], "inline is fine here", "{b}");
    // From standard input.
    let out = add(&d, "fromstdin", &["token=-"], Some("s3cr3t-from-stdin\n"));
    assert_ok(&out, "a secret from stdin");
    assert_eq!(d.show("fromstdin")["secrets"]["token"], true);
    let (_, v) = d.api("GET", "/api/v1/bindings/fromfile", None);
    assert!(
        !v.to_string().contains("s3cr3t"),
        "secrets are write-only: {v}"
    );

    // The dry run refuses an inline secret the same way.
    let plugins = d.plugins_dir.clone();
    let out = Command::new(tributary_bin())
        .args(["resolve", "--plugins-dir"])
        .arg(&plugins)
        .args(["--plugin", "testplug", "--provider", "t", "--service", "ok"])
        .args(["--config", "token=s3cr3t-dry-run"])
        .output()
        .unwrap();
    let text = assert_fails(&out, "an inline secret in a dry run");
    assert!(text.contains("\"token\" is a secret field"), "{text}");
    assert!(!text.contains("s3cr3t-dry-run"), "{text}");
    let out = Command::new(tributary_bin())
        .args(["resolve", "--plugins-dir"])
        .arg(&plugins)
        .args(["--plugin", "testplug", "--provider", "t", "--service", "ok"])
        .args(["--config".to_string(), arg])
        .output()
        .unwrap();
    assert_ok(&out, "a dry run with the secret from a file");
}

#[test]
fn a_stored_secret_is_never_sent_to_another_endpoint_save_and_test_resolution() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(root.path(), &nginx, &["--with-testplug"]);
    let body = |config: Value| {
        json!({"plugin": "testplug", "provider": "t", "service": "ok", "config": config})
            .to_string()
    };
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/sec",
        Some(&body(
            json!({"token": "s3cr3t-token-1", "address": "a.example", "note": "one"}),
        )),
    );
    assert_eq!(status, 201, "{v}");
    // Same endpoint, secret left out (as a form sends it): kept.
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/sec",
        Some(&body(json!({"address": "a.example", "note": "two"}))),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["secrets"]["token"], true, "{v}");
    // Another endpoint without the secret: refused naming the secret field; nothing changed.
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/sec",
        Some(&body(
            json!({"address": "attacker.example", "note": "three"}),
        )),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "token", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("give \"token\" again") && msg.contains("\"address\""),
        "{msg}"
    );
    assert!(!v.to_string().contains("s3cr3t"), "{v}");
    let (_, shown) = d.api("GET", "/api/v1/bindings/sec", None);
    assert_eq!(
        shown["binding"]["config"]["address"], "a.example",
        "{shown}"
    );
    assert_eq!(shown["binding"]["config"]["note"], "two", "{shown}");
    // The same rule for a test resolution (nothing is sent to the plugin).
    let resolve = |config: Value| {
        let b = json!({"name": "sec", "plugin": "testplug", "provider": "t", "service": "ok",
                       "config": config});
        d.api("POST", "/api/v1/resolve", Some(&b.to_string()))
    };
    let (status, v) = resolve(json!({"address": "attacker.example"}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "token", "{v}");
    let (status, v) = resolve(json!({"address": "a.example"}));
    assert_eq!((status, v["result"].as_str()), (200, Some("ok")), "{v}");
    // Removing the endpoint is a change too.
    let (status, v) = resolve(json!({}));
    assert_eq!(status, 400, "{v}");
    // Given again, the secret goes with the new endpoint.
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/sec",
        Some(&body(
            json!({"token": "s3cr3t-token-2", "address": "b.example"}),
        )),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["config"]["address"], "b.example");
}

#[test]
fn without_an_endpoint_field_a_change_of_any_plain_field_needs_the_secrets_again() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(root.path(), &nginx, &["--with-testplug"]);
    // Provider `n` marks no field `endpoint` (as a plugin written from the seed manifest).
    let body = |config: Value| {
        json!({"plugin": "testplug", "provider": "n", "service": "ok", "config": config})
            .to_string()
    };
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/third",
        Some(&body(
            json!({"token": "s3cr3t-token-1", "key": "s3cr3t-key-1",
                          "address": "a.example", "note": "one"}),
        )),
    );
    assert_eq!(status, 201, "{v}");
    // Nothing changed but the secrets left out (as a form sends it): kept.
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/third",
        Some(&body(json!({"address": "a.example", "note": "one"}))),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["secrets"]["token"], true, "{v}");
    assert_eq!(v["binding"]["secrets"]["key"], true, "{v}");
    // Any plain field changed without the secrets: refused naming both; nothing changed.
    for (what, config) in [
        (
            "address",
            json!({"address": "attacker.example", "note": "one"}),
        ),
        ("note", json!({"address": "a.example", "note": "two"})),
    ] {
        let (status, v) = d.api("PUT", "/api/v1/bindings/third", Some(&body(config)));
        assert_eq!(status, 400, "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains("give \"key\", \"token\" again")
                || msg.contains("give \"token\", \"key\" again"),
            "{what}: {msg}"
        );
        assert!(msg.contains("marks no field `endpoint`"), "{what}: {msg}");
        assert!(!v.to_string().contains("s3cr3t"), "{what}: {v}");
    }
    let (_, shown) = d.api("GET", "/api/v1/bindings/third", None);
    assert_eq!(
        shown["binding"]["config"]["address"], "a.example",
        "{shown}"
    );
    assert_eq!(shown["binding"]["config"]["note"], "one", "{shown}");
    // The CLI goes through the same check (`binding add --replace` without the secrets).
    let out = d.cli(&[
        "binding",
        "add",
        "third",
        "--plugin",
        "testplug",
        "--provider",
        "n",
        "--service",
        "ok",
        "--config",
        "address=attacker.example",
        "--config",
        "note=one",
        "--replace",
    ]);
    let text = assert_fails(
        &out,
        "a changed address without the secrets, through the CLI",
    );
    assert!(text.contains("give \""), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    // And a test resolution (nothing is sent to the plugin).
    let b = json!({"name": "third", "plugin": "testplug", "provider": "n", "service": "ok",
                   "config": {"address": "attacker.example", "note": "one"}});
    let (status, v) = d.api("POST", "/api/v1/resolve", Some(&b.to_string()));
    assert_eq!(status, 400, "{v}");
    // Given again, the secrets go with the new address.
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/third",
        Some(&body(
            json!({"token": "s3cr3t-token-2", "key": "s3cr3t-key-2",
                          "address": "b.example"}),
        )),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["config"]["address"], "b.example");
}

#[test]
fn a_hundred_thousand_invalid_targets_keep_a_bounded_outcome() {
    let nginx = Nginx::builder().start();
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(root.path(), &nginx, &["--with-testplug"]);
    let body = json!({"plugin": "testplug", "provider": "t", "service": "invalid:100000"});
    let (status, v) = d.api(
        "PUT",
        "/api/v1/bindings/flood?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    // Two more answers of 100,000 invalid targets each.
    for _ in 0..2 {
        let (status, o) = d.api("POST", "/api/v1/bindings/flood/refresh", None);
        assert_eq!(status, 200, "{o}");
    }
    let (_, v) = d.api("GET", "/api/v1/bindings/flood", None);
    let history = v["history"].as_array().unwrap();
    assert_eq!(history.len(), 3, "{}", history.len());
    for o in history {
        assert_eq!(
            o["why"], "100000 dropped: bad address ×100000",
            "{}",
            o["why"]
        );
        let dropped = o["dropped"].as_array().unwrap();
        assert_eq!(dropped.len(), 21);
        assert_eq!(dropped[20]["target"], json!({"not_kept": 99_980}));
        assert_eq!(
            dropped[20]["reason"],
            "99980 more not kept: bad address ×99980"
        );
        assert_eq!(o["kept"].as_array().unwrap().len(), 1);
    }
    // The store holds three outcomes of ~2 KiB, not three answers of 3.6 MB.
    let (_, list) = d.api("GET", "/api/v1/bindings", None);
    assert!(list.to_string().len() < 64 * 1024);
    let size: u64 = std::fs::read_dir(&d.data_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tributary.db"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(size < 2 * 1024 * 1024, "store files: {size} bytes");
}
