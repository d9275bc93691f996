//! `tributary serve --store etcd` end to end: real daemons, real nginx, a real 3-member etcd
//! cluster. What the store layer guarantees on its own: bindings saved through one host's CLI live
//! in etcd sealed, a host that starts later (or restarts) runs them from etcd, and the settings
//! are checked before anything starts.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{assert_ok, fleet_args, Daemon};
use tributary_fakes::etcd_cluster::EtcdCluster;
use tributary_testkit::Nginx;

const WAIT: Duration = Duration::from_secs(20);
const PREFIX: &str = "/e2e/";
const TTL_SECS: u64 = 2;

fn key_file(dir: &Path) -> PathBuf {
    let f = dir.join("secrets.key");
    std::fs::write(&f, [5u8; 32]).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    f
}

fn start(root: &Path, nginx: &Nginx, args: &[String]) -> Daemon {
    let mut extra: Vec<&str> = tributary_fakes::daemon::FAST.to_vec();
    extra.extend(args.iter().map(String::as_str));
    Daemon::start_with(root, nginx, &extra)
}

#[test]
fn bindings_saved_on_one_host_live_in_etcd_sealed_and_run_on_a_host_started_later() {
    let cluster = EtcdCluster::start(3);
    let shared = tempfile::tempdir().unwrap();
    let key = key_file(shared.path());

    let root_a = tempfile::tempdir().unwrap();
    let nginx_a = Nginx::builder().backend("alpha").start();
    let alpha = nginx_a.backend_port("alpha");
    let a = start(
        root_a.path(),
        &nginx_a,
        &fleet_args(&cluster, PREFIX, &key, "host-a", TTL_SECS),
    );
    let secret_like = format!("127.0.0.1:{alpha}");
    let out = a.binding_add(
        "api",
        "static",
        "static",
        "demo",
        &[&format!("targets={secret_like}")],
        &[],
    );
    assert_ok(&out, "binding add on A");
    nginx_a
        .wait_for_body(&Nginx::upstream_path("api"), "alpha", WAIT)
        .unwrap();

    // In etcd: the binding, sealed; no config value or key in any value under the prefix.
    let dump = cluster.dump(PREFIX);
    assert!(
        dump.iter().any(|(k, _)| k == "/e2e/bindings/api"),
        "{dump:?}"
    );
    // (A published target set has a `targets` field of its own: the resolved servers, which every
    // nginx renders, are not config; the config's key `targets` and its value are what must not
    // appear anywhere else.)
    for (k, v) in &dump {
        assert!(!v.contains(&secret_like), "{k}: {v}");
        if !k.starts_with("/e2e/targets/") {
            assert!(!v.contains("\"targets\""), "{k}: {v}");
        }
    }
    assert!(
        dump.iter().any(|(k, _)| k == "/e2e/targets/api"),
        "the resolver published the set: {dump:?}"
    );

    // Host B starts later with its own nginx: it runs the binding from etcd.
    let root_b = tempfile::tempdir().unwrap();
    let nginx_b = Nginx::builder().backend("alpha").start();
    let b = start(
        root_b.path(),
        &nginx_b,
        &fleet_args(&cluster, PREFIX, &key, "host-b", TTL_SECS),
    );
    let (ok, show) = b.cli_json(&["binding", "show", "api"]);
    assert!(ok, "{show}");
    assert_eq!(show["binding"]["service"], "demo", "{show}");
    // Its file holds the same server (the static plugin resolves to A's backend address).
    b.wait_for("api", |v| v["binding"]["last_outcome"]["status"] == "ok");
    let file_b = std::fs::read_to_string(nginx_b.upstreams_dir().join("api.conf")).unwrap();
    assert!(file_b.contains(&secret_like), "{file_b}");
    drop(b);

    // A restarts: the binding comes back from etcd (its SQLite file is not used).
    let mut a = a;
    a.stop();
    assert!(!a.data_dir.join("tributary.db").exists());
    a.spawn();
    let (ok, list) = a.cli_json(&["binding", "list"]);
    assert!(ok, "{list}");
    assert!(list.to_string().contains("\"api\""), "{list}");
}

