//! The `ec2` plugin against the real `moto_server` (moto from PyPI, IAM authentication on, so every
//! request must carry a SigV4 signature moto verifies with a key it issued): in-process through the
//! SDK's `call`, and as the built binary through the real plugin host and the conformance checker.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tributary_fakes::daemon::{plugin_check_cli, tributary_bin};
use tributary_fakes::host::HostedPlugin;
use tributary_fakes::http::{HttpServer, Resp};
use tributary_fakes::moto::{Moto, REGION};
use tributary_plugin_ec2::Ec2;
use tributary_plugin_host::check::{check_plugin, Outcome};
use tributary_protocol::{ResolveParams, RpcError, ERR_CONFIG, ERR_PROVIDER};

use crate::PLUGIN;

fn params(config: Value, service: &str) -> ResolveParams {
    tributary_fakes::host::params("ec2", config, service)
}

fn config(m: &Moto) -> Value {
    json!({"region": REGION, "access_key_id": m.access_key_id,
           "secret_access_key": m.secret_access_key, "endpoint": m.endpoint(), "port": 8080})
}

async fn resolve(config: Value, service: &str) -> Result<Vec<Value>, RpcError> {
    let p = Ec2::new(Duration::from_secs(5));
    tributary_plugin_sdk::call(&p, params(config, service))
        .await
        .map(|r| {
            let mut t = r.targets;
            t.sort_by(|a, b| a["address"].as_str().cmp(&b["address"].as_str()));
            t
        })
}

