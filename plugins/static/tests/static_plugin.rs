//! The built `tributary-plugin-static` binary, driven by the real plugin host and the conformance
//! checker.

use std::path::{Path, PathBuf};

use serde_json::json;
use tributary_plugin_host::check::{check_plugin, Outcome};
use tributary_plugin_host::{HostOptions, PluginHost, ResolveError};
use tributary_protocol::{ConfigMap, ResolveParams, ERR_CONFIG};

fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A plugins directory holding a copy of this plugin's folder whose executable is the binary cargo
/// built for this test.
fn plugins_dir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("static");
    std::fs::create_dir_all(&dir).unwrap();
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source_dir().join("plugin.json")).unwrap())
            .unwrap();
    m["executable"] = json!(env!("CARGO_BIN_EXE_tributary-plugin-static"));
    std::fs::write(dir.join("plugin.json"), m.to_string()).unwrap();
    std::fs::copy(
        source_dir().join("conformance.json"),
        dir.join("conformance.json"),
    )
    .unwrap();
    tmp
}

fn params(config: serde_json::Value, service: &str) -> ResolveParams {
    ResolveParams {
        provider: "static".into(),
        config: serde_json::from_value::<ConfigMap>(config).unwrap(),
        service: service.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolves_through_the_host() {
    let tmp = plugins_dir();
    let (host, errors) = PluginHost::load(tmp.path(), HostOptions::default());
    assert!(errors.is_empty(), "{errors:?}");
    let r = host
        .resolve(
            "static",
            params(
                json!({"targets":"10.0.0.2:8080:2, 10.0.0.1:8080 [2001:db8::17]:8443","ttl_seconds":30}),
                "api",
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.ttl_seconds, 30);
    assert_eq!(
        r.targets,
        vec![
            json!({"address":"10.0.0.2","port":8080,"weight":2}),
            json!({"address":"10.0.0.1","port":8080}),
            json!({"address":"2001:db8::17","port":8443}),
        ]
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_errors_name_the_field_and_never_the_value() {
    let tmp = plugins_dir();
    let (host, _) = PluginHost::load(tmp.path(), HostOptions::default());
    let cases = [
        (json!({}), "targets"),
        (json!({"targets":"10.0.0.1:99999"}), "targets"),
        (json!({"targets":"10.0.0.1:80","services":"api"}), "service"),
        (
            json!({"targets":"10.0.0.1:80","ttl_seconds":"30"}),
            "ttl_seconds",
        ),
    ];
    for (config, field) in cases {
        let e: ResolveError = host
            .resolve("static", params(config.clone(), "web"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ERR_CONFIG), "{config}: {e}");
        assert_eq!(e.field(), Some(field), "{config}: {e}");
        if let Some(t) = config.get("targets").and_then(|t| t.as_str()) {
            assert!(!e.to_string().contains(t), "value leaked: {e}");
        }
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker() {
    let tmp = plugins_dir();
    let report = check_plugin(&tmp.path().join("static")).await;
    assert!(report.passed(), "{report}");
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Skip(_)))
        .collect();
    assert!(skipped.is_empty(), "{report}");
    assert!(report.checks.len() >= 10, "{report}");
    assert!(report.to_string().contains("conforms"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_works_through_its_launcher() {
    // plugins/static/plugin.json points at run.sh, which starts the binary cargo built into the
    // target directory (this test's build made target/debug/tributary-plugin-static).
    let plugins = source_dir().parent().unwrap().to_path_buf();
    let (host, errors) = PluginHost::load(&plugins, HostOptions::default());
    assert!(
        !errors.iter().any(|e| e.dir() == source_dir()),
        "{errors:?}"
    );
    let r = host
        .resolve("static", params(json!({"targets":"127.0.0.1:9"}), "demo"))
        .await
        .unwrap_or_else(|e| panic!("{e}\nstderr: {:?}", host.stderr_tail("static")));
    assert_eq!(r.targets, vec![json!({"address":"127.0.0.1","port":9})]);
    host.shutdown().await;
    let report = check_plugin(Path::new(&source_dir())).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_from_a_relative_plugins_dir() {
    // Tests run in the package folder: `..` is `plugins/`, `.` is `plugins/static`.
    let (host, _errors) = PluginHost::load(Path::new(".."), HostOptions::default());
    let r = host
        .resolve("static", params(json!({"targets":"127.0.0.1:9"}), "demo"))
        .await
        .unwrap_or_else(|e| panic!("{e}\nstderr: {:?}", host.stderr_tail("static")));
    assert_eq!(r.targets.len(), 1);
    host.shutdown().await;
    let report = check_plugin(Path::new(".")).await;
    assert!(report.passed(), "{report}");
}
