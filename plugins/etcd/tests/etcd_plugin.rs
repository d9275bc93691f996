//! The built `tributary-plugin-etcd` binary against a real etcd: through the real plugin host (with
//! and without authentication, over HTTPS with a test CA), the conformance checker, and end to end
//! through `tributary serve` and a real nginx.

use serde_json::{json, Value};
use tributary_fakes::daemon::{assert_cli_check_passes, assert_ok, plugins_dir, tributary_bin};
use tributary_fakes::daemon::{plugin_folder, Daemon};
use tributary_fakes::etcd::Etcd;
use tributary_fakes::host::{assert_conforms, checked_in, params, HostedPlugin};
use tributary_fakes::tls::TestCa;
use tributary_fakes::wait::{poll, wait_backends};
use tributary_plugin_host::check::check_plugin;
use tributary_protocol::{ResolveResult, ERR_CONFIG, ERR_PROVIDER};
use tributary_testkit::{this_plugin, Nginx, PluginPackage};

const PLUGIN: PluginPackage = this_plugin!("tributary-plugin-etcd");

/// The built plugin under the real host.
fn hosted() -> HostedPlugin {
    HostedPlugin::load(PLUGIN.source_dir(), PLUGIN.bin(), None)
}

fn sorted(r: &ResolveResult) -> Vec<Value> {
    let mut v = r.targets.clone();
    v.sort_by_key(|t| t.to_string());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolves_keys_under_the_prefix() {
    let e = Etcd::start();
    e.put(
        "/services/api/1",
        r#"{"address":"10.0.0.1","port":8080,"weight":3,"tags":["zone-a"]}"#,
    );
    e.put(
        "/services/api/2",
        r#"{"Op":0,"Addr":"10.0.0.2:8080","Metadata":null}"#,
    );
    e.put("/services/api/3", "[2001:db8::3]:8443");
    e.put("/services/api-canary/1", "10.9.9.9:1"); // a sibling, not part of "api"
    e.put("/services/apix", "10.9.9.9:2");
    e.put(
        "/services/web",
        r#"["10.1.0.1:80", {"address":"10.1.0.2","port":80}]"#,
    );
    e.put("/services/idle", "");
    e.put("/services/broken/1", "not a target");
    e.put("/services/half/1", "10.2.0.1:80");
    e.put("/services/half/2", "{oops");
    e.put("/reg/v2/api/1", "10.3.0.1:80");
    let h = hosted();
    let cfg = json!({ "endpoints": e.endpoint() });

    let r = h.resolve(cfg.clone(), "api").await.unwrap();
    assert_eq!(
        sorted(&r),
        vec![
            json!({"address":"10.0.0.1","port":8080,"weight":3,"tags":["zone-a"]}),
            json!({"address":"10.0.0.2","port":8080}),
            json!({"address":"2001:db8::3","port":8443}),
        ]
    );
    assert_eq!(r.ttl_seconds, 0);
    let r = h.resolve(cfg.clone(), "web").await.unwrap();
    assert_eq!(r.targets.len(), 2);
    assert!(h
        .resolve(cfg.clone(), "idle")
        .await
        .unwrap()
        .targets
        .is_empty());
    let r = h.resolve(cfg.clone(), "half").await.unwrap();
    assert_eq!(r.targets, vec![json!({"address":"10.2.0.1","port":80})]);
    // The skipped value is noted on stderr (read by the host asynchronously: wait for it).
    for _ in 0..100 {
        if h.stderr().contains("instance \\\"2\\\"") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(h.stderr().contains("instance \\\"2\\\""), "{}", h.stderr());

    let err = h.resolve(cfg.clone(), "broken").await.unwrap_err();
    assert_eq!(err.code(), Some(ERR_PROVIDER), "{err}");
    let err = h.resolve(cfg.clone(), "nope").await.unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        (Some(ERR_CONFIG), Some("service")),
        "{err}"
    );

    // Another prefix (a final / is added).
    let r = h
        .resolve(
            json!({"endpoints": e.endpoint(), "prefix": "/reg/v2"}),
            "api",
        )
        .await
        .unwrap();
    assert_eq!(r.targets, vec![json!({"address":"10.3.0.1","port":80})]);

    // A change in etcd shows in the next resolution.
    e.delete("/services/api/1");
    e.put("/services/api/4", "10.0.0.4:8080");
    let r = h.resolve(cfg.clone(), "api").await.unwrap();
    let addrs: Vec<String> = sorted(&r)
        .iter()
        .map(|t| t["address"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(addrs, vec!["10.0.0.2", "10.0.0.4", "2001:db8::3"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_fail_over_and_all_down_is_a_provider_error_without_hosts() {
    let mut e = Etcd::start();
    e.put("/services/api/1", "10.0.0.1:80");
    let h = hosted();
    let dead = format!("http://127.0.0.1:{}", tributary_testkit::free_port());
    let both = format!("{dead}, {}", e.endpoint());
    let r = h
        .resolve(json!({ "endpoints": both }), "api")
        .await
        .unwrap();
    assert_eq!(r.targets.len(), 1);

    e.stop();
    let err = h
        .resolve(json!({ "endpoints": both }), "api")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ERR_PROVIDER), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("endpoint 1") && text.contains("endpoint 2"),
        "{text}"
    );
    assert!(!text.contains("127.0.0.1"), "{text}");
    assert!(!h.stderr().contains("127.0.0.1"), "{}", h.stderr());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_errors_name_the_credential_and_never_show_the_password() {
    let mut e = Etcd::start();
    e.put("/services/api/1", "10.0.0.1:80");
    e.put("/private/api/1", "10.0.0.9:80");
    e.enable_auth("r00t-Secret-Pw");
    let password = "S3cret-app-pw-7731";
    e.add_reader("app", password, "/services/");
    let h = hosted();
    let ep = e.endpoint();
    let good = json!({"endpoints": ep, "username": "app", "password": password});

    let r = h.resolve(good.clone(), "api").await.unwrap();
    assert_eq!(r.targets, vec![json!({"address":"10.0.0.1","port":80})]);

    let mut outputs = Vec::new();
    for (config, service, field) in [
        (
            json!({"endpoints": ep, "username": "app", "password": "wrong-password-1"}),
            "api",
            "password",
        ),
        (
            json!({"endpoints": ep, "username": "nobody", "password": password}),
            "api",
            "password",
        ),
        (json!({"endpoints": ep}), "api", "username"),
        (
            json!({"endpoints": ep, "username": "app", "password": password, "prefix": "/private/"}),
            "api",
            "username",
        ),
        (
            json!({"endpoints": ep, "username": "app"}),
            "api",
            "password",
        ),
    ] {
        let err = h.resolve(config.clone(), service).await.unwrap_err();
        assert_eq!(
            (err.code(), err.field()),
            (Some(ERR_CONFIG), Some(field)),
            "{config}: {err}"
        );
        outputs.push(err.to_string());
    }

    // Simple tokens die with the member: after a restart the cached token is refused and the
    // plugin authenticates again by itself.
    e.restart();
    let r = h.resolve(good.clone(), "api").await.unwrap();
    assert_eq!(r.targets.len(), 1);

    outputs.push(h.stderr());
    for text in &outputs {
        assert!(!text.contains(password), "password leaked: {text}");
        assert!(
            !text.contains("wrong-password-1"),
            "password leaked: {text}"
        );
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_custom_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let tls = TestCa::generate("tributary test CA").write_pem_files(tmp.path());
    let e = Etcd::start_with(Some((tls.cert.clone(), tls.key.clone())));
    let h = hosted();
    let with_ca = json!({"endpoints": e.endpoint(), "ca_cert": tls.ca});
    // The test client speaks plain HTTP: an unknown service shows the TLS path works end to end.
    let err = poll("etcd over HTTPS answers", || {
        let rt = tokio::runtime::Handle::current();
        let r = tokio::task::block_in_place(|| rt.block_on(h.resolve(with_ca.clone(), "api")));
        match r {
            Err(e) if e.field() == Some("service") => Ok(e),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(err.code(), Some(ERR_CONFIG));
    // Without the CA the server's certificate is not trusted: a provider error naming no host.
    let err = h
        .resolve(json!({"endpoints": e.endpoint()}), "api")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ERR_PROVIDER), "{err}");
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    // A CA file that is not PEM is a config error on ca_cert.
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let err = h
        .resolve(json!({"endpoints": e.endpoint(), "ca_cert": junk}), "api")
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.field()),
        (Some(ERR_CONFIG), Some("ca_cert")),
        "{err}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_checker() {
    let e = Etcd::start();
    e.put("/services/demo/1", "127.0.0.1:8080");
    let tmp = tempfile::tempdir().unwrap();
    let sample = json!({
        "provider": "etcd",
        "config": {"endpoints": e.endpoint()},
        "service": "demo",
        "unknown_service": "no-such-service"
    });
    let dir = plugin_folder(tmp.path(), PLUGIN.source_dir(), PLUGIN.bin(), Some(&sample));
    let report = check_plugin(&dir).await;
    assert_conforms(&report, &[]);
    assert_cli_check_passes(&tributary_bin(PLUGIN.bin()), &dir, false);
}

#[test]
fn end_to_end_nginx_follows_etcd_and_keeps_servers_when_etcd_is_down() {
    let nginx = Nginx::builder()
        .backend("alpha")
        .backend("beta")
        .backend("gamma")
        .start();
    let port = |n: &str| nginx.backend_port(n);
    let mut e = Etcd::start();
    e.put(
        "/services/api/alpha",
        &format!("127.0.0.1:{}", port("alpha")),
    );
    e.put("/services/api/beta", &format!("127.0.0.1:{}", port("beta")));
    e.enable_auth("r00t-Secret-Pw");
    let password = "E2e-etcd-Secret-9924";
    e.add_reader("tributary", password, "/services/");

    let tmp = tempfile::tempdir().unwrap();
    let plugins = plugins_dir(tmp.path(), PLUGIN.source_dir(), PLUGIN.bin());
    let daemon = Daemon::start(&tributary_bin(PLUGIN.bin()), tmp.path(), &plugins, &nginx);
    let ep = format!("endpoints={}", e.endpoint());
    let pw = format!("password={password}");
    let out = daemon.binding_add(
        "api",
        "etcd",
        "etcd",
        "api",
        &[&ep, "username=tributary", &pw],
        &[],
    );
    let mut captured = vec![assert_ok(&out, "binding add")];
    wait_backends(&nginx, "api", &["alpha", "beta"]);

    // Change the registry: alpha leaves, gamma joins; one refresh brings file and nginx along.
    e.delete("/services/api/alpha");
    e.put(
        "/services/api/gamma",
        &format!("127.0.0.1:{}", port("gamma")),
    );
    let out = daemon.cli(&["binding", "refresh", "api"]);
    captured.push(assert_ok(&out, "binding refresh"));
    wait_backends(&nginx, "api", &["beta", "gamma"]);
    let conf = nginx.upstreams_dir().join("api.conf");
    let good = std::fs::read_to_string(&conf).unwrap();

    // A wrong password: -32003 on `password`, servers kept.
    let out = daemon.binding_add(
        "api",
        "etcd",
        "etcd",
        "api",
        &[&ep, "username=tributary", "password=Wrong-Secret-Pw-1"],
        &["--replace"],
    );
    captured.push(String::from_utf8_lossy(&out.stdout).to_string());
    captured.push(String::from_utf8_lossy(&out.stderr).to_string());
    let b = daemon.show("api");
    assert_eq!(b["last_outcome"]["status"], "failed", "{b}");
    assert_eq!(b["last_outcome"]["field"], "password", "{b}");
    captured.push(b.to_string());
    // Back to the right password (secret fields left out keep their value only when unchanged,
    // so give it again).
    let out = daemon.binding_add(
        "api",
        "etcd",
        "etcd",
        "api",
        &[&ep, "username=tributary", &pw],
        &["--replace"],
    );
    captured.push(assert_ok(&out, "binding add --replace"));
    assert_eq!(daemon.show("api")["last_outcome"]["status"], "unchanged");

    // etcd down: the refresh fails with -32000, nginx keeps its servers, the binding shows it.
    e.stop();
    let out = daemon.cli(&["binding", "refresh", "api"]);
    assert!(!out.status.success(), "refresh with etcd down must fail");
    captured.push(String::from_utf8_lossy(&out.stdout).to_string());
    let b = daemon.show("api");
    assert_eq!(b["last_outcome"]["status"], "failed", "{b}");
    assert_eq!(b["last_outcome"]["code"], ERR_PROVIDER, "{b}");
    assert_eq!(b["servers"].as_array().unwrap().len(), 2, "{b}");
    captured.push(b.to_string());
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), good);
    wait_backends(&nginx, "api", &["beta", "gamma"]);

    // The password is nowhere: CLI output, binding details, the daemon's log (plugin stderr
    // included), the upstream file.
    captured.push(daemon.log_text());
    captured.push(good);
    for text in &captured {
        assert!(!text.contains(password), "password leaked: {text}");
        assert!(
            !text.contains("Wrong-Secret-Pw-1"),
            "password leaked: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_folder_works_through_its_launcher() {
    // plugins/etcd/plugin.json names run.sh, which starts the binary cargo built into the target dir.
    let e = Etcd::start();
    e.put("/services/api/1", "10.0.0.1:80");
    let host = checked_in(PLUGIN.source_dir());
    let r = host
        .resolve(
            "etcd",
            params("etcd", json!({"endpoints": e.endpoint()}), "api"),
        )
        .await
        .unwrap_or_else(|err| panic!("{err}; stderr: {:?}", host.stderr_tail("etcd")));
    assert_eq!(r.targets, vec![json!({"address":"10.0.0.1","port":80})]);
    host.shutdown().await;
    let report = check_plugin(PLUGIN.source_dir()).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_answers_times_out_as_a_provider_error() {
    // Accepts connections (the kernel's backlog) but never answers a byte.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let h = hosted();
    // The plugin's own answer (its request timeout), not the host's 30 s timeout.
    let err = h
        .resolve(json!({ "endpoints": endpoint }), "api")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ERR_PROVIDER), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    drop(silent);
    h.shutdown().await;
}
