//! A real etcd (Debian's `etcd-server`) on free 127.0.0.1 ports with a temporary data dir, for the
//! `etcd` plugin's tests and benchmark, and a tiny HTTP client for its v3 JSON API. Stopped on drop.
//! For an HTTPS client URL, give it the server certificate of a [`crate::tls::TestCa`]
//! ([`crate::tls::TestCa::write_pem_files`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use tributary_testkit::client::http_request_within;
use tributary_testkit::{listening, wait_ready, NotReady};

/// The etcd binary: `etcd` on PATH, else /usr/bin/etcd. Panics with the install hint.
pub fn binary() -> PathBuf {
    crate::find_program(
        "etcd",
        "/usr/bin/etcd",
        "install Debian's etcd-server package (scripts/setup.sh does it)",
    )
}

/// A running etcd.
pub struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub client_port: u16,
    peer_port: u16,
    tls: Option<(PathBuf, PathBuf)>,
    /// Root's token once [`Etcd::enable_auth`] ran.
    root_token: Option<String>,
    root_password: Option<String>,
}

impl Etcd {
    /// Starts a fresh single-member etcd on free ports (plain HTTP).
    pub fn start() -> Etcd {
        Etcd::start_with(None)
    }

    /// Starts a fresh etcd; with `tls` (cert, key) its client URL is HTTPS.
    pub fn start_with(tls: Option<(PathBuf, PathBuf)>) -> Etcd {
        let mut last = String::new();
        for _ in 0..5 {
            let mut e = Etcd {
                child: None,
                dir: tempfile::tempdir().unwrap(),
                client_port: tributary_testkit::free_port(),
                peer_port: tributary_testkit::free_port(),
                tls: tls.clone(),
                root_token: None,
                root_password: None,
            };
            match e.spawn() {
                Ok(()) => return e,
                Err(why) => last = why,
            }
        }
        panic!("etcd did not start: {last}");
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The client URL, the plugin's `endpoints`.
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.client_port)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let mut cmd = Command::new(binary());
        cmd.arg("--name")
            .arg("t")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--log-level", "warn"]);
        if let Some((cert, key)) = &self.tls {
            cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
        }
        let child = cmd
            .env_remove("ETCDCTL_API")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("spawn etcd: {e}"))?;
        let (port, tls) = (self.client_port, self.tls.is_some());
        let child = self.child.insert(child);
        // With TLS the test client cannot ask, so listening is the sign.
        let ready = wait_ready(child, Duration::from_secs(30), || {
            listening(port)
                && (tls || post_json(port, "/v3/kv/range", &json!({"key": "AA=="}), None).is_ok())
        });
        ready.map_err(|why| {
            if matches!(why, NotReady::Exited(_)) {
                self.child = None;
            }
            format!("etcd {why}: {}", self.log_text())
        })
    }

    /// Stops etcd (the data dir stays, for [`Etcd::restart`]). Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data (e.g. after [`Etcd::stop`]).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match self.spawn() {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => panic!("etcd did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        if let Some(pw) = self.root_password.clone() {
            self.root_token = Some(self.authenticate("root", &pw));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// A plain-HTTP POST of JSON to the client port (not for the TLS variant).
    fn try_post(&self, path: &str, body: &Value, token: Option<&str>) -> std::io::Result<Value> {
        assert!(self.tls.is_none(), "the test client speaks plain HTTP only");
        post_json(self.client_port, path, body, token)
    }

    fn post(&self, path: &str, body: Value) -> Value {
        let v = self
            .try_post(path, &body, self.root_token.as_deref())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        assert!(v.get("code").is_none(), "POST {path} {body}: {v}");
        v
    }

    pub fn put(&self, key: &str, value: &str) {
        self.post(
            "/v3/kv/put",
            json!({"key": B64.encode(key), "value": B64.encode(value)}),
        );
    }

    pub fn delete(&self, key: &str) {
        self.post("/v3/kv/deleterange", json!({"key": B64.encode(key)}));
    }

    fn authenticate(&self, user: &str, password: &str) -> String {
        let v = self
            .try_post(
                "/v3/auth/authenticate",
                &json!({"name": user, "password": password}),
                None,
            )
            .unwrap();
        v["token"]
            .as_str()
            .unwrap_or_else(|| panic!("authenticate: {v}"))
            .to_string()
    }

    /// Turns authentication on (root user with `root_password`); afterwards this client uses
    /// root's token.
    pub fn enable_auth(&mut self, root_password: &str) {
        self.post("/v3/auth/role/add", json!({"name": "root"}));
        self.post(
            "/v3/auth/user/add",
            json!({"name": "root", "password": root_password}),
        );
        self.post(
            "/v3/auth/user/grant",
            json!({"user": "root", "role": "root"}),
        );
        self.post("/v3/auth/enable", json!({}));
        self.root_password = Some(root_password.to_string());
        self.root_token = Some(self.authenticate("root", root_password));
    }

    /// Adds `user` with `password` and a role that may read keys from `prefix` on (empty: none).
    pub fn add_reader(&self, user: &str, password: &str, prefix: &str) {
        self.add_user(user, password, prefix, "READ");
    }

    /// Adds `user` with `password` and a role that may read and write the keys under `prefix`
    /// and nothing else.
    pub fn add_prefix_writer(&self, user: &str, password: &str, prefix: &str) {
        self.add_user(user, password, prefix, "READWRITE");
    }

    fn add_user(&self, user: &str, password: &str, prefix: &str, perm: &str) {
        let grants: &[(&str, &str)] = if prefix.is_empty() {
            &[]
        } else {
            &[(prefix, perm)]
        };
        self.add_user_with(user, password, grants);
    }

    /// Adds `user` with `password` and a role holding each `(prefix, "READ" | "WRITE" |
    /// "READWRITE")` grant (e.g. the whole prefix to read, some kinds of keys to write).
    pub fn add_user_with(&self, user: &str, password: &str, grants: &[(&str, &str)]) {
        let role = format!("{user}-role");
        self.post("/v3/auth/role/add", json!({"name": role}));
        for (prefix, perm) in grants {
            let mut end = prefix.as_bytes().to_vec();
            *end.last_mut().unwrap() += 1;
            self.post(
                "/v3/auth/role/grant",
                json!({"name": role, "perm": {"permType": perm, "key": B64.encode(prefix), "range_end": B64.encode(&end)}}),
            );
        }
        self.post(
            "/v3/auth/user/add",
            json!({"name": user, "password": password}),
        );
        self.post("/v3/auth/user/grant", json!({"user": user, "role": role}));
    }
}

/// A plain-HTTP POST of JSON to etcd's v3 JSON gateway on `port` (testkit's client), with the
/// gateway's auth token when given; the answer's JSON.
pub(crate) fn post_json(
    port: u16,
    path: &str,
    body: &Value,
    token: Option<&str>,
) -> std::io::Result<Value> {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(t) = token {
        headers.push(("Authorization", t));
    }
    let r = http_request_within(
        port,
        "POST",
        path,
        &headers,
        body.to_string().as_bytes(),
        Duration::from_secs(10),
    )
    .map_err(|e| std::io::Error::other(e.message().map_or("no message", |m| m).to_string()))?;
    serde_json::from_slice(&r.body)
        .map_err(|e| std::io::Error::other(format!("{e}: {} {}", r.status, r.text())))
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
