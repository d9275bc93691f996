//! Test harness for the combined-upstreams module: runs Debian's `/usr/sbin/nginx` with the
//! module loaded (`load_module`), on free 127.0.0.1 ports, in its own temporary prefix, and talks
//! HTTP/1.1 to it over plain `std::net::TcpStream` ([`http_request`], [`KeepAlive`]).
//!
//! - [`config_test`] / [`expect_emerg`]: `nginx -t` on a configuration, the latter checking that
//!   it fails with an expected `[emerg]` text.
//! - [`Nginx::start`]: a running nginx (single process, `master_process off`) that stays up for
//!   the whole case, so a case can send many requests against shared state; stopped on `Drop`
//!   (also when the case panics) and its prefix removed.
//! - [`run_tests`]: runs `libtest_mimic` trials and ends with a `N passed, N failed` line.
//!
//! Configurations are the *inside* of `http {}`; `{P0}` … `{P9}` are replaced by free ports,
//! `{DEAD}` by a port where nothing listens, and `{PREFIX}` by the prefix directory. Environment overrides: `COMBINED_UPSTREAMS_MODULE` (path of
//! the module `.so`, default `target/release/libngx_http_combined_upstreams_module.so`, built by
//! `cargo build --release -p ngx-combined-upstreams`) and `NGINX_BIN` (default `/usr/sbin/nginx`).
//! A missing `.so` or nginx binary makes every case fail with a message saying so.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use libtest_mimic::{Failed, Trial};

/// Environment variable that overrides where the module `.so` is looked up.
pub const MODULE_ENV: &str = "COMBINED_UPSTREAMS_MODULE";
/// Environment variable that overrides the nginx binary.
pub const NGINX_ENV: &str = "NGINX_BIN";
/// Number of `{Pn}` placeholders available in a configuration.
pub const PORTS: usize = 10;

/// Result type of a test case.
pub type CaseResult = Result<(), Failed>;

/// Path of the module `.so`: `$COMBINED_UPSTREAMS_MODULE`, else the release build output.
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os(MODULE_ENV) {
        return PathBuf::from(p);
    }
    workspace_root().join("target/release/libngx_http_combined_upstreams_module.so")
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The nginx binary: `$NGINX_BIN`, else Debian's `/usr/sbin/nginx`.
pub fn nginx_bin() -> PathBuf {
    std::env::var_os(NGINX_ENV).map_or_else(|| PathBuf::from("/usr/sbin/nginx"), PathBuf::from)
}

fn check_prerequisites() -> Result<(), String> {
    let so = module_path();
    if !so.is_file() {
        return Err(format!(
            "module not found at {} (build it with `cargo build --release -p \
             ngx-combined-upstreams`, or set {MODULE_ENV})",
            so.display()
        ));
    }
    let bin = nginx_bin();
    if !bin.is_file() {
        return Err(format!(
            "nginx not found at {} (install Debian's nginx: scripts/setup.sh, or set {NGINX_ENV})",
            bin.display()
        ));
    }
    Ok(())
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, String> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "cu-nginx-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        for sub in ["conf", "logs", "tmp"] {
            fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `n` distinct free TCP ports on 127.0.0.1 (all listeners are held until every port is picked).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .filter_map(|_| TcpListener::bind("127.0.0.1:0").ok())
        .collect();
    listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.port())
        .collect()
}

/// A loopback port where nothing listens (a dead server), outside Linux's ephemeral range
/// (32768–60999) from which [`free_ports`] and other tests' `bind(0)` take their ports, so no
/// concurrently running test can bring it to life.
pub fn dead_port() -> u16 {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let seed = std::process::id() as usize * 7919
        + COUNTER.fetch_add(1, Ordering::Relaxed) * 104_729
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as usize);
    let mut port = 20_000 + (seed % 12_000) as u16;
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        port = 20_000 + (port - 20_000 + 1) % 12_000;
    }
    port
}

/// Replaces `{P0}`…`{P9}`, `{DEAD}` and `{PREFIX}` in a configuration template.
pub fn fill(template: &str, ports: &[u16], dead: u16, prefix: &Path) -> String {
    let mut s = template
        .replace("{PREFIX}", &prefix.display().to_string())
        .replace("{DEAD}", &dead.to_string());
    for (i, p) in ports.iter().enumerate() {
        s = s.replace(&format!("{{P{i}}}"), &p.to_string());
    }
    s
}

