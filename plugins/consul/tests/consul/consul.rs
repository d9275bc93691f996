//! The `consul` plugin against the fake Consul agent (`tributary-fakes`, written from Consul's API
//! docs): in-process through the SDK's `call`, and as the built binary through the real plugin host
//! and the conformance checker.

use std::time::Duration;

use serde_json::{json, Value};
use tributary_fakes::consul::{FakeConsul, Health, Instance};
use tributary_fakes::daemon::{plugin_check_cli, tributary_bin};
use tributary_fakes::host::{assert_conforms, HostedPlugin};
use tributary_plugin_consul::Consul;
use tributary_plugin_host::check::check_plugin;
use tributary_protocol::{ResolveParams, ERR_CONFIG, ERR_PROVIDER};

use crate::PLUGIN;

const TOKEN: &str = "acl-tok-7f3a9c2e51d84b06a1e0";

fn params(config: Value, service: &str) -> ResolveParams {
    tributary_fakes::host::params("registry", config, service)
}

fn plugin() -> Consul {
    Consul::new(Duration::from_secs(2))
}

async fn resolve(config: Value, service: &str) -> Result<Vec<Value>, tributary_protocol::RpcError> {
    tributary_plugin_sdk::call(&plugin(), params(config, service))
        .await
        .map(|r| {
            assert_eq!(r.ttl_seconds, 0);
            let mut t = r.targets;
            t.sort_by_key(|v| v["port"].as_u64());
            t
        })
}

fn web(fake: &FakeConsul) {
    fake.register(
        Instance::new("web-1", "web", "10.0.0.1", 8001)
            .tags(&["v1", "zone-a"])
            .weights(10, 2),
    );
    fake.register(
        Instance::new("web-2", "web", "", 8002)
            .tags(&["v2"])
            .weights(3, 1),
    );
    fake.register(
        Instance::new("web-3", "web", "10.0.0.3", 8003)
            .tags(&["v1"])
            .weights(7, 4)
            .health(Health::Warning),
    );
    fake.register(Instance::new("web-4", "web", "10.0.0.4", 8004).health(Health::Critical));
    fake.register(Instance::new("db-1", "db", "10.0.1.1", 5432));
}

#[tokio::test]
async fn healthy_instances_with_weights_tags_and_node_address_fallback() {
    let fake = FakeConsul::start();
    web(&fake);
    let t = resolve(json!({"address": fake.address()}), "web")
        .await
        .unwrap();
    assert_eq!(
        t,
        vec![
            json!({"address":"10.0.0.1","port":8001,"weight":10,"tags":["v1","zone-a"]}),
            json!({"address":"127.0.0.1","port":8002,"weight":3,"tags":["v2"]}),
        ]
    );
    // healthy_only false: every instance; a non-passing one gets Weights.Warning.
    let t = resolve(
        json!({"address": fake.address(), "healthy_only": false}),
        "web",
    )
    .await
    .unwrap();
    let weights: Vec<(u64, u64)> = t
        .iter()
        .map(|v| (v["port"].as_u64().unwrap(), v["weight"].as_u64().unwrap()))
        .collect();
    assert_eq!(weights, vec![(8001, 10), (8002, 3), (8003, 4), (8004, 1)]);
    // The query asked Consul for passing instances only when healthy_only.
    let seen = fake.seen();
    assert!(
        seen[0].raw_query.split('&').any(|p| p == "passing"),
        "{seen:?}"
    );
    assert!(!seen.last().unwrap().raw_query.contains("passing"));
}

#[tokio::test]
async fn health_flips_and_deregistration_follow() {
    let fake = FakeConsul::start();
    web(&fake);
    let cfg = json!({"address": fake.address()});
    fake.set_health("web-1", Health::Critical);
    let t = resolve(cfg.clone(), "web").await.unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0]["port"], 8002);
    fake.set_health("web-3", Health::Passing);
    fake.deregister("web-2");
    let t = resolve(cfg.clone(), "web").await.unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0]["port"], 8003);
    assert_eq!(t[0]["weight"], 7);
    // Known service, nothing healthy now: an empty list, not an error.
    fake.set_health("web-3", Health::Critical);
    assert_eq!(resolve(cfg, "web").await.unwrap(), Vec::<Value>::new());
}

