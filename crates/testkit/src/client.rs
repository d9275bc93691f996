//! The blocking HTTP/1.1 client of the tests over plain `std::net::TcpStream` (and unix sockets):
//! one request per connection ([`http_request`], [`http_request_unix`]) or several on one
//! keep-alive connection ([`KeepAlive`]). Errors are [`Failed`] (a message), so a case or a
//! `#[test]` can use `?` or `unwrap`.
//!
//! With `master_process on` and several workers, every new connection can land on any worker; all
//! requests on one [`KeepAlive`] connection are served by the same worker. Cases that observe
//! per-worker state (round-robin cursors, blacklists, failed peers) send their requests over one
//! [`KeepAlive`] connection for that reason.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::{check, Failed};

/// How long a request waits for the answer (each read), unless it says otherwise.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

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

    /// Every header with this name (case-insensitive), in order: e.g. all `Set-Cookie` values.
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn is_chunked(&self) -> bool {
        self.header("Transfer-Encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    }
}

/// Sends a `GET` to 127.0.0.1:`port` (see [`http_request`]).
pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Response, Failed> {
    http_request(port, "GET", path, headers, b"")
}

/// Sends one HTTP/1.1 request with `Connection: close` and any method, headers and body to
/// 127.0.0.1:`port` and reads the whole answer (a chunked body is decoded). A `Content-Length`
/// is added when the body is not empty and for every `POST` (unless `headers` has one);
/// `Host: localhost` unless `headers` has a `Host`. Reads wait at most [`READ_TIMEOUT`].
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, Failed> {
    http_request_within(port, method, path, headers, body, READ_TIMEOUT)
}

/// [`http_request`] with another read timeout than [`READ_TIMEOUT`] (for an answer the server
/// holds on purpose, or one that takes long).
pub fn http_request_within(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    read_timeout: Duration,
) -> Result<Response, Failed> {
    exchange(
        connect(port, read_timeout)?,
        method,
        path,
        headers,
        body,
        &port.to_string(),
    )
}

/// [`http_request`] over the unix socket at `path` (an nginx `listen unix:PATH`).
pub fn http_request_unix(
    socket: &std::path::Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, Failed> {
    let s = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    s.set_read_timeout(Some(READ_TIMEOUT))
        .map_err(|e| e.to_string())?;
    exchange(
        s,
        method,
        path,
        headers,
        body,
        &socket.display().to_string(),
    )
}

fn exchange(
    mut s: impl Read + Write,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    peer: &str,
) -> Result<Response, Failed> {
    let mut all = vec![("Connection", "close")];
    all.extend_from_slice(headers);
    s.write_all(&request_bytes(method, path, &all, body))
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read from {peer}: {e}"))?;
    parse_response(&raw)
        .ok_or_else(|| format!("bad HTTP answer: {:?}", String::from_utf8_lossy(&raw)).into())
}

/// A keep-alive HTTP/1.1 connection to 127.0.0.1 that sends requests one after the other.
/// Every request on it is served by the same nginx worker.
pub struct KeepAlive {
    stream: BufReader<TcpStream>,
}

impl KeepAlive {
    /// Connects to 127.0.0.1:`port`.
    pub fn open(port: u16) -> Result<KeepAlive, Failed> {
        Ok(KeepAlive {
            stream: BufReader::new(connect(port, READ_TIMEOUT)?),
        })
    }

    /// Sends `GET path` and reads one answer (with a `Content-Length` or a chunked body).
    pub fn get(&mut self, path: &str) -> Result<Response, Failed> {
        self.request("GET", path, &[], b"")
    }

    /// Sends `GET path` with extra request headers and reads one answer.
    pub fn get_with(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Response, Failed> {
        self.request("GET", path, headers, b"")
    }

    /// Sends any request and reads one answer. A `HEAD` answer has no body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, Failed> {
        self.stream
            .get_mut()
            .write_all(&request_bytes(method, path, headers, body))
            .map_err(|e| format!("send: {e}"))?;
        let mut head = String::new();
        loop {
            let line = self.line()?;
            if line.is_empty() {
                break;
            }
            head.push_str(&line);
            head.push_str("\r\n");
        }
        let (status, headers) = parse_head(head.trim_end_matches("\r\n"))
            .ok_or_else(|| format!("bad status line in {head:?}"))?;
        let mut r = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if method == "HEAD" {
            return Ok(r);
        }
        if r.is_chunked() {
            r.body = self.chunked_body()?;
            return Ok(r);
        }
        let len: usize = r
            .header("Content-Length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("neither Content-Length nor chunked in {head:?}"))?;
        r.body = vec![0u8; len];
        self.stream
            .read_exact(&mut r.body)
            .map_err(|e| format!("read body: {e}"))?;
        Ok(r)
    }

    /// One line without its CRLF; an error when the connection closes first.
    fn line(&mut self) -> Result<String, Failed> {
        let mut raw = Vec::new();
        let n = self
            .stream
            .read_until(b'\n', &mut raw)
            .map_err(|e| format!("read: {e}"))?;
        check(n > 0 && raw.ends_with(b"\n"), || {
            format!("connection closed after {raw:?}")
        })?;
        let text = String::from_utf8_lossy(&raw);
        Ok(text.trim_end_matches(['\r', '\n']).to_string())
    }

    fn chunked_body(&mut self) -> Result<Vec<u8>, Failed> {
        let mut out = Vec::new();
        loop {
            let line = self.line()?;
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| format!("bad chunk size line {line:?}"))?;
            if size == 0 {
                // trailers, then the empty line
                while !self.line()?.is_empty() {}
                return Ok(out);
            }
            let start = out.len();
            out.resize(start + size + 2, 0);
            self.stream
                .read_exact(&mut out[start..])
                .map_err(|e| format!("read chunk: {e}"))?;
            check(out.ends_with(b"\r\n"), || "chunk without CRLF".to_string())?;
            out.truncate(start + size);
        }
    }
}

fn connect(port: u16, read_timeout: Duration) -> Result<TcpStream, Failed> {
    let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect {port}: {e}"))?;
    s.set_read_timeout(Some(read_timeout))
        .map_err(|e| e.to_string())?;
    Ok(s)
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("Host")) {
        req.push_str("Host: localhost\r\n");
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    let has_length = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("Content-Length"));
    if !has_length && (!body.is_empty() || method == "POST") {
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

pub(crate) fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let (status, headers) = parse_head(std::str::from_utf8(&raw[..end]).ok()?)?;
    let mut r = Response {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    };
    if r.is_chunked() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn parse_response_reads_status_headers_body() {
        let r =
            parse_response(b"HTTP/1.1 502 Bad Gateway\r\nX-A: 1\r\nSet-Cookie: rt=2\r\n\r\nbody")
                .unwrap();
        assert_eq!(r.status, 502);
        assert_eq!(r.header("set-cookie"), Some("rt=2"));
        assert_eq!(r.header("X-Missing"), None);
        assert_eq!(r.headers_named("SET-COOKIE"), ["rt=2"]);
        assert!(r.headers_named("X-Missing").is_empty());
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

    /// A keep-alive connection reads a Content-Length answer, then a chunked one, from one stream.
    #[test]
    fn keep_alive_reads_length_and_chunked_answers_in_a_row() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let answers: [&[u8]; 2] = [
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n\
                  2\r\nde\r\n1;e=1\r\nf\r\n0\r\nT: 1\r\n\r\n",
            ];
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            for (i, answer) in answers.iter().enumerate() {
                while seen.windows(4).filter(|w| w == b"\r\n\r\n").count() <= i {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0);
                    seen.extend_from_slice(&buf[..n]);
                }
                s.write_all(answer).unwrap();
            }
        });
        let mut k = KeepAlive::open(port).unwrap();
        let a = k.get("/a").unwrap();
        let b = k.get_with("/b", &[("X-T", "1")]).unwrap();
        server.join().unwrap();
        assert_eq!((a.status, a.text().as_str()), (200, "abc"));
        assert_eq!((b.status, b.text().as_str()), (503, "def"));
    }

    /// A caller's own `Content-Length` (the fakes' daemon client sends one on every request) is
    /// sent once, and `http_request_within` waits longer than the default for a held answer.
    #[test]
    fn own_content_length_is_sent_once_and_a_held_answer_is_awaited() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.ends_with(b"{}") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                seen.extend_from_slice(&buf[..n]);
            }
            std::thread::sleep(Duration::from_millis(300));
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .unwrap();
            String::from_utf8(seen).unwrap()
        });
        let r = http_request_within(
            port,
            "PUT",
            "/x",
            &[("Content-Length", "2")],
            b"{}",
            Duration::from_secs(5),
        )
        .unwrap();
        let sent = server.join().unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
        let lengths = sent
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
            .count();
        assert_eq!(lengths, 1, "{sent:?}");
    }
}