#[test]
fn wrong_fleet_settings_stop_the_daemon_with_a_message() {
    let cluster = EtcdCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().start();
    let open_key = root.path().join("open.key");
    std::fs::write(&open_key, [1u8; 32]).unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let short_key = root.path().join("short.key");
    std::fs::write(&short_key, [1u8; 8]).unwrap();
    std::fs::set_permissions(&short_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let endpoints = cluster.endpoints().join(",");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--store".into(),
                "etcd".into(),
                "--secrets-key".into(),
                short_key.display().to_string(),
            ],
            "--etcd-endpoints",
        ),
        (
            vec![
                "--store".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                endpoints.clone(),
            ],
            "--secrets-key",
        ),
        (
            vec![
                "--store".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                endpoints.clone(),
                "--secrets-key".into(),
                open_key.display().to_string(),
            ],
            "chmod 600",
        ),
        (
            vec![
                "--store".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                endpoints.clone(),
                "--secrets-key".into(),
                short_key.display().to_string(),
            ],
            "holds 8 bytes",
        ),
        (
            vec![
                "--store".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                endpoints,
                "--secrets-key".into(),
                key_file(root.path()).display().to_string(),
                "--host-id".into(),
                "a/b".into(),
            ],
            "host id",
        ),
    ];
    let bin = common::tributary_bin();
    for (args, want) in cases {
        let out = std::process::Command::new(&bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(root.path().join("data"))
            .arg("--conf-dir")
            .arg(nginx.conf_dir())
            .args([
                "--test-cmd",
                "true",
                "--reload-cmd",
                "true",
                "--no-reload-confirm",
            ])
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(text.contains(want), "{args:?}: {text}");
    }
}

#[test]
fn a_second_daemon_with_a_host_id_in_use_refuses_to_start_but_a_restart_after_a_crash_does_not() {
    let cluster = EtcdCluster::start(3);
    let shared = tempfile::tempdir().unwrap();
    let key = key_file(shared.path());
    let root_a = tempfile::tempdir().unwrap();
    let nginx_a = Nginx::builder().start();
    let args = fleet_args(&cluster, PREFIX, &key, "host-a", TTL_SECS);
    let mut a = start(root_a.path(), &nginx_a, &args);

    // Another daemon (its own data dir and nginx) with A's host id while A runs: refused.
    let root_2 = tempfile::tempdir().unwrap();
    let nginx_2 = Nginx::builder().start();
    let t0 = std::time::Instant::now();
    let log = root_2.path().join("second.log");
    let mut second = std::process::Command::new(common::tributary_bin())
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(root_2.path().join("data"))
        .arg("--plugins-dir")
        .arg(common::static_plugins_dir(root_2.path()))
        .arg("--conf-dir")
        .arg(nginx_2.conf_dir())
        .args([
            "--test-cmd",
            "true",
            "--reload-cmd",
            "true",
            "--no-reload-confirm",
        ])
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // It must end by itself, within the lease TTL plus the checks' time; one still running then
    // has started (stopped here, and the test fails).
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break Some(status);
        }
        if t0.elapsed() > Duration::from_secs(40) {
            let _ = second.kill();
            let _ = second.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.is_some_and(|s| !s.success()),
        "a second host-a started ({status:?}): {text}"
    );
    assert!(
        text.contains("host id \"host-a\" is in use") && text.contains("--host-id"),
        "{text}"
    );
    eprintln!("refused after {:?}", t0.elapsed());
    // A is not disturbed: still alive in etcd, still answering.
    let dump = cluster.dump(PREFIX);
    assert!(
        dump.iter().any(|(k, _)| k == "/e2e/hosts/host-a"),
        "{dump:?}"
    );
    let (st, store) = a.api("GET", "/api/v1/store", None);
    assert_eq!(
        (st, &store["connected"]),
        (200, &serde_json::json!(true)),
        "{store}"
    );

    // A crashes (SIGKILL: its lease lives on for up to a TTL) and starts again at once: it
    // waits for its old lease to expire and starts.
    let pid = a.pid().unwrap();
    let st = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    a.stop();
    a.spawn();
    let (st, store) = a.api("GET", "/api/v1/store", None);
    assert_eq!(
        (st, &store["connected"]),
        (200, &serde_json::json!(true)),
        "{store}"
    );
}