#[tokio::test]
async fn tags_and_datacenters() {
    let fake = FakeConsul::start();
    web(&fake);
    fake.register(
        Instance::new("web-dc2", "web", "10.2.0.1", 9001)
            .tags(&["v1"])
            .datacenter("dc2"),
    );
    let cfg = json!({"address": fake.address()});
    let t = resolve(cfg.clone(), "v1.web").await.unwrap();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0]["port"], 8001);
    assert!(fake.seen()[0].raw_query.contains("tag=v1"));
    let t = resolve(
        json!({"address": fake.address(), "datacenter": "dc2"}),
        "v1.web",
    )
    .await
    .unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0]["port"], 9001);
    // A tag no instance carries: the service is unknown in those terms.
    let e = resolve(cfg.clone(), "v9.web").await.unwrap_err();
    assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("service")), "{e:?}");
    let e = resolve(
        json!({"address": fake.address(), "datacenter": "dc9"}),
        "web",
    )
    .await
    .unwrap_err();
    assert_eq!(
        (e.code, e.field()),
        (ERR_CONFIG, Some("datacenter")),
        "{e:?}"
    );
}

#[tokio::test]
async fn unknown_service_and_bad_config_are_config_errors() {
    let fake = FakeConsul::start();
    web(&fake);
    let e = resolve(json!({"address": fake.address()}), "nosuch")
        .await
        .unwrap_err();
    assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("service")), "{e:?}");
    for (config, service, field) in [
        (json!({}), "web", "address"),
        (json!({"address": "ftp://127.0.0.1"}), "web", "address"),
        (
            json!({"address": fake.address(), "healthy_only": "yes"}),
            "web",
            "healthy_only",
        ),
        (
            json!({"address": fake.address(), "datacenter": "dc 1"}),
            "web",
            "datacenter",
        ),
        (json!({"address": fake.address()}), "a/b", "service"),
    ] {
        let e = resolve(config.clone(), service).await.unwrap_err();
        assert_eq!(
            (e.code, e.field()),
            (ERR_CONFIG, Some(field)),
            "{config}: {e:?}"
        );
    }
}

#[tokio::test]
async fn acl_token_goes_in_the_header_only_and_rejections_name_token() {
    let fake = FakeConsul::start();
    web(&fake);
    fake.require_token(TOKEN);
    let t = resolve(json!({"address": fake.address(), "token": TOKEN}), "web")
        .await
        .unwrap();
    assert_eq!(t.len(), 2);
    let e = resolve(
        json!({"address": fake.address(), "token": "wrong-token-123456"}),
        "web",
    )
    .await
    .unwrap_err();
    assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("token")), "{e:?}");
    assert!(!e.message.contains("wrong-token"), "{e:?}");
    // Anonymous: Consul filters the results away; that is not "no servers".
    let e = resolve(json!({"address": fake.address()}), "web")
        .await
        .unwrap_err();
    assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("token")), "{e:?}");
    for s in fake.seen() {
        assert!(
            !s.path.contains(TOKEN) && !s.raw_query.contains(TOKEN),
            "{s:?}"
        );
    }
    assert!(fake.seen().iter().any(|s| s.token.as_deref() == Some(TOKEN)
        && s.header_names.iter().any(|h| h == "x-consul-token")));
}

#[tokio::test]
async fn registry_down_or_slow_is_a_provider_error_never_an_empty_list() {
    let fake = FakeConsul::start();
    web(&fake);
    let cfg = json!({"address": fake.address()});
    fake.stop();
    let e = resolve(cfg.clone(), "web").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    assert!(e.message.contains("cannot connect"), "{e:?}");
    assert!(!e.message.contains(&fake.port().to_string()), "{e:?}");
    fake.resume();
    assert_eq!(resolve(cfg.clone(), "web").await.unwrap().len(), 2);
    fake.set_delay(Some(Duration::from_secs(5)));
    let e = resolve(cfg.clone(), "web").await.unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    assert!(e.message.contains("did not answer"), "{e:?}");
}

