//! Bindings through the API and the form: bad input names the field and changes nothing; the
//! plugin's tags are shown but never written to nginx.

use crate::common::{self, workspace_root, Daemon};
use serde_json::{json, Value};

use super::nginx_with_backend;

#[test]
fn api_bad_input_names_the_field_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let d = Daemon::start(root.path(), &nginx);
    let alpha = nginx.backend_port("alpha");
    let good = json!({"name": "api", "plugin": "static", "provider": "static", "service": "demo",
                      "config": {"targets": format!("127.0.0.1:{alpha}")}});
    let cases: Vec<(Value, &str)> = vec![
        (json!({"name": "bad name"}), "name"),
        (json!({"plugin": "nope"}), "plugin"),
        (json!({"provider": "nope"}), "provider"),
        (json!({"service": ""}), "service"),
        (json!({"interval_secs": 1}), "interval_secs"),
        (
            json!({"directives": ["include /etc/passwd;"]}),
            "directives",
        ),
        (
            json!({"config": {"targets": "127.0.0.1:80", "unknown_key": "v"}}),
            "unknown_key",
        ),
        (json!({"config": {"targets": ""}}), "targets"),
        (
            json!({"config": {"targets": "127.0.0.1:80", "ttl_seconds": "soon"}}),
            "ttl_seconds",
        ),
    ];
    for (patch, field) in cases {
        let mut body = good.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        for path in ["/api/v1/bindings", "/api/v1/resolve"] {
            let (status, v) = d.api("POST", path, Some(&body.to_string()));
            assert_eq!(status, 400, "{path} {body}: {v}");
            assert_eq!(v["error"]["field"], field, "{path} {body}: {v}");
            assert!(!v["error"]["message"].as_str().unwrap().is_empty());
        }
    }
    // Bodies that do not parse: the member is named, string values are not repeated.
    let raw_cases = [
        (
            r#"{"name":"api","plugin":"static","provider":"static"}"#,
            "service",
        ),
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","config":"raw-secret-text"}"#,
            "config",
        ),
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","interval_secs":"raw-secret-text"}"#,
            "interval_secs",
        ),
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","colour":"blue"}"#,
            "colour",
        ),
        // A member given twice is refused, not read as its last value.
        (
            r#"{"name":"api","plugin":"static","provider":"static","service":"demo","config":{"targets":"raw-secret-text","targets":"127.0.0.1:1"}}"#,
            "config.targets",
        ),
    ];
    for (body, field) in raw_cases {
        for path in [
            "/api/v1/bindings",
            "/api/v1/resolve",
            "/api/v1/bindings/api",
        ] {
            let method = if path.ends_with("/api") {
                "PUT"
            } else {
                "POST"
            };
            let (status, v) = d.api(method, path, Some(body));
            assert_eq!(status, 400, "{method} {path} {body}: {v}");
            assert_eq!(v["error"]["field"], field, "{method} {path} {body}: {v}");
            assert!(!v.to_string().contains("raw-secret-text"), "{v}");
        }
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );
    assert!(!nginx.upstreams_dir().join("api.conf").exists());
    // Required members left out are checked with the other fields (not by the parser): each is
    // listed in `errors`, next to the other invalid fields.
    for (method, path) in [
        ("POST", "/api/v1/bindings"),
        ("POST", "/api/v1/resolve"),
        ("PUT", "/api/v1/bindings/api"),
        ("POST", "/api/v1/bindings/bulk"),
    ] {
        let one = json!({"name": "api", "interval_secs": 1});
        let body = if path.ends_with("/bulk") {
            json!({"bindings": [one]})
        } else {
            one
        };
        let (status, v) = d.api(method, path, Some(&body.to_string()));
        assert_eq!(status, 400, "{method} {path}: {v}");
        let errors: Vec<(&str, &str)> = v["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path}: {v}"))
            .iter()
            .map(|e| (e["field"].as_str().unwrap(), e["message"].as_str().unwrap()))
            .collect();
        let fields: Vec<&str> = errors.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            ["interval_secs", "plugin", "provider", "service"],
            "{method} {path}: {v}"
        );
        assert!(errors[1].1.ends_with("plugin is required"), "{v}");
    }

    // Several invalid fields at once: `errors` lists each; nothing is created.
    let bad = json!({"name": "bad name", "plugin": "static", "provider": "static", "service": "",
                     "interval_secs": 1, "directives": ["include x;"],
                     "config": {"targets": "", "ttl_seconds": "soon", "colour": "blue"}});
    for (method, path) in [
        ("POST", "/api/v1/bindings"),
        ("POST", "/api/v1/resolve"),
        ("PUT", "/api/v1/bindings/new"),
    ] {
        let mut body = bad.clone();
        if method == "PUT" {
            body["name"] = json!("new");
        }
        let (status, v) = d.api(method, path, Some(&body.to_string()));
        assert_eq!(status, 400, "{method} {path}: {v}");
        let fields: Vec<&str> = v["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        let mut want = vec![
            "colour",
            "directives",
            "interval_secs",
            "service",
            "targets",
            "ttl_seconds",
        ];
        if method == "POST" {
            want.insert(3, "name");
        }
        assert_eq!(fields, want, "{method} {path}: {v}");
        assert_eq!(v["error"], v["errors"][0], "{v}");
    }
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // A bad query string is a JSON error naming the parameter too.
    let (status, v) = d.api(
        "POST",
        "/api/v1/bindings?wait=maybe",
        Some(&good.to_string()),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["field"], "wait", "{v}");
    assert_eq!(
        d.api("GET", "/api/v1/bindings", None).1["bindings"],
        json!([])
    );

    // Test resolve answers what would be written and writes nothing.
    let (status, v) = d.api("POST", "/api/v1/resolve", Some(&good.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "ok");
    assert!(
        v["rendered"]
            .as_str()
            .unwrap()
            .contains(&format!("server 127.0.0.1:{alpha} weight=1;")),
        "{v}"
    );
    assert!(!nginx.upstreams_dir().join("api.conf").exists());
    let mut failing = good.clone();
    failing["config"]["targets"] = json!("not a target list");
    let (status, v) = d.api("POST", "/api/v1/resolve", Some(&failing.to_string()));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], "failed");
    assert!(v["code"].is_i64(), "{v}");
    assert!(v["rendered"].is_null());
}

