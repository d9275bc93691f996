//! The `kubernetes` plugin against the fake API server (`tributary-fakes`, EndpointSlice lists over
//! HTTPS with a test CA, written from the Kubernetes API reference): in-process through the SDK's
//! `call`, and as the built binary through the real plugin host and the conformance checker.

use std::time::Duration;

use serde_json::{json, Value};
use tributary_fakes::daemon::{plugin_check_cli, tributary_bin};
use tributary_fakes::host::{assert_conforms, HostedPlugin};
use tributary_fakes::kube::{endpoint, slice, FakeKube};
use tributary_fakes::tls::TestCa;
use tributary_plugin_host::check::check_plugin;
use tributary_plugin_kubernetes::Kubernetes;
use tributary_protocol::{ResolveParams, RpcError, ERR_CONFIG, ERR_PROVIDER};

use crate::PLUGIN;

const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.sa-token-4c1d9e7b2a";

fn params(config: Value, service: &str) -> ResolveParams {
    tributary_fakes::host::params("kubernetes", config, service)
}

fn config(k: &FakeKube) -> Value {
    json!({"api_server": k.api_server(), "token": TOKEN, "ca_cert": k.ca_pem()})
}

async fn resolve(config: Value, service: &str) -> Result<Vec<Value>, RpcError> {
    let p = Kubernetes::new(Duration::from_secs(2));
    tributary_plugin_sdk::call(&p, params(config, service))
        .await
        .map(|r| {
            let mut t = r.targets;
            t.sort_by(|a, b| a["address"].as_str().cmp(&b["address"].as_str()));
            t
        })
}

fn addrs(t: &[Value]) -> Vec<String> {
    t.iter()
        .map(|v| format!("{}:{}", v["address"].as_str().unwrap(), v["port"]))
        .collect()
}

/// `web` in `default` (two slices, ports http=8080 + metrics=9090, one endpoint not ready, one
/// without a ready condition), `api` in `shop` (one port), `db` in `default` with no endpoint yet.
fn cluster(k: &FakeKube) {
    k.set_slices(vec![
        slice(
            "default",
            "web",
            "web-abc",
            &[("app", "web"), ("tier", "front")],
            "IPv4",
            &[("http", 8080), ("metrics", 9090)],
            vec![
                endpoint("10.1.0.1", Some(true), "zone-a", "web-1"),
                endpoint("10.1.0.2", Some(false), "zone-b", "web-2"),
                endpoint("10.1.0.3", None, "zone-b", "web-3"),
            ],
        ),
        slice(
            "default",
            "web",
            "web-def",
            &[("app", "web"), ("tier", "front")],
            "IPv4",
            &[("http", 8080), ("metrics", 9090)],
            vec![endpoint("10.1.0.4", Some(true), "zone-a", "web-4")],
        ),
        slice(
            "shop",
            "api",
            "api-x",
            &[("app", "api")],
            "IPv6",
            &[("", 443)],
            vec![endpoint("fd00::1", Some(true), "zone-a", "api-1")],
        ),
        slice(
            "default",
            "db",
            "db-x",
            &[("app", "db")],
            "IPv4",
            &[("pg", 5432)],
            vec![],
        ),
    ]);
}

#[tokio::test]
async fn ready_endpoints_with_the_named_port() {
    let k = FakeKube::start(TOKEN);
    cluster(&k);
    let mut cfg = config(&k);
    cfg["port_name"] = json!("http");
    let t = resolve(cfg.clone(), "web").await.unwrap();
    assert_eq!(
        addrs(&t),
        vec!["10.1.0.1:8080", "10.1.0.3:8080", "10.1.0.4:8080"]
    );
    assert_eq!(t[0]["tags"], json!(["zone-a", "web-1"]));
    cfg["port_name"] = json!("metrics");
    let t = resolve(cfg.clone(), "default/web").await.unwrap();
    assert_eq!(addrs(&t).len(), 3);
    assert!(t.iter().all(|v| v["port"] == 9090));
    // The token went in the header, never in the URL.
    for s in k.seen() {
        assert_eq!(
            s.authorization.as_deref(),
            Some(&*format!("Bearer {TOKEN}"))
        );
        assert!(!s.raw_query.contains(TOKEN) && !s.path.contains(TOKEN));
    }
}