/// The built plugin under the real host, with a conformance sample that points at `fake`.
fn hosted(fake: &FakeConsul, token: Option<&str>) -> HostedPlugin {
    let mut config = json!({"address": fake.address()});
    if let Some(t) = token {
        config["token"] = json!(t);
    }
    let sample = json!({"provider": "registry", "config": config, "service": "web",
                        "unknown_service": "no-such-service"});
    HostedPlugin::load(PLUGIN.source_dir(), PLUGIN.bin(), Some(&sample))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker_with_a_sample() {
    let fake = FakeConsul::start();
    web(&fake);
    fake.require_token(TOKEN);
    let h = hosted(&fake, Some(TOKEN));
    let report = check_plugin(h.folder()).await;
    // The same through the CLI: `tributary plugin check DIR`.
    let (ok, text) = plugin_check_cli(&tributary_bin(PLUGIN.bin()), h.folder());
    assert!(ok, "{text}");
    assert!(text.contains("PASS") && !text.contains("FAIL"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    assert_conforms(&report, &[]);
    assert!(!report.to_string().contains(TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_token_appears_in_no_captured_output() {
    let fake = FakeConsul::start();
    web(&fake);
    fake.require_token(TOKEN);
    let h = hosted(&fake, Some(TOKEN));
    let host = &h.host;
    let mut captured = String::new();
    let ok = host
        .resolve(
            "consul",
            params(json!({"address": fake.address(), "token": TOKEN}), "web"),
        )
        .await
        .unwrap();
    assert_eq!(ok.targets.len(), 2);
    captured.push_str(&serde_json::to_string(&ok).unwrap());
    // Every failure path with the token set.
    let wrong = format!("{TOKEN}-but-wrong");
    for (config, service) in [
        (json!({"address": fake.address(), "token": wrong}), "web"),
        (json!({"address": fake.address(), "token": TOKEN}), "nosuch"),
        (
            json!({"address": fake.address(), "token": TOKEN, "datacenter": "dc9"}),
            "web",
        ),
        (
            json!({"address": "http://127.0.0.1:1", "token": TOKEN}),
            "web",
        ),
    ] {
        let e = host
            .resolve("consul", params(config, service))
            .await
            .unwrap_err();
        captured.push_str(&format!("{e} {e:?}\n"));
    }
    captured.push_str(&host.stderr_tail("consul").join("\n"));
    host.shutdown().await;
    assert!(!captured.contains(TOKEN), "token leaked: {captured}");
    for s in fake.seen() {
        assert!(
            !s.path.contains(TOKEN) && !s.raw_query.contains(TOKEN),
            "{s:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_passes_the_checker_through_its_launcher() {
    // plugins/consul/plugin.json names run.sh, which starts the binary in the target directory.
    // Without a reachable registry there is no sample: those checks are skipped, the rest pass.
    let report = check_plugin(PLUGIN.source_dir()).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test]
async fn https_agent_with_a_private_ca_from_consul_cacert() {
    let fake = FakeConsul::start_tls();
    web(&fake);
    let ca = fake.ca_pem().unwrap().to_string();
    let cfg = json!({"address": fake.address()});
    assert!(fake.address().starts_with("https://"));
    let p = Consul::with_ca(Duration::from_secs(2), Some(&ca));
    let r = tributary_plugin_sdk::call(&p, params(cfg.clone(), "web"))
        .await
        .unwrap();
    assert_eq!(r.targets.len(), 2);
    // Without the CA the certificate is not trusted: a cause in `address`.
    let e = resolve(cfg.clone(), "web").await.unwrap_err();
    assert_eq!((e.code, e.field()), (ERR_CONFIG, Some("address")), "{e:?}");
    // A CONSUL_CACERT without a certificate: every call fails with -32000, saying why.
    let p = Consul::with_ca(Duration::from_secs(2), Some("not a certificate"));
    let e = tributary_plugin_sdk::call(&p, params(cfg, "web"))
        .await
        .unwrap_err();
    assert_eq!(e.code, ERR_PROVIDER, "{e:?}");
    assert!(e.message.contains("CONSUL_CACERT"), "{e:?}");
}

#[test]
fn the_binary_reads_consul_cacert() {
    // The built binary, with CONSUL_CACERT naming the fake's CA file, resolves over HTTPS.
    use std::io::{Read, Write};
    /// Kills and reaps the plugin process when dropped, also when the test panics.
    struct Plugin(std::process::Child);
    impl Drop for Plugin {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let fake = FakeConsul::start_tls();
    web(&fake);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, fake.ca_pem().unwrap()).unwrap();
    let mut plugin = Plugin(
        std::process::Command::new(PLUGIN.bin())
            .env("CONSUL_CACERT", &ca)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "discovery.resolve",
                     "params": {"provider": "registry", "config": {"address": fake.address()},
                                "service": "web"}});
    let mut stdin = plugin.0.stdin.take().unwrap();
    writeln!(stdin, "{req}").unwrap();
    drop(stdin);
    // The plugin answers, then exits at the end of its input, closing stdout.
    let mut out = Vec::new();
    let mut stdout = plugin.0.stdout.take().unwrap();
    stdout.read_to_end(&mut out).unwrap();
    let status = plugin.0.wait().unwrap();
    assert!(status.success(), "the plugin exited with {status}");
    let answer: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        answer["result"]["targets"].as_array().unwrap().len(),
        2,
        "{answer}"
    );
}
