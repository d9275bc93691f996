//! The plugin host against real processes: the misbehaving `tributary-testplug` (built by this crate).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use tributary_plugin_host::{HostOptions, LoadError, PluginHost, ResolveError};
use tributary_protocol::{ConfigMap, ResolveParams, ERR_CONFIG, ERR_PROVIDER};

const SECRET: &str = "tok_live_s3cr3t_value";

fn testplug() -> &'static str {
    env!("CARGO_BIN_EXE_tributary-testplug")
}

fn manifest(name: &str, exe: &str) -> serde_json::Value {
    json!({
        "name": name,
        "version": "0.0.1",
        "description": "misbehaves on purpose",
        "executable": exe,
        "capabilities": ["upstream.discovery"],
        "permissions": ["network"],
        "discovery": {"providers": [{
            "code": "test",
            "name": "Test",
            "configuration": {"fields": [
                {"key": "token", "display_name": "Token", "secret": true}
            ]}
        }]}
    })
}

fn write_plugin(plugins: &Path, folder: &str, manifest: &serde_json::Value) -> PathBuf {
    let dir = plugins.join(folder);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin.json"), manifest.to_string()).unwrap();
    dir
}

fn opts() -> HostOptions {
    HostOptions {
        // Generous (the machine may be busy with other tests): only the hang tests wait for it.
        timeout: Duration::from_secs(5),
        restart_backoff: Duration::from_millis(50),
        restart_backoff_max: Duration::from_millis(200),
        shutdown_grace: Duration::from_millis(500),
        ..HostOptions::default()
    }
}

fn host_with(opts: HostOptions) -> (tempfile::TempDir, PluginHost) {
    let tmp = tempfile::tempdir().unwrap();
    write_plugin(tmp.path(), "testplug", &manifest("testplug", testplug()));
    let (host, errors) = PluginHost::load(tmp.path(), opts);
    assert!(errors.is_empty(), "{errors:?}");
    (tmp, host)
}

fn params(service: &str) -> ResolveParams {
    let mut config = ConfigMap::new();
    config.insert("token", SECRET);
    ResolveParams {
        provider: "test".into(),
        config,
        service: service.into(),
    }
}

async fn resolve(
    host: &PluginHost,
    service: &str,
) -> Result<tributary_protocol::ResolveResult, ResolveError> {
    host.resolve("testplug", params(service)).await
}

fn assert_no_secret(e: &ResolveError) {
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(SECRET), "config value leaked: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_lazily_and_resolves() {
    let (_tmp, host) = host_with(opts());
    assert!(
        !host.is_running("testplug"),
        "no process before the first call"
    );
    let r = resolve(&host, "ok").await.unwrap();
    assert_eq!(r.ttl_seconds, 5);
    assert_eq!(
        r.targets,
        vec![json!({"address":"10.0.0.1","port":80,"service":"ok"})]
    );
    let pid = host.pid("testplug").unwrap();
    resolve(&host, "ok").await.unwrap();
    assert_eq!(
        host.pid("testplug"),
        Some(pid),
        "the process is started once and kept"
    );
    let p = host.plugins();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].name, "testplug");
    assert_eq!(p[0].version, "0.0.1");
    assert!(host.provider("testplug", "test").is_some());
    assert!(host.provider("testplug", "nope").is_none());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_matched_by_id() {
    let (_tmp, host) = host_with(opts());
    // Later requests answer first: the answers come back in the reverse order.
    let services: Vec<String> = (0..12)
        .map(|i| format!("sleep:{}", (12 - i) * 25))
        .collect();
    let calls = services.iter().map(|s| resolve(&host, s));
    let results = futures_join_all(calls).await;
    for (s, r) in services.iter().zip(results) {
        let r = r.unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(
            r.targets[0]["service"],
            json!(s),
            "answer of another request"
        );
    }
    host.shutdown().await;
}

