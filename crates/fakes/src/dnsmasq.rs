//! A real `dnsmasq` (Debian's package) answering only its command-line records on a free
//! 127.0.0.1 port, for the `dns` plugin's tests and benchmark. Stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tributary_testkit::{listening, wait_ready, NotReady};

/// The dnsmasq binary: `dnsmasq` on PATH, else /usr/sbin/dnsmasq. Panics with the install hint.
pub fn binary() -> PathBuf {
    crate::find_program(
        "dnsmasq",
        "/usr/sbin/dnsmasq",
        "install Debian's dnsmasq-base package (scripts/setup.sh does it)",
    )
}

/// A running dnsmasq.
pub struct Dnsmasq {
    child: Option<Child>,
    pub port: u16,
    log: tempfile::NamedTempFile,
}

impl Dnsmasq {
    /// Starts dnsmasq on a free port. `records` are dnsmasq options such as
    /// `--srv-host=_http._tcp.api.test,h1.test,8080,10,5` or `--host-record=h1.test,127.0.0.1`;
    /// names under `test` that it does not know get NXDOMAIN. `ttl` is the TTL of its answers
    /// (`--local-ttl`; a `--host-record` may carry its own).
    pub fn start(ttl: u32, records: &[String]) -> Dnsmasq {
        let mut last = String::new();
        for _ in 0..5 {
            match Dnsmasq::try_start(tributary_testkit::free_tcp_udp_port(), ttl, records) {
                Ok(d) => return d,
                Err(e) => last = e,
            }
        }
        panic!("dnsmasq did not start: {last}");
    }

    /// Starts dnsmasq on `port` (e.g. again on the port of one just stopped).
    pub fn start_on(port: u16, ttl: u32, records: &[String]) -> Dnsmasq {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Dnsmasq::try_start(port, ttl, records) {
                Ok(d) => return d,
                Err(e) if Instant::now() > deadline => panic!("dnsmasq did not start: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn try_start(port: u16, ttl: u32, records: &[String]) -> Result<Dnsmasq, String> {
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(binary())
            .args([
                "--keep-in-foreground",
                &format!("--port={port}"),
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--conf-file=/dev/null",
                "--pid-file=",
                "--local=/test/",
                "--log-facility=-",
                &format!("--local-ttl={ttl}"),
            ])
            .args(records)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log.reopen().unwrap()))
            .spawn()
            .map_err(|e| format!("spawn dnsmasq: {e}"))?;
        let mut d = Dnsmasq {
            child: Some(child),
            port,
            log,
        };
        let child = d.child.as_mut().expect("just spawned");
        match wait_ready(child, Duration::from_secs(10), || listening(port)) {
            Ok(()) => Ok(d),
            Err(why) => {
                if matches!(why, NotReady::Exited(_)) {
                    d.child = None;
                }
                Err(format!("dnsmasq {why}: {}", d.log_text()))
            }
        }
    }

    /// `127.0.0.1:<port>`, the plugin's `nameserver`.
    pub fn nameserver(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What dnsmasq logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Stops dnsmasq and waits for it. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}
