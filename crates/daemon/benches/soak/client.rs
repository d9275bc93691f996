//! The soak's HTTP/1.1 client: one request on a stream it is given (TCP to nginx, keep-alive or not;
//! the module's API on its unix socket; the daemon's API), with every failure kept as a value that
//! says at which stage it happened and how many bytes of the answer had come, so each client error
//! can be classified afterwards.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Where a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Send,
    /// Before the end of the answer's header (no status yet when `bytes == 0`).
    Head,
    Body,
}

/// A failed request: the stage, the I/O error's text, the answer bytes received before it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub stage: Stage,
    pub error: String,
    pub bytes: u64,
    /// The peer closed or reset the connection (EOF, `ECONNRESET`, `EPIPE`): what a killed or
    /// closing worker does, unlike a timeout or a refused connection.
    pub closed: bool,
}

impl Failure {
    fn new(stage: Stage, e: &io::Error, bytes: u64) -> Failure {
        use io::ErrorKind::*;
        Failure {
            stage,
            error: format!("{:?}: {e}", e.kind()),
            bytes,
            closed: matches!(
                e.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            ),
        }
    }
}

/// An answer read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// `X-Worker` (the nginx worker's pid the front server adds), when present.
    pub worker: Option<u32>,
    pub body: Vec<u8>,
    /// The server said `Connection: close` (or answered HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// What a request got: its answer or where it broke. `head` is called once the header is read,
/// before the body (a long stream reports its worker as soon as it is known).
pub fn request<S: Read + Write>(
    stream: &mut BufReader<S>,
    method: &str,
    path: &str,
    extra_headers: &str,
    body: &str,
    mut head: impl FnMut(u16, Option<u32>),
) -> Result<Answer, Failure> {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra_headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .get_mut()
        .write_all(req.as_bytes())
        .map_err(|e| Failure::new(Stage::Send, &e, 0))?;
    let mut got: u64 = 0;
    let mut line = String::new();
    let mut status = None;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut close = false;
    let mut worker = None;
    loop {
        line.clear();
        let n = stream
            .read_line(&mut line)
            .map_err(|e| Failure::new(Stage::Head, &e, got))?;
        if n == 0 {
            let e = io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed");
            return Err(Failure::new(Stage::Head, &e, got));
        }
        got += n as u64;
        let l = line.trim_end();
        if status.is_none() {
            let mut parts = l.split_whitespace();
            let version = parts.next().unwrap_or("");
            status = parts.next().and_then(|s| s.parse::<u16>().ok());
            if status.is_none() {
                let e = io::Error::new(io::ErrorKind::InvalidData, format!("status line {l:?}"));
                return Err(Failure::new(Stage::Head, &e, got));
            }
            close = version == "HTTP/1.0";
            continue;
        }
        if l.is_empty() {
            break;
        }
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => length = v.parse().ok(),
            "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
            "connection" => close = v.eq_ignore_ascii_case("close"),
            "x-worker" => worker = v.parse().ok(),
            _ => {}
        }
    }
    let status = status.unwrap_or(0);
    head(status, worker);
    let mut body = Vec::new();
    let body_err = |e: io::Error, got: u64| Failure::new(Stage::Body, &e, got);
    if method == "HEAD" || status == 204 || status == 304 {
    } else if chunked {
        loop {
            line.clear();
            let n = stream.read_line(&mut line).map_err(|e| body_err(e, got))?;
            if n == 0 {
                let e = io::Error::new(io::ErrorKind::UnexpectedEof, "closed in a chunk size");
                return Err(body_err(e, got));
            }
            got += n as u64;
            let size = u64::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| {
                    body_err(
                        io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"),
                        got,
                    )
                })?;
            let mut chunk = vec![0u8; size as usize + 2];
            stream
                .read_exact(&mut chunk)
                .map_err(|e| body_err(e, got))?;
            got += chunk.len() as u64;
            if size == 0 {
                break;
            }
            chunk.truncate(size as usize);
            body.extend_from_slice(&chunk);
        }
    } else if let Some(len) = length {
        let mut buf = [0u8; 16 * 1024];
        while (body.len() as u64) < len {
            let want = ((len - body.len() as u64) as usize).min(buf.len());
            let n = stream
                .read(&mut buf[..want])
                .map_err(|e| body_err(e, got))?;
            if n == 0 {
                let e = io::Error::new(io::ErrorKind::UnexpectedEof, "closed in the body");
                return Err(body_err(e, got));
            }
            got += n as u64;
            body.extend_from_slice(&buf[..n]);
        }
    } else {
        close = true;
        stream
            .read_to_end(&mut body)
            .map_err(|e| body_err(e, got))?;
    }
    Ok(Answer {
        status,
        worker,
        body,
        close,
    })
}

/// A TCP connection to 127.0.0.1:`port` with read/write timeouts.
pub fn connect(port: u16, timeout: Duration) -> Result<BufReader<TcpStream>, Failure> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| Failure::new(Stage::Connect, &e, 0))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .and_then(|()| s.set_nodelay(true))
        .map_err(|e| Failure::new(Stage::Connect, &e, 0))?;
    Ok(BufReader::new(s))
}

/// One request with `Connection: close` to a TCP port: (status, body as text).
pub fn tcp_once(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut s = connect(port, timeout).map_err(|f| f.error)?;
    let mut headers = "Connection: close\r\nContent-Type: application/json\r\n".to_string();
    if let Some(t) = token {
        headers.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let a = request(&mut s, method, path, &headers, body, |_, _| {})
        .map_err(|f| format!("{:?}: {}", f.stage, f.error))?;
    Ok((a.status, String::from_utf8_lossy(&a.body).into_owned()))
}

/// `GET path` on a unix socket (the module's API): (status, body as text).
pub fn unix_get(sock: &Path, path: &str) -> Result<(u16, String), String> {
    let s = UnixStream::connect(sock).map_err(|e| format!("connect {}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut s = BufReader::new(s);
    let a = request(&mut s, "GET", path, "Connection: close\r\n", "", |_, _| {})
        .map_err(|f| format!("{:?}: {}", f.stage, f.error))?;
    Ok((a.status, String::from_utf8_lossy(&a.body).into_owned()))
}
