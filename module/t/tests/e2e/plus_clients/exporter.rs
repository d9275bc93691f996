//! (d) The official Prometheus exporter, Debian's `prometheus-nginx-exporter` 0.11.0 with
//! `-nginx.plus`, scraping the Plus API: its per-server `nginxplus_upstream_server_*` series carry
//! exactly the requests this case sent, by backend and status class, and zeros for a quiet
//! upstream; after a reload (a new zone) the same exporter shows only what came after it.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ngx_harness::{check, free_ports, http_request, CaseResult, Completion, Failed};

use super::helpers::addr;
use super::master::Master;
use super::tools::{conf, require, EXPORTER};

/// The exporter process, killed on drop.
struct Exporter {
    child: Child,
    port: u16,
}

impl Exporter {
    fn start(api_port: u16) -> Result<Exporter, Failed> {
        let port = free_ports(1).first().copied().ok_or("no free port")?;
        let child = Command::new(EXPORTER)
            .arg("-nginx.plus")
            .arg(format!("-nginx.scrape-uri=http://127.0.0.1:{api_port}/api"))
            .arg(format!("-web.listen-address=127.0.0.1:{port}"))
            .arg("-nginx.retries=0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {EXPORTER}: {e}"))?;
        let mut e = Exporter { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = e.child.try_wait() {
                let mut err = String::new();
                if let Some(mut s) = e.child.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                return Err(format!("{EXPORTER} exited ({st}) at start: {err}").into());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(e);
            }
            check(Instant::now() < deadline, || {
                format!("{EXPORTER} did not listen on {port} in 10 s")
            })?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn scrape(&self) -> Result<Vec<Sample>, Failed> {
        let r = http_request(self.port, "GET", "/metrics", &[], b"")?;
        check(r.status == 200, || {
            format!("GET /metrics of the exporter: {} {}", r.status, r.text())
        })?;
        parse(&r.text())
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One line of the Prometheus text format: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn parse(text: &str) -> Result<Vec<Sample>, Failed> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let bad = || format!("unreadable metrics line {line:?}");
        let (head, value) = line.rsplit_once(' ').ok_or_else(bad)?;
        let value: f64 = value.parse().map_err(|_| bad())?;
        let (name, labels) = match head.split_once('{') {
            None => (head.to_string(), BTreeMap::new()),
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').ok_or_else(bad)?;
                let mut labels = BTreeMap::new();
                // Label values here are names and addresses: no escaped quotes or commas.
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").ok_or_else(bad)?;
                    labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
                (n.to_string(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    Ok(out)
}

/// The value of `nginxplus_upstream_server_<metric>` for one server (and `code`), if exported.
fn series(
    s: &[Sample],
    metric: &str,
    upstream: &str,
    server: &str,
    code: Option<&str>,
) -> Option<f64> {
    let name = format!("nginxplus_upstream_server_{metric}");
    s.iter()
        .find(|x| {
            x.name == name
                && x.labels.get("upstream").map(String::as_str) == Some(upstream)
                && x.labels.get("server").map(String::as_str) == Some(server)
                && x.labels.get("code").map(String::as_str) == code
        })
        .map(|x| x.value)
}

pub fn case_exporter_counts_match_requests() -> Result<Completion, Failed> {
    if let Some(skip) = require(&[EXPORTER])? {
        return Ok(skip);
    }
    run().map(|()| Completion::Completed)
}

fn run() -> CaseResult {
    let conf = conf(
        "upstream app { zone app 1m; server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; }\n\
         upstream quiet { zone quiet 64k; server 127.0.0.1:{P3}; }",
    );
    let mut m = Master::start(&conf)?;
    let exporter = Exporter::start(m.port(0))?;
    let sent = send(
        &m,
        &[("/", 14), ("/s/404", 6), ("/s/500", 4), ("/s/302", 3)],
    )?;
    series_match(&m, &exporter, &sent)?;
    m.check_workers_unchanged()?;
    // A reload starts a new zone, whose counters start at 0 (as in Plus): the same exporter
    // process, scraping on, shows only what was sent after it.
    m.reload(&conf)?;
    let sent = send(&m, &[("/", 5), ("/s/500", 2)])?;
    series_match(&m, &exporter, &sent)?;
    m.check_workers_unchanged()
}

type Sent = BTreeMap<(String, &'static str), u64>;

/// Requests to `app` (`mix`: path, times; answers of every class); counted per backend and status class from the
/// answers (`X-Backend` names the server).
fn send(m: &Master, mix: &[(&str, usize)]) -> Result<Sent, Failed> {
    let mut sent: BTreeMap<(String, &str), u64> = BTreeMap::new();
    for &(path, times) in mix {
        for _ in 0..times {
            let r = http_request(m.port(0), "GET", path, &[], b"")?;
            let b = r.header("X-Backend").unwrap_or("-").to_string();
            let class = match r.status {
                200..=299 => "2xx",
                300..=399 => "3xx",
                400..=499 => "4xx",
                500..=599 => "5xx",
                _ => "1xx",
            };
            check(b == "b1" || b == "b2", || {
                format!("GET {path}: {} from {b:?}", r.status)
            })?;
            *sent.entry((b, class)).or_default() += 1;
        }
    }
    Ok(sent)
}

/// The exporter's per-server series equal `sent` (zeros for `quiet`), within 5 s.
fn series_match(m: &Master, exporter: &Exporter, sent: &Sent) -> CaseResult {
    let servers = [
        ("app", addr(m, 1), "b1"),
        ("app", addr(m, 2), "b2"),
        ("quiet", addr(m, 3), "b3"),
    ];
    // The counters are written when each request ends (after its answer reached us): compare
    // until they match or 5 s passed, then report the last difference.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = exporter.scrape()?;
        let mut wrong = Vec::new();
        let up = s.iter().find(|x| x.name == "nginxplus_up").map(|x| x.value);
        if up != Some(1.0) {
            wrong.push(format!(
                "nginxplus_up = {up:?} (the exporter could not read the API: see its log)"
            ));
        }
        for (up, server, b) in &servers {
            let mut want: Vec<(&str, Option<&str>, f64)> = Vec::new();
            let mut total = 0;
            for class in ["1xx", "2xx", "3xx", "4xx", "5xx"] {
                let n = sent.get(&(b.to_string(), class)).copied().unwrap_or(0);
                total += n;
                want.push(("responses", Some(class), n as f64));
            }
            want.push(("requests", None, total as f64));
            want.push(("fails", None, 0.0));
            want.push(("unavail", None, 0.0));
            want.push(("state", None, 1.0));
            for (metric, code, v) in want {
                let got = series(&s, metric, up, server, code);
                if got != Some(v) {
                    wrong.push(format!(
                        "nginxplus_upstream_server_{metric}{{upstream={up},server={server}{}}} = {got:?}, sent {v}",
                        code.map(|c| format!(",code={c}")).unwrap_or_default()
                    ));
                }
            }
            // Bytes: something both ways for a server that served requests, nothing for the quiet one.
            for metric in ["sent", "received"] {
                let got = series(&s, metric, up, server, None).unwrap_or(-1.0);
                let ok = if total == 0 { got == 0.0 } else { got > 0.0 };
                if !ok {
                    wrong.push(format!(
                        "nginxplus_upstream_server_{metric}{{upstream={up},server={server}}} = {got} after {total} requests"
                    ));
                }
            }
        }
        if wrong.is_empty() {
            println!(
                "exporter series match the {} requests sent: {sent:?}",
                sent.values().sum::<u64>()
            );
            return Ok(());
        }
        check(Instant::now() < deadline, || {
            format!(
                "the exporter's per-server series do not match the requests sent {sent:?} \
                 (zeros where requests were sent: are helper `stats`' per-server counters in the module?):\n{}",
                wrong.join("\n")
            )
        })?;
        std::thread::sleep(Duration::from_millis(100));
    }
}
