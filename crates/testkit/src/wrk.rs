//! Constant background load from Debian's `wrk` (package `wrk`, installed by `scripts/setup.sh`):
//! keep-alive connections that cycle through a list of paths until [`Wrk::stop`].

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::procfs::{self, Sig};
use crate::Failed;

/// A running `wrk`; killed on drop.
pub struct Wrk {
    child: Option<Child>,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

/// What `wrk` printed when it stopped.
#[derive(Debug, Clone, Default)]
pub struct WrkReport {
    /// Completed requests (`N requests in ...`).
    pub requests: u64,
    /// Answers with a status outside 200–399 (`Non-2xx or 3xx responses`).
    pub non_2xx_3xx: u64,
    /// `Socket errors: connect C, read R, write W, timeout T`.
    pub connect_errors: u64,
    /// See [`WrkReport::connect_errors`].
    pub read_errors: u64,
    /// See [`WrkReport::connect_errors`].
    pub write_errors: u64,
    /// See [`WrkReport::connect_errors`].
    pub timeouts: u64,
    /// Requests per second (`Requests/sec:`).
    pub per_second: f64,
    /// The 99th percentile of latency in milliseconds (`99%` of `Latency Distribution`).
    pub p99_ms: Option<f64>,
    /// The whole output.
    pub output: String,
}

impl WrkReport {
    /// Parses wrk's summary.
    pub fn parse(output: &str) -> Option<WrkReport> {
        let mut r = WrkReport {
            output: output.to_string(),
            ..WrkReport::default()
        };
        let num = |s: &str| s.trim().trim_end_matches(',').parse::<u64>().ok();
        let mut seen_requests = false;
        for line in output.lines().map(str::trim) {
            if let Some((n, _)) = line.split_once(" requests in ") {
                r.requests = num(n)?;
                seen_requests = true;
            } else if let Some(rest) = line.strip_prefix("Socket errors:") {
                for part in rest.split(',') {
                    let mut w = part.split_whitespace();
                    let (Some(kind), Some(n)) = (w.next(), w.next().and_then(num)) else {
                        return None;
                    };
                    match kind {
                        "connect" => r.connect_errors = n,
                        "read" => r.read_errors = n,
                        "write" => r.write_errors = n,
                        "timeout" => r.timeouts = n,
                        _ => return None,
                    }
                }
            } else if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
                r.non_2xx_3xx = num(n)?;
            } else if let Some(n) = line.strip_prefix("Requests/sec:") {
                r.per_second = n.trim().parse().ok()?;
            } else if let Some(v) = line.strip_prefix("99%") {
                r.p99_ms = duration_ms(v.trim());
            }
        }
        seen_requests.then_some(r)
    }

    /// All socket errors together.
    pub fn socket_errors(&self) -> u64 {
        self.connect_errors + self.read_errors + self.write_errors + self.timeouts
    }
}

/// wrk's duration text (`635.91us`, `1.20ms`, `2.00s`, `1.00m`) in milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().ok()?;
    let per_ms = match unit {
        "us" => 0.001,
        "ms" => 1.0,
        "s" => 1000.0,
        "m" => 60_000.0,
        _ => return None,
    };
    Some(n * per_ms)
}

impl Wrk {
    /// Starts `wrk -t THREADS -c CONNECTIONS` against 127.0.0.1:`port`; each connection sends
    /// `paths` in turn (a Lua `request` function), for at most `max` (then wrk stops by itself).
    pub fn start(
        port: u16,
        paths: &[&str],
        threads: usize,
        connections: usize,
        max: Duration,
    ) -> Result<Wrk, Failed> {
        let dir = tempfile::Builder::new()
            .prefix("cu-wrk-")
            .tempdir()
            .map_err(|e| format!("create a temporary dir for wrk: {e}"))?;
        let list: Vec<String> = paths.iter().map(|p| format!("{p:?}")).collect();
        let script = dir.path().join("paths.lua");
        fs::write(
            &script,
            format!(
                "local paths = {{ {} }}\nlocal i = 0\n\
                 request = function()\n  i = i + 1\n  return wrk.format(nil, paths[(i % #paths) + 1])\nend\n",
                list.join(", ")
            ),
        )
        .map_err(|e| format!("write {}: {e}", script.display()))?;
        let out = dir.path().join("wrk.out");
        let stdout = fs::File::create(&out).map_err(|e| format!("create wrk.out: {e}"))?;
        let child = Command::new("wrk")
            .arg(format!("-t{threads}"))
            .arg(format!("-c{connections}"))
            .arg(format!("-d{}s", max.as_secs().max(1)))
            .arg("--latency")
            .arg("-s")
            .arg(&script)
            .arg(format!("http://127.0.0.1:{port}/"))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start wrk (Debian package wrk, scripts/setup.sh): {e}"))?;
        Ok(Wrk {
            child: Some(child),
            out,
            _dir: dir,
        })
    }

    /// Stops wrk with `SIGINT` (it then prints its summary) and parses the summary.
    pub fn stop(mut self) -> Result<WrkReport, Failed> {
        let mut child = self.child.take().ok_or("wrk already stopped")?;
        if matches!(child.try_wait(), Ok(None)) {
            procfs::signal(child.id(), Sig::Int);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("wrk did not stop within 10 s of SIGINT".into());
                }
            }
        }
        let text = fs::read_to_string(&self.out).unwrap_or_default();
        Ok(WrkReport::parse(&text).ok_or_else(|| format!("cannot read wrk's summary:\n{text}"))?)
    }
}

impl Drop for Wrk {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_summary() {
        let out = "Running 1m test @ http://127.0.0.1:1/\n  2 threads and 8 connections\n\
                   \x20 Thread Stats   Avg      Stdev     Max   +/- Stdev\n\
                   \x20 123456 requests in 10.00s, 1.23MB read\n\
                   \x20 Socket errors: connect 1, read 12, write 3, timeout 4\n\
                   \x20 Latency Distribution\n     50%  635.91us\n     99%    1.20ms\n\
                   \x20 Non-2xx or 3xx responses: 5\nRequests/sec:  12345.60\n";
        let r = WrkReport::parse(out).unwrap();
        assert_eq!(r.p99_ms, Some(1.2));
        assert!((r.per_second - 12345.6).abs() < 1e-6);
        assert_eq!(duration_ms("635.91us"), Some(0.63591));
        assert_eq!(duration_ms("2.00s"), Some(2000.0));
        assert_eq!(
            (r.requests, r.non_2xx_3xx, r.socket_errors()),
            (123_456, 5, 20)
        );
        assert_eq!((r.connect_errors, r.read_errors), (1, 12));
        assert!(WrkReport::parse("Running\n").is_none());
    }
}
