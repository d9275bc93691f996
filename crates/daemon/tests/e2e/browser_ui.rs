//! The web UI in a real browser: Debian's `chromium` driven by `playwright-core` (npm) from
//! `tests/browser/ui.test.mjs`, against the real `tributary serve`, the real `static` plugin,
//! the misbehaving test plugin (for a secret field) and a real nginx.
//!
//! Needs `/usr/bin/chromium`, `node` and `npm ci` in `tests/browser` (scripts/setup.sh does all
//! three); without them the test fails and says what is missing. Screenshots of the main pages go
//! to `target/browser-artifacts/`.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{workspace_root, Daemon};
use tributary_testkit::Nginx;

/// Kills the node process group (node and the chromium it started) on drop.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let pid = self.0.id();
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.wait();
    }
}

#[test]
fn web_ui_in_chromium() {
    let chromium = Path::new("/usr/bin/chromium");
    assert!(
        chromium.is_file(),
        "/usr/bin/chromium is missing: install Debian's chromium (scripts/setup.sh does)"
    );
    let node_ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        node_ok,
        "node is missing: install Debian's nodejs and npm (scripts/setup.sh does)"
    );
    let dir = workspace_root().join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core/package.json")
            .is_file(),
        "playwright-core is not installed: run `npm ci` in {} (scripts/setup.sh does)",
        dir.display()
    );
    let artifacts = workspace_root().join("target/browser-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();

    let root = tempfile::tempdir().unwrap();
    let nginx = Nginx::builder().backend("alpha").backend("beta").start();
    let daemon = Daemon::start_with(
        root.path(),
        &nginx,
        &[
            "--min-reload-gap-ms",
            "100",
            "--batch-quiet-ms",
            "50",
            "--with-testplug",
        ],
    );
    let password_file = daemon.data_dir.join("ui-initial-password");
    let password = std::fs::read_to_string(&password_file)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; log: {}",
                password_file.display(),
                daemon.log_text()
            )
        })
        .trim()
        .to_string();
    let profile = root.path().join("chromium-profile");

    let child = Command::new("node")
        .arg("ui.test.mjs")
        .current_dir(&dir)
        .env("TRIBUTARY_URL", format!("http://127.0.0.1:{}", daemon.port))
        .env("TRIBUTARY_PASSWORD", &password)
        .env("TRIBUTARY_TOKEN_FILE", daemon.data_dir.join("token"))
        .env("CONF_DIR", nginx.conf_dir())
        .env("NGINX_URL", format!("http://127.0.0.1:{}", nginx.port()))
        .env("ALPHA_PORT", nginx.backend_port("alpha").to_string())
        .env("BETA_PORT", nginx.backend_port("beta").to_string())
        .env("ARTIFACTS", &artifacts)
        .env("PROFILE_DIR", &profile)
        .env("DAEMON_LOG", &daemon.log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("start node");
    let mut group = Group(child);
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = group.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the browser test did not finish in 300 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut o) = group.0.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = group.0.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    println!("{out}");
    eprintln!("{err}");
    let log = daemon.log_text();
    assert!(
        status.success() && out.contains(" passed, 0 failed"),
        "browser test failed ({status}):\n{out}\n{err}\ndaemon log:\n{log}"
    );
    // The secret typed into the form never reached the log.
    assert!(!log.contains("browser-secret-value"), "{log}");
    for shot in [
        "login.png",
        "bindings-list.png",
        "binding-detail.png",
        "binding-failing.png",
        "binding-form-errors.png",
        "test-resolve.png",
    ] {
        assert!(artifacts.join(shot).is_file(), "screenshot {shot} missing");
    }
}
