//! The built `tributary-plugin-dns` binary against a real dnsmasq: through the real plugin host, the
//! conformance checker, and end to end through `tributary serve` and a real nginx.

use std::net::UdpSocket;
use std::time::Duration;

use serde_json::{json, Value};
use tributary_fakes::daemon::{assert_cli_check_passes, assert_ok, plugins_dir, tributary_bin};
use tributary_fakes::daemon::{plugin_folder, Daemon};
use tributary_fakes::dnsmasq::Dnsmasq;
use tributary_fakes::host::{assert_conforms, checked_in, params, HostedPlugin};
use tributary_fakes::wait::{poll, wait_backends};
use tributary_plugin_host::check::check_plugin;
use tributary_protocol::{ResolveResult, ERR_CONFIG, ERR_PROVIDER};
use tributary_testkit::{this_plugin, Nginx, PluginPackage};

const PLUGIN: PluginPackage = this_plugin!("tributary-plugin-dns");

/// The built plugin under the real host.
fn hosted() -> HostedPlugin {
    HostedPlugin::load(PLUGIN.source_dir(), PLUGIN.bin(), None)
}

/// Targets as sorted `(address, port, weight)`.
fn triples(r: &ResolveResult) -> Vec<(String, u64, u64)> {
    let mut v: Vec<_> = r
        .targets
        .iter()
        .map(|t| {
            (
                t["address"].as_str().unwrap().to_string(),
                t["port"].as_u64().unwrap(),
                t["weight"].as_u64().unwrap_or(1),
            )
        })
        .collect();
    v.sort();
    v
}