#[tokio::test]
async fn namespaces_selectors_single_port_and_empty_services() {
    let k = FakeKube::start(TOKEN);
    cluster(&k);
    // One (unnamed) port: no port_name needed.
    let t = resolve(config(&k), "shop/api").await.unwrap();
    assert_eq!(addrs(&t), vec!["fd00::1:443"]);
    let mut cfg = config(&k);
    cfg["namespace"] = json!("shop");
    assert_eq!(resolve(cfg, "api").await.unwrap().len(), 1);
    // A label selector over the services' labels.
    let mut cfg = config(&k);
    cfg["port_name"] = json!("http");
    let t = resolve(cfg.clone(), "app=web,tier=front").await.unwrap();
    assert_eq!(t.len(), 3);
    let e = resolve(cfg.clone(), "app=nothing").await.unwrap_err();
    assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("service")), "{e:?}");
    // A service that exists but has no endpoint: an empty list.
    assert_eq!(
        resolve(config(&k), "db").await.unwrap(),
        Vec::<Value>::new()
    );
    // Several ports and no port_name; an unknown port name.
    let e = resolve(config(&k), "web").await.unwrap_err();
    assert_eq!(
        (e.code, e.field()),
        (ERR_CONFIG, Some("port_name")),
        "{e:?}"
    );
    assert!(e.message.contains("http, metrics"), "{e:?}");
    let mut cfg = config(&k);
    cfg["port_name"] = json!("grpc");
    let e = resolve(cfg, "web").await.unwrap_err();
    assert_eq!(
        (e.code, e.field()),
        (ERR_CONFIG, Some("port_name")),
        "{e:?}"
    );
}

#[tokio::test]
async fn readiness_flips_are_followed() {
    let k = FakeKube::start(TOKEN);
    cluster(&k);
    let mut cfg = config(&k);
    cfg["port_name"] = json!("http");
    assert_eq!(resolve(cfg.clone(), "web").await.unwrap().len(), 3);
    k.set_slices(vec![slice(
        "default",
        "web",
        "web-abc",
        &[("app", "web")],
        "IPv4",
        &[("http", 8080)],
        vec![
            endpoint("10.1.0.1", Some(false), "zone-a", "web-1"),
            endpoint("10.1.0.2", Some(true), "zone-b", "web-2"),
        ],
    )]);
    assert_eq!(
        addrs(&resolve(cfg, "web").await.unwrap()),
        vec!["10.1.0.2:8080"]
    );
}

#[tokio::test]
async fn hundreds_of_endpoints_over_several_pages() {
    let k = FakeKube::start(TOKEN);
    let slices: Vec<Value> = (0..5)
        .map(|s| {
            let eps = (0..40)
                .map(|i| endpoint(&format!("10.2.{s}.{i}"), Some(true), "z", "p"))
                .collect();
            slice(
                "default",
                "big",
                &format!("big-{s}"),
                &[],
                "IPv4",
                &[("http", 80)],
                eps,
            )
        })
        .collect();
    k.set_slices(slices);
    k.set_page_size(Some(2));
    let t = resolve(config(&k), "big").await.unwrap();
    assert_eq!(t.len(), 200);
    let pages = k.seen().len();
    assert_eq!(pages, 3, "5 slices at 2 per page");
    assert!(k.seen()[1].raw_query.contains("continue="));
}