#[test]
fn tags_from_the_plugin_are_shown_but_never_written() {
    let root = tempfile::tempdir().unwrap();
    let nginx = nginx_with_backend();
    let alpha = nginx.backend_port("alpha");
    // The real `file` plugin next to `static` (its tags are labels for display); the daemon is
    // restarted to load it.
    let mut d = Daemon::start(root.path(), &nginx);
    let bin = common::tributary_bin()
        .parent()
        .unwrap()
        .join("tributary-plugin-file");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --workspace --bins",
        bin.display()
    );
    let mut manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("plugins/file/plugin.json")).unwrap(),
    )
    .unwrap();
    manifest["executable"] = json!(bin.display().to_string());
    std::fs::create_dir_all(d.plugins_dir.join("file")).unwrap();
    std::fs::write(d.plugins_dir.join("file/plugin.json"), manifest.to_string()).unwrap();
    d.stop();
    d.spawn();
    let services = root.path().join("services.json");
    std::fs::write(
        &services,
        json!({"api": [{"address": "127.0.0.1", "port": alpha, "tags": ["zone-a", "canary"]}]})
            .to_string(),
    )
    .unwrap();
    let body = json!({"name": "tagged", "plugin": "file", "provider": "file", "service": "api",
                      "config": {"path": services.display().to_string()}});
    let (status, v) = d.api(
        "POST",
        "/api/v1/bindings?wait=true",
        Some(&body.to_string()),
    );
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        v["binding"]["servers"][0]["tags"],
        json!(["zone-a", "canary"]),
        "{v}"
    );
    let file = std::fs::read_to_string(nginx.upstreams_dir().join("tagged.conf")).unwrap();
    assert!(
        file.contains(&format!("server 127.0.0.1:{alpha} weight=1;")),
        "{file}"
    );
    assert!(
        !file.contains("zone-a") && !file.contains("canary"),
        "{file}"
    );
    let (_, p) = d.api("POST", "/api/v1/resolve", Some(&body.to_string()));
    assert_eq!(p["targets"][0]["tags"], json!(["zone-a", "canary"]), "{p}");
}