fn s(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_uses_the_lowest_priority_group_resolves_targets_and_takes_the_smallest_ttl() {
    let dns = Dnsmasq::start(
        42,
        &s(&[
            "--srv-host=_http._tcp.api.test,h1.test,8080,10,5",
            "--srv-host=_http._tcp.api.test,h2.test,8081,10,10",
            "--srv-host=_http._tcp.api.test,h0.test,8083,10,0",
            "--srv-host=_http._tcp.api.test,h3.test,8082,20,100",
            "--host-record=h1.test,127.0.0.1",
            "--host-record=h2.test,127.0.0.2,::2,7",
            "--host-record=h0.test,127.0.0.10",
            "--host-record=h3.test,127.0.0.3",
            // weights over 1000 are scaled, keeping their ratio
            "--srv-host=_big._tcp.api.test,h1.test,9000,1,65535",
            "--srv-host=_big._tcp.api.test,h3.test,9001,1,3000",
            // a known name without SRV records: no servers right now
            "--host-record=plain.test,127.0.0.9",
        ]),
    );
    let h = hosted();
    let cfg = json!({ "nameserver": dns.nameserver() });
    let r = h.resolve(cfg.clone(), "_http._tcp.api.test").await.unwrap();
    assert_eq!(
        triples(&r),
        vec![
            ("127.0.0.1".into(), 8080, 5),
            ("127.0.0.10".into(), 8083, 1),
            ("127.0.0.2".into(), 8081, 10),
            ("::2".into(), 8081, 10),
        ],
        "{:?}",
        r.targets
    );
    assert_eq!(r.ttl_seconds, 7, "smallest TTL of the records used");
    let tags: Vec<&Value> = r.targets.iter().map(|t| &t["tags"]).collect();
    assert!(tags.contains(&&json!(["h2.test"])), "{tags:?}");

    let r = h.resolve(cfg.clone(), "_big._tcp.api.test.").await.unwrap();
    assert_eq!(
        triples(&r),
        vec![
            ("127.0.0.1".into(), 9000, 1000),
            ("127.0.0.3".into(), 9001, 46)
        ]
    );
    assert_eq!(r.ttl_seconds, 42);

    let r = h.resolve(cfg.clone(), "plain.test").await.unwrap();
    assert!(r.targets.is_empty(), "{:?}", r.targets);

    // record_type defaults to SRV; "SRV" explicitly is the same.
    let mut explicit = cfg.clone();
    explicit["record_type"] = json!("srv");
    let r = h.resolve(explicit, "_http._tcp.api.test").await.unwrap();
    assert_eq!(r.targets.len(), 4);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_aaaa_with_the_configured_port() {
    let dns = Dnsmasq::start(
        30,
        &s(&[
            "--host-record=web.test,127.0.0.5,::5",
            "--host-record=web.test,127.0.0.6,12",
            "--cname=alias.test,web.test",
        ]),
    );
    let h = hosted();
    let ns = dns.nameserver();
    let cases = [
        ("A", vec![("127.0.0.5", 12u64), ("127.0.0.6", 12)]),
        ("AAAA", vec![("::5", 30)]),
        (
            "A+AAAA",
            vec![("127.0.0.5", 12), ("127.0.0.6", 12), ("::5", 12)],
        ),
    ];
    for (rt, want) in cases {
        for name in ["web.test", "alias.test"] {
            let r = h
                .resolve(
                    json!({"nameserver": ns, "record_type": rt, "port": 8443}),
                    name,
                )
                .await
                .unwrap_or_else(|e| panic!("{rt} {name}: {e}"));
            let want_triples: Vec<(String, u64, u64)> =
                want.iter().map(|(a, _)| (a.to_string(), 8443, 1)).collect();
            assert_eq!(triples(&r), want_triples, "{rt} {name}");
            assert!(r.targets.iter().all(|t| t.get("weight").is_none()));
            assert_eq!(r.ttl_seconds, want[0].1, "{rt} {name}");
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_instances_come_back_whole() {
    // 100 SRV records do not fit in a UDP answer: the plugin must retry over TCP.
    let mut records = Vec::new();
    for i in 0..100 {
        records.push(format!(
            "--srv-host=_http._tcp.big.test,node{i}.test,{},10,{}",
            10000 + i,
            i % 7
        ));
        records.push(format!("--host-record=node{i}.test,127.0.1.{}", i + 1));
    }
    let dns = Dnsmasq::start(60, &records);
    let h = hosted();
    let r = h
        .resolve(
            json!({ "nameserver": dns.nameserver() }),
            "_http._tcp.big.test",
        )
        .await
        .unwrap();
    let t = triples(&r);
    assert_eq!(t.len(), 100, "{t:?}");
    for i in 0..100u64 {
        assert!(
            t.contains(&(format!("127.0.1.{}", i + 1), 10000 + i, (i % 7).max(1))),
            "node{i} missing: {t:?}"
        );
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_field_or_are_provider_errors_and_never_quote_config() {
    let dns = Dnsmasq::start(10, &s(&["--host-record=web.test,127.0.0.5"]));
    let h = hosted();
    let ns = dns.nameserver();
    // Unknown name: -32003 service.
    let e = h
        .resolve(
            json!({"nameserver": ns, "record_type": "A", "port": 80}),
            "nope.test",
        )
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.field()),
        (Some(ERR_CONFIG), Some("service")),
        "{e}"
    );
    let e = h
        .resolve(json!({"nameserver": ns}), "_http._tcp.nope.test")
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.field()),
        (Some(ERR_CONFIG), Some("service")),
        "{e}"
    );
    // Config errors.
    for (config, field) in [
        (json!({"nameserver": ns, "record_type": "A"}), "port"),
        (
            json!({"nameserver": ns, "record_type": "TXT"}),
            "record_type",
        ),
        (json!({"nameserver": "127.0.0.1:70000"}), "nameserver"),
        (
            json!({"nameserver": ns, "record_type": "A", "port": "80"}),
            "port",
        ),
    ] {
        let e = h.resolve(config.clone(), "web.test").await.unwrap_err();
        assert_eq!(
            (e.code(), e.field()),
            (Some(ERR_CONFIG), Some(field)),
            "{config}: {e}"
        );
    }
    // Nameserver down (nothing listens): -32000.
    let down_port = tributary_testkit::free_port();
    let down = format!("127.0.0.1:{down_port}");
    let e = h
        .resolve(
            json!({"nameserver": down, "record_type": "A", "port": 80}),
            "web.test",
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ERR_PROVIDER), "{e}");
    assert!(!e.to_string().contains(&down_port.to_string()), "{e}");
    // Nameserver that never answers: -32000 after the tries, well within the host's 30 s.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent_ns = silent.local_addr().unwrap().to_string();
    let e = h
        .resolve(
            json!({"nameserver": silent_ns, "record_type": "A", "port": 80}),
            "web.test",
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ERR_PROVIDER), "{e}");
    assert!(e.to_string().contains("did not answer"), "{e}");
    assert!(!e.to_string().contains(&silent_ns), "{e}");
    let stderr = h.stderr();
    for secret in [&ns, &down, &silent_ns] {
        assert!(!stderr.contains(secret.as_str()), "{stderr}");
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker() {
    let dns = Dnsmasq::start(
        10,
        &s(&[
            "--srv-host=_http._tcp.demo.test,h1.test,8080,1,1",
            "--host-record=h1.test,127.0.0.1",
        ]),
    );
    let tmp = tempfile::tempdir().unwrap();
    let sample = json!({
        "provider": "dns",
        "config": {"nameserver": dns.nameserver()},
        "service": "_http._tcp.demo.test",
        "unknown_service": "_http._tcp.unknown.test"
    });
    let dir = plugin_folder(tmp.path(), PLUGIN.source_dir(), PLUGIN.bin(), Some(&sample));
    let report = check_plugin(&dir).await;
    // The provider has no required field (all have defaults), so only that check is skipped.
    assert_conforms(&report, &["no provider declares a required field"]);
    // The same through the `tributary plugin check` command.
    assert_cli_check_passes(&tributary_bin(PLUGIN.bin()), &dir, true);
}

#[test]
fn end_to_end_nginx_follows_dns_on_its_ttl_and_keeps_servers_when_dns_is_down() {
    let nginx = Nginx::builder()
        .backend("alpha")
        .backend("beta")
        .backend("gamma")
        .start();
    let port = |n: &str| nginx.backend_port(n);
    // Each backend is its own SRV target on 127.0.0.1 with its nginx port.
    let records = |names: &[&str]| -> Vec<String> {
        let mut r = Vec::new();
        for n in names {
            r.push(format!(
                "--srv-host=_http._tcp.api.test,{n}.test,{},10,1",
                port(n)
            ));
            r.push(format!("--host-record={n}.test,127.0.0.1"));
        }
        r
    };
    // TTL 10 s (the engine's minimum): the binding refreshes on the TTL, not its 60 s interval.
    let mut dns = Dnsmasq::start(10, &records(&["alpha", "beta"]));
    let tmp = tempfile::tempdir().unwrap();
    let plugins = plugins_dir(tmp.path(), PLUGIN.source_dir(), PLUGIN.bin());
    let daemon = Daemon::start(&tributary_bin(PLUGIN.bin()), tmp.path(), &plugins, &nginx);
    let ns_cfg = format!("nameserver={}", dns.nameserver());
    let out = daemon.binding_add(
        "api",
        "dns",
        "dns",
        "_http._tcp.api.test",
        &[&ns_cfg, "record_type=SRV"],
        &[],
    );
    assert_ok(&out, "binding add");
    wait_backends(&nginx, "api", &["alpha", "beta"]);
    let b = daemon.show("api");
    assert_eq!(b["last_outcome"]["ttl_seconds"], 10, "{b}");
    let at = b["last_outcome"]["at_ms"].as_u64().unwrap();
    let next = b["next_refresh_ms"].as_u64().unwrap();
    assert!(
        next >= at + 9_000 && next <= at + 30_000,
        "next refresh follows the 10 s TTL (counted from the end of the apply), not the 60 s interval: {b}"
    );

    // Change the registry (alpha out, gamma in): nginx follows on the next TTL-driven refresh,
    // without a manual refresh.
    let dns_port = dns.port;
    dns.stop();
    let mut dns = Dnsmasq::start_on(dns_port, 10, &records(&["beta", "gamma"]));
    wait_backends(&nginx, "api", &["beta", "gamma"]);
    let conf = nginx.upstreams_dir().join("api.conf");
    let good = std::fs::read_to_string(&conf).unwrap();
    assert!(
        good.contains(&format!("127.0.0.1:{} ", port("gamma"))),
        "{good}"
    );

    // DNS down: the refresh fails with -32000, nginx keeps its servers, the binding shows it.
    dns.stop();
    let out = daemon.cli(&["binding", "refresh", "api"]);
    assert!(!out.status.success(), "refresh with DNS down must fail");
    let b = poll("binding shows the failure", || {
        let b = daemon.show("api");
        if b["last_outcome"]["status"] == "failed" {
            Ok(b)
        } else {
            Err(b.to_string())
        }
    });
    assert_eq!(b["last_outcome"]["code"], ERR_PROVIDER, "{b}");
    assert_eq!(b["servers"].as_array().unwrap().len(), 2, "{b}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), good);
    std::thread::sleep(Duration::from_millis(200));
    wait_backends(&nginx, "api", &["beta", "gamma"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_works_through_its_launcher() {
    // plugins/dns/plugin.json names run.sh, which starts the binary cargo built into the target dir.
    let dns = Dnsmasq::start(10, &s(&["--host-record=web.test,127.0.0.5"]));
    let host = checked_in(PLUGIN.source_dir());
    let r = host
        .resolve(
            "dns",
            params(
                "dns",
                json!({"nameserver": dns.nameserver(), "record_type": "A", "port": 80}),
                "web.test",
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}; stderr: {:?}", host.stderr_tail("dns")));
    assert_eq!(r.targets, vec![json!({"address":"127.0.0.5","port":80})]);
    host.shutdown().await;
    // Without a conformance.json only the checks needing a live nameserver are skipped.
    let report = check_plugin(PLUGIN.source_dir()).await;
    assert!(report.passed(), "{report}");
}