fn addresses(t: &[Value]) -> Vec<&str> {
    t.iter().map(|v| v["address"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_tagged_instances_with_weights_addresses_and_port() {
    let m = Moto::start();
    let a = m.run_instances(
        1,
        &[("app", "web"), ("weight", "7"), ("Name", "web-a")],
        Some("127.0.0.11"),
    );
    let b = m.run_instances(1, &[("app", "web")], Some("127.0.0.12"));
    let c = m.run_instances(1, &[("app", "web")], Some("127.0.0.13"));
    m.run_instances(1, &[("app", "db")], Some("127.0.0.14"));
    let t = resolve(config(&m), "app=web").await.unwrap();
    assert_eq!(
        addresses(&t),
        vec!["127.0.0.11", "127.0.0.12", "127.0.0.13"]
    );
    assert_eq!(t[0]["weight"], 7);
    assert_eq!(t[0]["tags"], json!([a[0], "web-a"]));
    assert!(t[1].get("weight").is_none(), "{t:?}");
    assert!(t.iter().all(|v| v["port"] == 8080));

    // Stopped and terminated instances drop out; a new weight tag is picked up.
    m.stop_instances(&[&b[0]]);
    m.terminate(&[&c[0]]);
    m.tag(&[&a[0]], &[("weight", "2")]);
    let t = resolve(config(&m), "app=web").await.unwrap();
    assert_eq!(addresses(&t), vec!["127.0.0.11"]);
    assert_eq!(t[0]["weight"], 2);

    // No instance with the tag: an empty list (EC2 knows no "unknown tag").
    assert_eq!(
        resolve(config(&m), "app=none").await.unwrap(),
        Vec::<Value>::new()
    );

    // Public addresses: as DescribeInstances reports them.
    let ids = m.run_public_instances(2, &[("app", "edge")]);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut public: Vec<String> = m
        .describe(&ids)
        .iter()
        .filter_map(|i| i["public"].as_str().map(str::to_string))
        .collect();
    public.sort();
    assert_eq!(
        public.len(),
        2,
        "moto gives default-VPC instances public addresses"
    );
    let mut cfg = config(&m);
    cfg["address_type"] = json!("public");
    let t = resolve(cfg, "app=edge").await.unwrap();
    assert_eq!(
        addresses(&t),
        public.iter().map(String::as_str).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_credentials_and_bad_config_name_the_field() {
    let m = Moto::start();
    m.run_instances(1, &[("app", "web")], Some("127.0.0.21"));
    let check = |e: RpcError, field: &str| {
        assert_eq!((e.code, e.field()), (ERR_CONFIG, Some(field)), "{e:?}");
        assert!(!e.message.contains(&m.secret_access_key), "{e:?}");
    };
    let mut cfg = config(&m);
    cfg["secret_access_key"] = json!("wrong-secret-0123456789");
    let e = resolve(cfg, "app=web").await.unwrap_err();
    assert!(e.message.contains("AuthFailure"), "{e:?}");
    check(e, "access_key_id");
    let mut cfg = config(&m);
    cfg["access_key_id"] = json!("AKIAUNKNOWNUNKNOWN00");
    check(resolve(cfg, "app=web").await.unwrap_err(), "access_key_id");
    for (key, value) in [
        ("port", json!(0)),
        ("port", json!(70000)),
        ("port", json!(80.5)),
        ("port", json!("80")),
        ("region", json!("EU West")),
        ("endpoint", json!("ftp://127.0.0.1")),
        ("endpoint", json!("http://127.0.0.1/path")),
        ("address_type", json!("elastic")),
    ] {
        let mut cfg = config(&m);
        cfg[key] = value.clone();
        let e = resolve(cfg, "app=web").await.unwrap_err();
        assert_eq!(
            (e.code, e.field()),
            (ERR_CONFIG, Some(key)),
            "{value}: {e:?}"
        );
    }
    for bad in ["app", "=web", "app=", ""] {
        check(resolve(config(&m), bad).await.unwrap_err(), "service");
    }
    let mut cfg = config(&m);
    cfg.as_object_mut().unwrap().remove("secret_access_key");
    check(
        resolve(cfg, "app=web").await.unwrap_err(),
        "secret_access_key",
    );
    // Still working with the right credentials.
    assert_eq!(resolve(config(&m), "app=web").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_down_slow_or_strange_is_a_provider_error() {
    let mut m = Moto::start();
    let cfg = config(&m);
    m.kill();
    let e = resolve(cfg, "app=web").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    assert!(e.message.contains("cannot connect"), "{e:?}");

    let slow = HttpServer::start(
        Arc::new(|_| {
            let mut r = Resp::text(200, "<DescribeInstancesResponse/>");
            r.delay = Some(Duration::from_secs(10));
            r
        }),
        None,
    );
    let mut cfg = config(&m);
    cfg["endpoint"] = json!(format!("http://127.0.0.1:{}", slow.port()));
    let e = resolve(cfg.clone(), "app=web").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    assert!(e.message.contains("did not answer"), "{e:?}");

    let strange = HttpServer::start(Arc::new(|_| Resp::text(503, "<html>busy</html>")), None);
    cfg["endpoint"] = json!(format!("http://127.0.0.1:{}", strange.port()));
    let e = resolve(cfg, "app=web").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
}

/// The built plugin under the real host, with a conformance sample that points at `m`.
fn hosted(m: &Moto) -> HostedPlugin {
    let sample = json!({"provider": "ec2", "config": config(m), "service": "app=web"});
    HostedPlugin::load(PLUGIN.source_dir(), PLUGIN.bin(), Some(&sample))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker_and_never_shows_the_secret() {
    let m = Moto::start();
    m.run_instances(1, &[("app", "web")], Some("127.0.0.31"));
    let h = hosted(&m);
    let report = check_plugin(h.folder()).await;
    // The same through the CLI: `tributary plugin check DIR`.
    let (ok, text) = plugin_check_cli(&tributary_bin(PLUGIN.bin()), h.folder());
    assert!(ok, "{text}");
    assert!(text.contains("PASS") && !text.contains("FAIL"), "{text}");
    assert!(!text.contains(&m.secret_access_key), "{text}");
    assert!(report.passed(), "{report}");
    // EC2 has no "unknown service": that check alone is skipped.
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Skip(_)))
        .collect();
    assert!(skipped.len() <= 1, "{report}");
    let mut captured = report.to_string();

    let host = &h.host;
    let ok = host
        .resolve("ec2", params(config(&m), "app=web"))
        .await
        .unwrap();
    assert_eq!(ok.targets.len(), 1);
    captured.push_str(&serde_json::to_string(&ok).unwrap());
    let mut wrong_key = config(&m);
    wrong_key["access_key_id"] = json!("AKIAUNKNOWNUNKNOWN00");
    let mut down = config(&m);
    down["endpoint"] = json!("http://127.0.0.1:1");
    let mut bad_port = config(&m);
    bad_port["port"] = json!(0);
    for cfg in [wrong_key, down, bad_port] {
        let e = host
            .resolve("ec2", params(cfg, "app=web"))
            .await
            .unwrap_err();
        captured.push_str(&format!("{e} {e:?}\n"));
    }
    captured.push_str(&host.stderr_tail("ec2").join("\n"));
    host.shutdown().await;
    captured.push_str(&m.log_text());
    assert!(
        !captured.contains(&m.secret_access_key),
        "secret leaked: {captured}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_passes_the_checker_through_its_launcher() {
    let report = check_plugin(PLUGIN.source_dir()).await;
    assert!(report.passed(), "{report}");
}
