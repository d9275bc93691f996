//! What isolates a plugin from the daemon and the daemon from a plugin: the clean environment and
//! private home, the kill after consecutive timeouts, no half-written request line, and the bound
//! on calls in flight. Against the real `tributary-testplug` process.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tributary_plugin_host::{HostOptions, PluginHost, ResolveError};
use tributary_protocol::{ConfigMap, ResolveParams, ResolveResult};

fn manifest(environment: &[&str]) -> Value {
    json!({
        "name": "testplug",
        "version": "0.0.1",
        "executable": env!("CARGO_BIN_EXE_tributary-testplug"),
        "capabilities": ["upstream.discovery"],
        "permissions": ["network"],
        "environment": environment,
        "discovery": {"providers": [{
            "code": "test",
            "name": "Test",
            "configuration": {"fields": [
                {"key": "token", "display_name": "Token", "secret": true},
                {"key": "pad", "display_name": "Padding"}
            ]}
        }]}
    })
}

fn opts(home_root: &Path) -> HostOptions {
    HostOptions {
        timeout: Duration::from_secs(5),
        restart_backoff: Duration::from_millis(50),
        restart_backoff_max: Duration::from_millis(200),
        shutdown_grace: Duration::from_millis(500),
        home_root: Some(home_root.to_path_buf()),
        ..HostOptions::default()
    }
}

/// A plugins dir (with the test plugin) and a data folder, and the host on them.
fn host(
    environment: &[&str],
    edit: impl FnOnce(&mut HostOptions),
) -> (tempfile::TempDir, PluginHost) {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    std::fs::create_dir_all(plugins.join("testplug")).unwrap();
    std::fs::write(
        plugins.join("testplug/plugin.json"),
        manifest(environment).to_string(),
    )
    .unwrap();
    let mut o = opts(&tmp.path().join("data/plugin-homes"));
    edit(&mut o);
    let (host, errors) = PluginHost::load(&plugins, o);
    assert!(errors.is_empty(), "{errors:?}");
    (tmp, host)
}

fn params(service: &str, pad: usize) -> ResolveParams {
    let mut config = ConfigMap::new();
    config.insert("token", "tok_live_s3cr3t_value");
    if pad > 0 {
        config.insert("pad", "p".repeat(pad));
    }
    ResolveParams {
        provider: "test".into(),
        config,
        service: service.into(),
    }
}

async fn resolve(host: &PluginHost, service: &str) -> Result<ResolveResult, ResolveError> {
    host.resolve("testplug", params(service, 0)).await
}

fn tail(host: &PluginHost) -> String {
    host.stderr_tail("testplug").join("\n")
}