/// Runs futures concurrently on this task (no extra dependency).
async fn futures_join_all<F: std::future::Future>(
    futs: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    let mut futs: Vec<Option<_>> = futs.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if let Some(fut) = f {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        outs[i] = Some(v);
                        *f = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_request_times_out_and_others_are_unharmed() {
    let (_tmp, host) = host_with(HostOptions {
        timeout: Duration::from_millis(1200),
        ..opts()
    });
    resolve(&host, "ok").await.unwrap(); // started: the timeouts below measure answers only
    let (hang, fine) = tokio::join!(resolve(&host, "hang"), resolve(&host, "sleep:50"));
    assert_eq!(
        hang.unwrap_err(),
        ResolveError::Timeout(Duration::from_millis(1200))
    );
    assert_eq!(fine.unwrap().targets[0]["service"], "sleep:50");
    let pid = host.pid("testplug");
    resolve(&host, "ok").await.unwrap();
    assert_eq!(
        host.pid("testplug"),
        pid,
        "a timeout does not restart the plugin"
    );
    let e = resolve(&host, "hang").await.unwrap_err();
    assert_eq!(e.to_string(), "no answer within 1200ms");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_timeout_is_30_seconds() {
    let o = HostOptions::default();
    assert_eq!(o.timeout, Duration::from_secs(30));
    assert_eq!(o.max_line, 4 * 1024 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_mid_request_fails_in_flight_calls_then_restarts() {
    let (_tmp, host) = host_with(opts());
    resolve(&host, "ok").await.unwrap();
    let first = host.pid("testplug").unwrap();
    // `hang` is in flight when `exit` makes the plugin exit.
    let (inflight, exit) = tokio::join!(resolve(&host, "hang"), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        resolve(&host, "exit").await
    });
    for e in [exit.unwrap_err(), inflight.unwrap_err()] {
        match &e {
            ResolveError::Crashed(m) => assert!(m.contains("exit status: 3"), "{m}"),
            other => panic!("expected Crashed, got {other:?}"),
        }
        assert_eq!(e.code(), None);
    }
    // The next call waits for the back-off and works on a new process.
    let r = resolve(&host, "ok").await.unwrap();
    assert_eq!(r.targets.len(), 1);
    let second = host.pid("testplug").unwrap();
    assert_ne!(first, second);
    let tail = host.stderr_tail("testplug").join("\n");
    assert!(
        tail.contains("[tributary] the plugin exited (exit status: 3)"),
        "{tail}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_back_off_longer_than_the_timeout_fails_fast() {
    let (_tmp, host) = host_with(HostOptions {
        timeout: Duration::from_secs(3),
        restart_backoff: Duration::from_secs(20),
        restart_backoff_max: Duration::from_secs(20),
        ..opts()
    });
    assert!(matches!(
        resolve(&host, "exit").await,
        Err(ResolveError::Crashed(_))
    ));
    // The crash is recorded before the in-flight call fails: the next call is refused at once
    // (well before its 3 s timeout), and no process is started.
    let t = std::time::Instant::now();
    match resolve(&host, "ok").await {
        Err(ResolveError::Crashed(m)) => assert!(m.contains("restarted in"), "{m}"),
        other => panic!("expected a back-off refusal, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(!host.is_running("testplug"));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_json_and_cut_off_lines_fail_only_their_request() {
    let (_tmp, host) = host_with(opts());
    // Alone in flight: a line that is not JSON at all fails that request.
    match resolve(&host, "garbage").await {
        Err(ResolveError::Malformed(m)) => assert!(m.contains("not valid JSON"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A cut-off line that still shows its id fails that request, not the one beside it.
    let (broken, fine) = tokio::join!(resolve(&host, "broken"), resolve(&host, "sleep:300"));
    assert!(
        matches!(broken, Err(ResolveError::Malformed(_))),
        "{broken:?}"
    );
    assert_eq!(fine.unwrap().targets[0]["service"], "sleep:300");
    let pid = host.pid("testplug");
    resolve(&host, "ok").await.unwrap();
    assert_eq!(host.pid("testplug"), pid, "the plugin was not restarted");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_over_4_mib_fails_only_its_request() {
    let (_tmp, host) = host_with(opts());
    let (huge, fine) = tokio::join!(resolve(&host, "huge"), resolve(&host, "sleep:300"));
    match huge {
        Err(ResolveError::Malformed(m)) => {
            assert!(m.contains("over the limit of 4194304 bytes"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fine.unwrap().targets[0]["service"], "sleep:300");
    resolve(&host, "ok").await.unwrap();
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_without_targets_is_malformed() {
    let (_tmp, host) = host_with(opts());
    let (bad, fine) = tokio::join!(resolve(&host, "notargets"), resolve(&host, "sleep:100"));
    assert_eq!(
        bad.unwrap_err(),
        ResolveError::Malformed("the result has no `targets` array".into())
    );
    fine.unwrap();
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_error_passes_code_and_field_with_values_redacted() {
    let (_tmp, host) = host_with(opts());
    let e = resolve(&host, "config-error").await.unwrap_err();
    assert_eq!(e.code(), Some(ERR_CONFIG));
    assert_eq!(e.field(), Some("token"));
    assert_no_secret(&e);
    assert_eq!(
        e.to_string(),
        "plugin error: token <redacted> was rejected (code -32003, field \"token\")"
    );
    let e = resolve(&host, "no-such-service").await.unwrap_err();
    assert_eq!((e.code(), e.field()), (Some(ERR_CONFIG), Some("service")));
    let e = resolve(&host, "provider-error").await.unwrap_err();
    assert_eq!((e.code(), e.field()), (Some(ERR_PROVIDER), None));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_is_captured_bounded_and_redacted() {
    let (_tmp, host) = host_with(HostOptions {
        stderr_lines: 4,
        ..opts()
    });
    for _ in 0..6 {
        resolve(&host, "stderr").await.unwrap();
    }
    // The stderr reader runs beside the answer: wait until the last line is in.
    let mut tail = Vec::new();
    for _ in 0..100 {
        tail = host.stderr_tail("testplug");
        if tail.len() == 4 && tail.iter().all(|l| l.starts_with("connecting")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tail.len() <= 4, "{tail:?}");
    assert!(
        tail.iter()
            .any(|l| l == "connecting with token=<redacted> now"),
        "{tail:?}"
    );
    assert!(!tail.iter().any(|l| l.contains(SECRET)), "{tail:?}");
    assert!(host.stderr_tail("nope").is_empty());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_plugin_and_provider_are_refused_without_a_call() {
    let (_tmp, host) = host_with(opts());
    let e = host.resolve("nope", params("ok")).await.unwrap_err();
    assert_eq!(e.to_string(), "unknown plugin \"nope\"");
    let mut p = params("ok");
    p.provider = "other".into();
    let e = host.resolve("testplug", p).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "plugin \"testplug\" has no provider \"other\""
    );
    assert!(!host.is_running("testplug"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_process_and_refuses_later_calls() {
    let (_tmp, host) = host_with(opts());
    resolve(&host, "ok").await.unwrap();
    let pid = host.pid("testplug").unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    host.shutdown().await;
    // Reaped: the pid is gone (or reused by an unrelated process, which is not a zombie of ours).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        !stat.contains("(tributary-test"),
        "plugin still there: {stat}"
    );
    assert!(matches!(
        resolve(&host, "ok").await,
        Err(ResolveError::Spawn(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_manifests_are_refused_and_the_rest_works() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    write_plugin(p, "good", &manifest("good", testplug()));
    let mut m = manifest("nonet", testplug());
    m["permissions"] = json!([]);
    write_plugin(p, "nonet", &m);
    let mut m = manifest("unknowncap", testplug());
    m["capabilities"] = json!(["upstream.discovery", "notification.channel"]);
    write_plugin(p, "unknowncap", &m);
    let mut m = manifest("dupprov", testplug());
    let prov = m["discovery"]["providers"][0].clone();
    m["discovery"]["providers"]
        .as_array_mut()
        .unwrap()
        .push(prov);
    write_plugin(p, "dupprov", &m);
    let mut m = manifest("dupfield", testplug());
    let field = m["discovery"]["providers"][0]["configuration"]["fields"][0].clone();
    m["discovery"]["providers"][0]["configuration"]["fields"]
        .as_array_mut()
        .unwrap()
        .push(field);
    write_plugin(p, "dupfield", &m);
    write_plugin(p, "noexe", &manifest("noexe", "bin/not-there"));
    let d = write_plugin(p, "notexec", &manifest("notexec", "plugin.json"));
    let _ = d;
    write_plugin(p, "zz-dupname", &manifest("good", testplug()));
    std::fs::create_dir_all(p.join("empty")).unwrap();
    std::fs::create_dir_all(p.join(".hidden")).unwrap();

    let (host, errors) = PluginHost::load(p, opts());
    let names: Vec<String> = host.plugins().into_iter().map(|i| i.name).collect();
    assert_eq!(names, vec!["good"]);
    let by_dir = |folder: &str| -> String {
        errors
            .iter()
            .find(|e| e.dir().ends_with(folder))
            .unwrap_or_else(|| panic!("no error for {folder}: {errors:?}"))
            .to_string()
    };
    assert!(by_dir("nonet").contains("does not request the \"network\" permission"));
    assert!(by_dir("unknowncap").contains("unknown capability \"notification.channel\""));
    assert!(by_dir("dupprov").contains("provider code \"test\" is declared twice"));
    assert!(by_dir("dupfield").contains("field key \"token\" is declared twice"));
    assert!(by_dir("noexe").contains("bin/not-there does not exist"));
    assert!(by_dir("notexec").contains("is not an executable file"));
    assert!(by_dir("zz-dupname").contains("plugin name \"good\" is already used by"));
    assert!(by_dir("empty").contains("no plugin.json"));
    assert!(matches!(
        errors.iter().find(|e| e.dir().ends_with("noexe")),
        Some(LoadError::MissingExecutable { .. })
    ));
    assert_eq!(errors.len(), 8, "{errors:?}");
    host.resolve("good", params("ok")).await.unwrap();
    host.shutdown().await;

    let (host, errors) = PluginHost::load(&p.join("missing"), opts());
    assert!(host.plugins().is_empty());
    assert!(matches!(errors.as_slice(), [LoadError::ReadDir { .. }]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_results_never_show_config_values() {
    let (_tmp, host) = host_with(opts());
    let e = resolve(&host, "badresult").await.unwrap_err();
    assert!(matches!(e, ResolveError::Malformed(_)), "{e:?}");
    assert_no_secret(&e);
    assert!(e.to_string().contains("<redacted>"), "{e}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_fails_a_misbehaving_plugin_and_names_the_checks() {
    use tributary_plugin_host::check::{
        check_plugin, check_plugin_with, CheckOptions, Outcome, Sample,
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut m = manifest("testplug", testplug());
    m["discovery"]["providers"][0]["configuration"]["fields"][0]["required"] = json!(true);
    let dir = write_plugin(tmp.path(), "testplug", &m);
    let opts = CheckOptions {
        timeout: Duration::from_millis(500),
        sample: Some(Sample {
            provider: "test".into(),
            config: params("ok").config,
            service: "ok".into(),
            unknown_service: Some("nope".into()),
        }),
    };
    let report = check_plugin_with(&dir, &opts).await;
    assert!(!report.passed(), "{report}");
    let outcome = |prefix: &str| {
        report
            .checks
            .iter()
            .find(|c| c.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no check {prefix}: {report}"))
            .outcome
            .clone()
    };
    assert_eq!(outcome("manifest"), Outcome::Pass);
    assert_eq!(outcome("valid resolve"), Outcome::Pass);
    assert_eq!(outcome("unknown service"), Outcome::Pass);
    assert_eq!(outcome("concurrent requests"), Outcome::Pass);
    // testplug ignores the method and the provider, never checks fields and drops bad lines.
    assert!(
        matches!(outcome("unknown method"), Outcome::Fail(_)),
        "{report}"
    );
    assert!(
        matches!(outcome("unknown provider"), Outcome::Fail(_)),
        "{report}"
    );
    assert!(
        matches!(
            outcome("provider \"test\": missing required"),
            Outcome::Fail(_)
        ),
        "{report}"
    );
    match outcome("invalid JSON line") {
        Outcome::Fail(d) => assert!(d.contains("no answer within"), "{d}"),
        other => panic!("{other:?}"),
    }
    assert!(report.to_string().contains("does NOT conform"), "{report}");

    // A folder whose manifest is refused fails at the first check.
    let mut bad = manifest("bad", testplug());
    bad["permissions"] = json!([]);
    let dir = write_plugin(tmp.path(), "bad", &bad);
    let report = check_plugin(&dir).await;
    assert_eq!(report.checks.len(), 1, "{report}");
    match &report.checks[0].outcome {
        Outcome::Fail(d) => assert!(d.contains("\"network\" permission"), "{d}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_stderr_lines_are_cut_after_redaction() {
    let (_tmp, host) = host_with(opts());
    resolve(&host, "longstderr").await.unwrap();
    let mut line = None;
    for _ in 0..100 {
        line = host
            .stderr_tail("testplug")
            .into_iter()
            .find(|l| l.starts_with("<redacted> yyy"));
        if line.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let line = line.expect("the long line is captured");
    assert!(line.len() <= 4096 + " [cut]".len(), "{}", line.len());
    assert!(line.ends_with(" [cut]"));
    host.shutdown().await;
}