/// The whole `nginx.conf` around an `http {}` body.
fn full_config(main_extra: &str, http: &str, prefix: &Path) -> String {
    let so = module_path();
    let p = prefix.display();
    format!(
        "load_module {so};\n\
         daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         error_log {p}/logs/error.log info;\n\
         pid {p}/logs/nginx.pid;\n\
         {main_extra}\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
         access_log off;\n\
         client_body_temp_path {p}/tmp/body;\n\
         proxy_temp_path {p}/tmp/proxy;\n\
         fastcgi_temp_path {p}/tmp/fastcgi;\n\
         uwsgi_temp_path {p}/tmp/uwsgi;\n\
         scgi_temp_path {p}/tmp/scgi;\n\
         {http}\n\
         }}\n",
        so = so.display()
    )
}

/// Writes `conf/nginx.conf` into `dir` with the placeholders of both parts filled.
fn write_config(
    dir: &TempDir,
    main_extra: &str,
    http: &str,
    ports: &[u16],
    dead: u16,
) -> Result<PathBuf, String> {
    let conf = dir.0.join("conf/nginx.conf");
    let main_extra = fill(main_extra, ports, dead, &dir.0);
    let http = fill(http, ports, dead, &dir.0);
    fs::write(&conf, full_config(&main_extra, &http, &dir.0))
        .map_err(|e| format!("write {}: {e}", conf.display()))?;
    Ok(conf)
}

/// `nginx -p DIR -e DIR/logs/error.log -c CONF` with stdin closed.
fn nginx_command(dir: &TempDir, conf: &Path) -> Command {
    let mut c = Command::new(nginx_bin());
    c.arg("-p")
        .arg(&dir.0)
        .arg("-e")
        .arg(dir.0.join("logs/error.log"))
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null());
    c
}

/// Outcome of `nginx -t`: whether it succeeded, and its stderr.
#[derive(Debug)]
pub struct ConfigTest {
    /// `nginx -t` exited 0.
    pub ok: bool,
    /// Everything nginx printed on stderr.
    pub stderr: String,
}

/// Runs `nginx -t` on an `http {}` body (placeholders filled with free ports).
pub fn config_test(http: &str) -> Result<ConfigTest, String> {
    config_test_with("", http)
}