/// Waits (bounded) until the plugin's process is gone.
async fn wait_not_running(host: &PluginHost) {
    let t = Instant::now();
    while host.is_running("testplug") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still running: {}",
            tail(host)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_sees_only_the_clean_environment_and_its_declared_variables() {
    // Each nextest test is its own process: these variables are this test's alone.
    std::env::set_var("TRIBUTARY_TOKEN", "daemon-token-value");
    std::env::set_var("TRIBUTARY_UI_PASSWORD", "daemon-ui-password");
    std::env::set_var("TRIBUTARY_DATA_DIR", "/somewhere");
    std::env::set_var("TESTPLUG_CACERT", "/etc/ca.pem");
    std::env::set_var("TESTAWS_REGION", "eu-west-1");
    std::env::set_var("UNDECLARED_SETTING", "nope");
    let (tmp, host) = host(&["TESTPLUG_CACERT", "TESTAWS_*"], |_| {});
    let r = resolve(&host, "env").await.unwrap();
    let env = r.targets[0]["env"].as_object().unwrap().clone();
    let mut keys: Vec<&str> = env.keys().map(String::as_str).collect();
    keys.sort();
    let mut want = vec!["HOME", "LANG", "PATH", "TESTAWS_REGION", "TESTPLUG_CACERT"];
    if std::env::var_os("TZ").is_some() {
        want.push("TZ");
        want.sort();
    }
    assert_eq!(keys, want, "the plugin's environment: {env:?}");
    assert_eq!(env["TESTPLUG_CACERT"], "/etc/ca.pem");
    assert_eq!(env["TESTAWS_REGION"], "eu-west-1");
    let shown = Value::Object(env.clone()).to_string();
    for secret in [
        "daemon-token-value",
        "daemon-ui-password",
        "/somewhere",
        "nope",
    ] {
        assert!(
            !shown.contains(secret),
            "{secret} reached the plugin: {shown}"
        );
    }
    // HOME is a private folder of this plugin under the home root.
    let home = tmp.path().join("data/plugin-homes/testplug");
    assert_eq!(env["HOME"], home.display().to_string());
    assert_eq!(r.targets[0]["home_mode"], "700");
    assert!(
        home.join("env.json").is_file(),
        "the plugin can write its home"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_folder_opened_up_is_made_private_again_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let (tmp, host) = host(&[], |_| {});
    let home = tmp.path().join("data/plugin-homes/testplug");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = resolve(&host, "env").await.unwrap();
    assert_eq!(r.targets[0]["home_mode"], "700");
    let root = std::fs::metadata(home.parent().unwrap()).unwrap();
    assert_eq!(root.permissions().mode() & 0o777, 0o700);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_home_root_the_home_is_a_private_temporary_folder() {
    let (_tmp, host) = host(&[], |o| o.home_root = None);
    let r = resolve(&host, "env").await.unwrap();
    let home = r.targets[0]["env"]["HOME"].as_str().unwrap().to_string();
    assert!(home.ends_with("/testplug"), "{home}");
    assert_eq!(r.targets[0]["home_mode"], "700");
    host.shutdown().await;
    drop(host);
    assert!(!Path::new(&home).exists(), "removed with the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_timeouts_in_a_row_kill_the_plugin_and_it_restarts_after_the_back_off() {
    let (_tmp, host) = host(&[], |o| {
        o.timeout = Duration::from_millis(300);
        o.restart_backoff = Duration::from_millis(400);
        o.restart_backoff_max = Duration::from_millis(400);
    });
    assert_eq!(HostOptions::default().max_timeouts, 3);
    resolve(&host, "ok").await.unwrap();
    let first = host.pid("testplug").unwrap();
    // Two timeouts, then an answer: the count starts again.
    for _ in 0..2 {
        assert!(matches!(
            resolve(&host, "hang").await,
            Err(ResolveError::Timeout(_))
        ));
    }
    resolve(&host, "ok").await.unwrap();
    for _ in 0..2 {
        assert!(matches!(
            resolve(&host, "hang").await,
            Err(ResolveError::Timeout(_))
        ));
    }
    assert_eq!(host.pid("testplug"), Some(first), "two in a row: kept");
    // The third in a row kills it.
    assert!(matches!(
        resolve(&host, "hang").await,
        Err(ResolveError::Timeout(_))
    ));
    wait_not_running(&host).await;
    let t = tail(&host);
    assert!(
        t.contains("killed the plugin")
            && t.contains("3 calls in a row got no answer within 300ms"),
        "{t}"
    );
    // Restarted by the next call, after the back-off (400 ms > the 300 ms timeout: refused).
    match resolve(&host, "ok").await {
        Err(ResolveError::Crashed(m)) => assert!(m.contains("restarted in"), "{m}"),
        other => panic!("expected the back-off refusal, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(450)).await;
    resolve(&host, "ok").await.unwrap();
    assert_ne!(host.pid("testplug"), Some(first));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_line_cut_by_a_timeout_kills_the_plugin_instead_of_going_on() {
    let (_tmp, host) = host(&[], |o| o.timeout = Duration::from_millis(500));
    resolve(&host, "ok").await.unwrap();
    let first = host.pid("testplug").unwrap();
    // The plugin stops reading; a 4 MiB request line then fills the pipe and its write times out
    // part-way.
    assert!(matches!(
        resolve(&host, "noread").await,
        Err(ResolveError::Timeout(_))
    ));
    let big = host.resolve("testplug", params("ok", 4 << 20)).await;
    assert!(matches!(big, Err(ResolveError::Timeout(_))), "{big:?}");
    wait_not_running(&host).await;
    let t = tail(&host);
    assert!(t.contains("a request line was cut after"), "{t}");
    assert!(!t.contains("s3cr3t"), "{t}");
    // Only one timeout in a row counted before: the kill came from the cut line.
    tokio::time::sleep(Duration::from_millis(250)).await;
    resolve(&host, "ok").await.unwrap();
    assert_ne!(host.pid("testplug"), Some(first), "a new process answers");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_line_cut_by_a_cancelled_call_kills_the_plugin() {
    let (_tmp, host) = host(&[], |_| {});
    resolve(&host, "ok").await.unwrap();
    let first = host.pid("testplug").unwrap();
    let stuck = tokio::time::timeout(Duration::from_millis(300), resolve(&host, "noread")).await;
    assert!(stuck.is_err(), "cancelled while waiting for its answer");
    assert_eq!(host.pid("testplug"), Some(first), "nothing was cut: kept");
    // The caller gives up while the 4 MiB line is half in the pipe.
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        host.resolve("testplug", params("ok", 4 << 20)),
    )
    .await;
    assert!(cut.is_err());
    wait_not_running(&host).await;
    assert!(
        tail(&host).contains("a request line was cut after"),
        "{}",
        tail(&host)
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r = resolve(&host, "ok").await.unwrap();
    assert_eq!(r.targets[0]["service"], "ok");
    assert_ne!(host.pid("testplug"), Some(first));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_are_bounded_per_plugin_and_waiting_is_not_timed() {
    assert_eq!(HostOptions::default().max_concurrent, 16);
    let (_tmp, host) = host(&[], |o| {
        o.max_concurrent = 2;
        o.timeout = Duration::from_millis(1500);
    });
    resolve(&host, "ok").await.unwrap();
    // Six calls of 400 ms with two places: three waves, so at least 1.2 s in all; the last wave
    // waits 800 ms for a place, which its 1.5 s timeout does not count.
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let host = std::sync::Arc::new(host);
    for _ in 0..6 {
        let h = host.clone();
        set.spawn(async move { h.resolve("testplug", params("sleep:400", 0)).await });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().unwrap();
    }
    assert!(
        t.elapsed() >= Duration::from_millis(1200),
        "six 400 ms calls with two places took only {:?}",
        t.elapsed()
    );
    host.shutdown().await;
}
