//! The built `tributary-plugin-file` binary: through the real plugin host, the conformance checker
//! (library and `tributary plugin check`), and end to end through `tributary serve` and a real nginx.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};

use serde_json::json;
use support::{assert_ok, plugin_folder, wait_backends, Daemon};
use tributary_plugin_host::check::{check_plugin, Outcome};
use tributary_plugin_host::{HostOptions, PluginHost};
use tributary_protocol::{ConfigMap, ResolveParams, ERR_CONFIG};
use tributary_testkit::TestNginx;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tributary-plugin-file"))
}

fn params(path: &Path, service: &str) -> ResolveParams {
    ResolveParams {
        provider: "file".into(),
        config: serde_json::from_value::<ConfigMap>(json!({ "path": path })).unwrap(),
        service: service.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolves_through_the_host_and_reads_the_file_on_every_call() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    plugin_folder(&plugins, "file", &bin(), None);
    let file = tmp.path().join("services.json");
    std::fs::write(&file, r#"{"api":["10.0.0.1:80","[2001:db8::1]:443:5"]}"#).unwrap();
    let (host, errors) = PluginHost::load(&plugins, HostOptions::default());
    assert!(errors.is_empty(), "{errors:?}");
    let r = host.resolve("file", params(&file, "api")).await.unwrap();
    assert_eq!(
        r.targets,
        vec![
            json!({"address":"10.0.0.1","port":80}),
            json!({"address":"2001:db8::1","port":443,"weight":5})
        ]
    );
    std::fs::write(&file, r#"{"api":[{"address":"10.0.0.9","port":81}]}"#).unwrap();
    let r = host.resolve("file", params(&file, "api")).await.unwrap();
    assert_eq!(r.targets, vec![json!({"address":"10.0.0.9","port":81})]);

    let e = host
        .resolve("file", params(&file, "web"))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.field()),
        (Some(ERR_CONFIG), Some("service")),
        "{e}"
    );
    std::fs::remove_file(&file).unwrap();
    let e = host
        .resolve("file", params(&file, "api"))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.field()),
        (Some(ERR_CONFIG), Some("path")),
        "{e}"
    );
    assert!(!e.to_string().contains("services.json"), "{e}");
    let stderr = host.stderr_tail("file");
    assert!(
        !format!("{stderr:?}").contains("services.json"),
        "{stderr:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("s.yaml");
    std::fs::write(&file, "demo: ['127.0.0.1:8080']\n").unwrap();
    let sample =
        json!({"provider":"file","config":{"path":file},"service":"demo","unknown_service":"nope"});
    let dir = plugin_folder(&tmp.path().join("plugins"), "file", &bin(), Some(sample));
    let report = check_plugin(&dir).await;
    assert!(report.passed(), "{report}");
    assert!(
        !report
            .checks
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Skip(_))),
        "{report}"
    );
    // The checked-in folder (run.sh launcher, sample/services.yaml relative to the folder) too,
    // through the `tributary plugin check` command.
    support::assert_cli_check_passes(
        &support::tributary_bin(&bin()),
        &support::source_dir(),
        false,
    );
}

#[test]
fn end_to_end_nginx_follows_the_file_and_keeps_servers_when_it_breaks() {
    let tmp = tempfile::tempdir().unwrap();
    let nginx = TestNginx::builder()
        .backend("alpha")
        .backend("beta")
        .backend("gamma")
        .start();
    let port = |n: &str| nginx.backend_port(n);
    let plugins = tmp.path().join("plugins");
    plugin_folder(&plugins, "file", &bin(), None);
    let file = tmp.path().join("registry.yaml");
    let write = |names: &[&str]| {
        let entries: Vec<String> = names
            .iter()
            .map(|n| format!("  - 127.0.0.1:{}\n", port(n)))
            .collect();
        std::fs::write(&file, format!("api:\n{}other: []\n", entries.concat())).unwrap();
    };
    write(&["alpha", "beta"]);
    let daemon = Daemon::start(support::tributary_bin(&bin()), tmp.path(), &plugins, &nginx);

    let path_cfg = format!("path={}", file.display());
    let out = daemon.cli(&[
        "binding",
        "add",
        "api",
        "--plugin",
        "file",
        "--provider",
        "file",
        "--service",
        "api",
        "--config",
        &path_cfg,
        "--interval",
        "10",
    ]);
    assert_ok(&out, "binding add");
    wait_backends(&nginx, "api", &["alpha", "beta"]);
    let conf = nginx.upstreams_dir().join("api.conf");
    assert_eq!(
        std::fs::read_to_string(&conf).unwrap(),
        format!(
            "# generated by tributary\nupstream api {{\n    server 127.0.0.1:{} weight=1;\n    server 127.0.0.1:{} weight=1;\n}}\n",
            port("alpha").min(port("beta")),
            port("alpha").max(port("beta"))
        )
    );

    // Change the registry: one instance out, one in. One refresh brings file and nginx along.
    write(&["beta", "gamma"]);
    let out = daemon.cli(&["binding", "refresh", "api"]);
    assert_ok(&out, "binding refresh");
    wait_backends(&nginx, "api", &["beta", "gamma"]);
    let good = std::fs::read_to_string(&conf).unwrap();
    assert!(good.contains(&format!(":{} ", port("gamma"))), "{good}");
    assert!(!good.contains(&format!(":{} ", port("alpha"))), "{good}");

    // Registry gone (file removed): the refresh fails, nginx keeps its servers, the binding shows why.
    std::fs::remove_file(&file).unwrap();
    let out = daemon.cli(&["binding", "refresh", "api"]);
    assert!(
        !out.status.success(),
        "refresh of a broken registry must fail"
    );
    let b = daemon.show("api");
    let last = &b["last_outcome"];
    assert_eq!(last["status"], "failed", "{b}");
    assert_eq!(last["code"], ERR_CONFIG, "{b}");
    assert_eq!(last["field"], "path", "{b}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), good);
    wait_backends(&nginx, "api", &["beta", "gamma"]);
    assert_eq!(b["servers"].as_array().unwrap().len(), 2, "{b}");

    // An unknown service is a -32003 on `service`, shown on the binding.
    write(&["alpha"]);
    let out = daemon.cli(&[
        "binding",
        "add",
        "nope",
        "--plugin",
        "file",
        "--provider",
        "file",
        "--service",
        "missing",
        "--config",
        &path_cfg,
    ]);
    assert_ok(&out, "binding add (unknown service)");
    let b = daemon.show("nope");
    assert_eq!(b["last_outcome"]["status"], "failed", "{b}");
    assert_eq!(b["last_outcome"]["field"], "service", "{b}");
    assert!(!nginx.upstreams_dir().join("nope.conf").exists());
}