#[tokio::test]
async fn credentials_and_certificates_are_config_errors() {
    let k = FakeKube::start(TOKEN);
    cluster(&k);
    let check = |e: RpcError, field: &str| {
        assert_eq!((e.code, e.field()), (ERR_CONFIG, Some(field)), "{e:?}");
        assert!(!e.message.contains(TOKEN), "{e:?}");
    };
    let mut cfg = config(&k);
    cfg["token"] = json!("not-the-token-1234");
    check(resolve(cfg, "shop/api").await.unwrap_err(), "token");
    let mut cfg = config(&k);
    cfg.as_object_mut().unwrap().remove("token");
    check(resolve(cfg, "shop/api").await.unwrap_err(), "token");
    let mut cfg = config(&k);
    cfg["token"] = json!(k.forbidden_token());
    check(resolve(cfg, "shop/api").await.unwrap_err(), "token");
    // A CA that did not sign the server's certificate; no CA (public roots); garbage PEM.
    let other = TestCa::generate("some other CA");
    let mut cfg = config(&k);
    cfg["ca_cert"] = json!(other.ca_pem);
    check(resolve(cfg, "shop/api").await.unwrap_err(), "ca_cert");
    let mut cfg = config(&k);
    cfg.as_object_mut().unwrap().remove("ca_cert");
    check(resolve(cfg, "shop/api").await.unwrap_err(), "ca_cert");
    let mut cfg = config(&k);
    cfg["ca_cert"] = json!("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
    check(resolve(cfg, "shop/api").await.unwrap_err(), "ca_cert");
    // Unknown service, bad service, bad namespace, plain-HTTP API server.
    check(resolve(config(&k), "nosuch").await.unwrap_err(), "service");
    check(
        resolve(config(&k), "Bad_Name").await.unwrap_err(),
        "service",
    );
    let mut cfg = config(&k);
    cfg["namespace"] = json!("Not Valid");
    check(resolve(cfg, "web").await.unwrap_err(), "namespace");
    let mut cfg = config(&k);
    cfg["api_server"] = json!(k.api_server().replace("https", "http"));
    check(resolve(cfg, "web").await.unwrap_err(), "api_server");
}

#[tokio::test]
async fn api_server_down_or_slow_is_a_provider_error() {
    let k = FakeKube::start(TOKEN);
    cluster(&k);
    k.stop();
    let e = resolve(config(&k), "shop/api").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    k.resume();
    assert_eq!(resolve(config(&k), "shop/api").await.unwrap().len(), 1);
    k.set_delay(Some(Duration::from_secs(5)));
    let e = resolve(config(&k), "shop/api").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    assert!(e.message.contains("did not answer"), "{e:?}");
}

/// The built plugin under the real host, with a conformance sample that points at `k`.
fn hosted(k: &FakeKube) -> HostedPlugin {
    let sample = json!({"provider": "kubernetes", "config": config(k), "service": "shop/api",
                        "unknown_service": "no-such-service"});
    HostedPlugin::load(PLUGIN.source_dir(), PLUGIN.bin(), Some(&sample))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker_and_never_shows_the_token() {
    let k = FakeKube::start(TOKEN);
    cluster(&k);
    let h = hosted(&k);
    let report = check_plugin(h.folder()).await;
    // The same through the CLI: `tributary plugin check DIR`.
    let (ok, text) = plugin_check_cli(&tributary_bin(PLUGIN.bin()), h.folder());
    assert!(ok, "{text}");
    assert!(text.contains("PASS") && !text.contains("FAIL"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    assert_conforms(&report, &[]);
    let mut captured = report.to_string();

    let host = &h.host;
    let ok = host
        .resolve("kubernetes", params(config(&k), "shop/api"))
        .await
        .unwrap();
    captured.push_str(&serde_json::to_string(&ok).unwrap());
    let other = TestCa::generate("other");
    let mut bad_ca = config(&k);
    bad_ca["ca_cert"] = json!(other.ca_pem);
    let mut wrong = config(&k);
    wrong["token"] = json!(format!("{TOKEN}x"));
    let mut down = config(&k);
    down["api_server"] = json!("https://127.0.0.1:1");
    for (cfg, service) in [
        (config(&k), "nosuch"),
        (bad_ca, "web"),
        (wrong, "web"),
        (down, "web"),
        (config(&k), "web"),
    ] {
        let e = host
            .resolve("kubernetes", params(cfg, service))
            .await
            .unwrap_err();
        captured.push_str(&format!("{e} {e:?}\n"));
    }
    captured.push_str(&host.stderr_tail("kubernetes").join("\n"));
    host.shutdown().await;
    assert!(!captured.contains(TOKEN), "token leaked: {captured}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_passes_the_checker_through_its_launcher() {
    let report = check_plugin(PLUGIN.source_dir()).await;
    assert!(report.passed(), "{report}");
}
