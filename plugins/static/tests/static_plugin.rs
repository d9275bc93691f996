//! The built `tributary-plugin-static` binary, driven by the real plugin host and the conformance
//! checker.

use std::path::Path;

use serde_json::json;
use tributary_fakes::host::{assert_conforms, checked_in, params, HostedPlugin};
use tributary_plugin_host::check::check_plugin;
use tributary_plugin_host::{HostOptions, PluginHost, ResolveError};
use tributary_protocol::ERR_CONFIG;
use tributary_testkit::{this_plugin, PluginPackage};

const PLUGIN: PluginPackage = this_plugin!("tributary-plugin-static");

/// The built plugin under the real host, with this folder's conformance sample.
fn hosted() -> HostedPlugin {
    let text = std::fs::read_to_string(PLUGIN.source_dir().join("conformance.json")).unwrap();
    let sample: serde_json::Value = serde_json::from_str(&text).unwrap();
    HostedPlugin::load(PLUGIN.source_dir(), PLUGIN.bin(), Some(&sample))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolves_through_the_host() {
    let h = hosted();
    let r = h
        .resolve(
            json!({"targets":"10.0.0.2:8080:2, 10.0.0.1:8080 [2001:db8::17]:8443","ttl_seconds":30}),
            "api",
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
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_errors_name_the_field_and_never_the_value() {
    let h = hosted();
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
        let e: ResolveError = h.resolve(config.clone(), "web").await.unwrap_err();
        assert_eq!(e.code(), Some(ERR_CONFIG), "{config}: {e}");
        assert_eq!(e.field(), Some(field), "{config}: {e}");
        if let Some(t) = config.get("targets").and_then(|t| t.as_str()) {
            assert!(!e.to_string().contains(t), "value leaked: {e}");
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker() {
    let h = hosted();
    let report = check_plugin(h.folder()).await;
    assert_conforms(&report, &[]);
    assert!(report.checks.len() >= 10, "{report}");
    assert!(report.to_string().contains("conforms"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_works_through_its_launcher() {
    // plugins/static/plugin.json points at run.sh, which starts the binary cargo built into the
    // target directory (this test's build made target/debug/tributary-plugin-static).
    let host = checked_in(PLUGIN.source_dir());
    let r = host
        .resolve(
            "static",
            params("static", json!({"targets":"127.0.0.1:9"}), "demo"),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nstderr: {:?}", host.stderr_tail("static")));
    assert_eq!(r.targets, vec![json!({"address":"127.0.0.1","port":9})]);
    host.shutdown().await;
    let report = check_plugin(PLUGIN.source_dir()).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_from_a_relative_plugins_dir() {
    // Tests run in the package folder: `..` is `plugins/`, `.` is `plugins/static`.
    let (host, _errors) = PluginHost::load(Path::new(".."), HostOptions::default());
    let r = host
        .resolve(
            "static",
            params("static", json!({"targets":"127.0.0.1:9"}), "demo"),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nstderr: {:?}", host.stderr_tail("static")));
    assert_eq!(r.targets.len(), 1);
    host.shutdown().await;
    let report = check_plugin(Path::new(".")).await;
    assert!(report.passed(), "{report}");
}