/// [`config_test`] with extra main-context lines (e.g. `env NAME;`).
pub fn config_test_with(main_extra: &str, http: &str) -> Result<ConfigTest, String> {
    check_prerequisites()?;
    let dir = TempDir::new()?;
    let ports = free_ports(PORTS);
    let conf = write_config(&dir, main_extra, http, &ports, dead_port())?;
    let out = nginx_command(&dir, &conf)
        .arg("-t")
        .output()
        .map_err(|e| format!("run {}: {e}", nginx_bin().display()))?;
    Ok(ConfigTest {
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Checks that `nginx -t` rejects the configuration with an `[emerg]` line containing `expected`.
pub fn expect_emerg(http: &str, expected: &str) -> CaseResult {
    let t = config_test(http)?;
    if t.ok {
        return Err(
            format!("nginx -t accepted the configuration; expected [emerg] {expected:?}").into(),
        );
    }
    let hit = t
        .stderr
        .lines()
        .any(|l| l.contains("[emerg]") && l.contains(expected));
    if !hit {
        return Err(format!(
            "expected [emerg] containing {expected:?}, nginx said:\n{}",
            t.stderr
        )
        .into());
    }
    Ok(())
}

/// Checks that `nginx -t` accepts the configuration; returns its stderr (warnings).
pub fn expect_ok(http: &str) -> Result<String, Failed> {
    let t = config_test(http)?;
    if !t.ok {
        return Err(format!("nginx -t failed:\n{}", t.stderr).into());
    }
    Ok(t.stderr)
}

/// A running nginx; stopped (killed) and its prefix removed on drop.
pub struct Nginx {
    child: Option<Child>,
    ports: Vec<u16>,
    dead: u16,
    dir: TempDir,
}

impl Nginx {
    /// Starts nginx with this `http {}` body and waits until every port written as
    /// `listen 127.0.0.1:{Pn}` (one space after `listen`) accepts connections.
    pub fn start(http: &str) -> Result<Nginx, Failed> {
        Self::start_with("", http)
    }

    /// [`Nginx::start`] with extra main-context lines.
    pub fn start_with(main_extra: &str, http: &str) -> Result<Nginx, Failed> {
        check_prerequisites()?;
        let mut last_err = String::new();
        // A port picked as free can be taken by another process before nginx binds it: retry.
        for _ in 0..3 {
            match Self::try_start(main_extra, http) {
                Ok(n) => return Ok(n),
                Err(e) => last_err = e,
            }
        }
        Err(last_err.into())
    }

    /// Starts nginx with ports chosen by the caller (several instances can then share one
    /// port table, e.g. backends in their own nginx so a case can stop one of them). No retry.
    pub fn start_on(http: &str, ports: &[u16]) -> Result<Nginx, Failed> {
        check_prerequisites()?;
        Ok(Self::try_start_on("", http, ports.to_vec())?)
    }

    fn try_start(main_extra: &str, http: &str) -> Result<Nginx, String> {
        Self::try_start_on(main_extra, http, free_ports(PORTS))
    }

    fn try_start_on(main_extra: &str, http: &str, ports: Vec<u16>) -> Result<Nginx, String> {
        let dir = TempDir::new()?;
        let dead = dead_port();
        let conf = write_config(&dir, main_extra, http, &ports, dead)?;
        let stderr_path = dir.0.join("logs/stderr.log");
        let stderr = fs::File::create(&stderr_path)
            .map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
        let child = nginx_command(&dir, &conf)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("start {}: {e}", nginx_bin().display()))?;
        let mut n = Nginx {
            child: Some(child),
            ports,
            dead,
            dir,
        };
        let listen: Vec<u16> = (0..PORTS)
            .filter(|i| http.contains(&format!("listen 127.0.0.1:{{P{i}}}")))
            .map(|i| n.ports[i])
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = n.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let err = fs::read_to_string(&stderr_path).unwrap_or_default();
                    n.child = None;
                    return Err(format!(
                        "nginx exited ({status}):\n{err}\n{}",
                        n.error_log()
                    ));
                }
            }
            if listen
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return Ok(n);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nginx did not listen within 10 s:\n{}",
                    n.error_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port that replaced `{Pi}`.
    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// The port that replaced `{DEAD}` (nothing listens there).
    pub fn dead_port(&self) -> u16 {
        self.dead
    }

    /// The prefix directory.
    pub fn prefix(&self) -> &Path {
        &self.dir.0
    }

    /// Contents of `logs/error.log` so far.
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.dir.0.join("logs/error.log")).unwrap_or_default()
    }

    /// `GET path` on port `{Pi}`.
    pub fn get(&self, i: usize, path: &str) -> Result<Response, Failed> {
        http_get(self.port(i), path, &[])
    }

    /// Any request on port `{Pi}` (see [`http_request`]).
    pub fn request(
        &self,
        i: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, Failed> {
        http_request(self.port(i), method, path, headers, body)
    }

    /// `GET path` on port `{Pi}` with extra request headers.
    pub fn get_with(
        &self,
        i: usize,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response, Failed> {
        http_get(self.port(i), path, headers)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header lines in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// Body bytes (a chunked body already decoded).
    pub body: Vec<u8>,
}

impl Response {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends a `GET` to 127.0.0.1:`port` (see [`http_request`]).
pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Response, Failed> {
    http_request(port, "GET", path, headers, b"")
}

/// Sends one HTTP/1.1 request with `Connection: close` and any method, headers and body to
/// 127.0.0.1:`port` and reads the whole answer (a chunked body is decoded). A `Content-Length`
/// is added when the body is not empty and for every `POST`.
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, Failed> {
    let mut s = connect(port)?;
    let mut all = vec![("Connection", "close")];
    all.extend_from_slice(headers);
    s.write_all(&request_bytes(method, path, &all, body))
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read from {port}: {e}"))?;
    parse_response(&raw)
        .ok_or_else(|| format!("bad HTTP answer: {:?}", String::from_utf8_lossy(&raw)).into())
}

/// A keep-alive HTTP/1.1 connection to 127.0.0.1 that sends requests one after the other.
pub struct KeepAlive {
    stream: TcpStream,
}

impl KeepAlive {
    /// Connects to 127.0.0.1:`port`.
    pub fn open(port: u16) -> Result<KeepAlive, Failed> {
        Ok(KeepAlive {
            stream: connect(port)?,
        })
    }

    /// Sends `GET path` and reads one answer, which must carry a `Content-Length`.
    pub fn get(&mut self, path: &str) -> Result<Response, Failed> {
        self.stream
            .write_all(&request_bytes("GET", path, &[], b""))
            .map_err(|e| format!("send: {e}"))?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = self
                .stream
                .read(&mut byte)
                .map_err(|e| format!("read: {e}"))?;
            check(n == 1, || format!("connection closed after {head:?}"))?;
            head.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&head[..head.len() - 4]).into_owned();
        let (status, headers) =
            parse_head(&text).ok_or_else(|| format!("bad status line in {text:?}"))?;
        let mut r = Response {
            status,
            headers,
            body: Vec::new(),
        };
        let len: usize = r
            .header("Content-Length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no Content-Length in {text:?}"))?;
        r.body = vec![0u8; len];
        self.stream
            .read_exact(&mut r.body)
            .map_err(|e| format!("read body: {e}"))?;
        Ok(r)
    }
}

fn connect(port: u16) -> Result<TcpStream, Failed> {
    let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect {port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    Ok(s)
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Status and header lines of a response head (without the empty line).
fn parse_head(head: &str) -> Option<(u16, Vec<(String, String)>)> {
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Some((status, headers))
}

fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let (status, headers) = parse_head(std::str::from_utf8(&raw[..end]).ok()?)?;
    let mut r = Response {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    };
    if r.header("Transfer-Encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        r.body = dechunk(&r.body)?;
    }
    Some(r)
}

/// Decodes a chunked body (chunk extensions and trailers ignored).
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&raw[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Checks a condition inside a case; the message names what was expected.
pub fn check(cond: bool, msg: impl FnOnce() -> String) -> CaseResult {
    if cond {
        Ok(())
    } else {
        Err(msg().into())
    }
}

/// Checks equality inside a case.
pub fn check_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> CaseResult {
    check(got == want, || {
        format!("{what}: got {got:?}, want {want:?}")
    })
}

/// Runs the trials like the standard test harness (so `cargo nextest` can list and run each
/// one), then prints `N passed, N failed` and exits with the harness's code.
pub fn run_tests(trials: Vec<Trial>) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let listing = args.list;
    let conclusion = libtest_mimic::run(&args, trials);
    if !listing {
        println!(
            "{} passed, {} failed",
            conclusion.num_passed, conclusion.num_failed
        );
    }
    conclusion.exit()
}

/// One `nginx -t` failure case: configuration and expected `[emerg]` text.
pub fn emerg_trial(name: &str, http: &'static str, expected: &'static str) -> Trial {
    Trial::test(name, move || expect_emerg(http, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_replaces_ports_and_prefix() {
        let s = fill(
            "listen 127.0.0.1:{P0}; x {P1} {PREFIX}/a {DEAD}",
            &[8080, 9090],
            7,
            Path::new("/t"),
        );
        assert_eq!(s, "listen 127.0.0.1:8080; x 9090 /t/a 7");
    }

    #[test]
    fn parse_response_reads_status_headers_body() {
        let r =
            parse_response(b"HTTP/1.1 502 Bad Gateway\r\nX-A: 1\r\nSet-Cookie: rt=2\r\n\r\nbody")
                .unwrap();
        assert_eq!(r.status, 502);
        assert_eq!(r.header("set-cookie"), Some("rt=2"));
        assert_eq!(r.header("X-Missing"), None);
        assert_eq!(r.text(), "body");
        assert!(parse_response(b"garbage").is_none());
    }

    #[test]
    fn parse_response_decodes_chunked_bodies() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"abc0123456789");
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
                .is_none()
        );
    }

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(PORTS);
        let mut q = p.clone();
        q.sort_unstable();
        q.dedup();
        assert_eq!(p.len(), PORTS);
        assert_eq!(q.len(), PORTS);
    }
}
