//! A tiny HTTP/1.1 server (plain or TLS) on 127.0.0.1 for the fakes. It runs on its own tokio
//! runtime (so sync and async tests can use it alike), can be stopped (connection refused) and
//! started again on the same port, and hands each request to a handler closure.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// One request as the handler sees it.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    /// The raw query string (without `?`), as sent.
    pub raw_query: String,
    /// Decoded query pairs; a bare key (`?passing`) has an empty value.
    pub query: Vec<(String, String)>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    /// The first value of query parameter `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of query parameter `key`.
    pub fn params(&self, key: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The handler's answer.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Wait this long before answering (to simulate a registry that times out).
    pub delay: Option<Duration>,
}

impl Resp {
    /// A JSON answer.
    pub fn json(status: u16, value: &serde_json::Value) -> Resp {
        Resp {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: value.to_string().into_bytes(),
            delay: None,
        }
    }

    /// A plain-text answer.
    pub fn text(status: u16, text: &str) -> Resp {
        Resp {
            status,
            headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
            body: text.as_bytes().to_vec(),
            delay: None,
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: &str) -> Resp {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// The request handler of a server.
pub type Handler = Arc<dyn Fn(Req) -> Resp + Send + Sync>;

struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// A server on `127.0.0.1:port`, running until [`HttpServer::stop`] or drop.
pub struct HttpServer {
    rt: Option<tokio::runtime::Runtime>,
    port: u16,
    tls: Option<Arc<ServerConfig>>,
    handler: Handler,
    running: Mutex<Option<Running>>,
}

impl HttpServer {
    /// Starts a server on a free port; `tls` makes it HTTPS.
    pub fn start(handler: Handler, tls: Option<Arc<ServerConfig>>) -> HttpServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("fake server runtime");
        let listener =
            block_on(&rt, TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let server = HttpServer {
            rt: Some(rt),
            port,
            tls,
            handler,
            running: Mutex::new(None),
        };
        server.run(listener);
        server
    }

    /// The port it listens on (kept across stop/resume).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime")
    }

    fn run(&self, listener: TcpListener) {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let handler = self.handler.clone();
        let acceptor = self.tls.clone().map(TlsAcceptor::from);
        let task = self.rt().spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let handler = handler.clone();
                        let acceptor = acceptor.clone();
                        conns.spawn(async move {
                            match acceptor {
                                Some(a) => {
                                    if let Ok(tls) = a.accept(stream).await {
                                        serve_conn(TokioIo::new(tls), handler).await;
                                    }
                                }
                                None => serve_conn(TokioIo::new(stream), handler).await,
                            }
                        });
                    }
                }
                while conns.try_join_next().is_some() {}
            }
            // Dropping the listener and aborting the connections: the registry is gone.
            drop(listener);
            conns.abort_all();
            while conns.join_next().await.is_some() {}
        });
        *self.running.lock().unwrap() = Some(Running { stop, task });
    }

    /// Stops listening and drops every open connection: clients get "connection refused".
    pub fn stop(&self) {
        let running = self.running.lock().unwrap().take();
        if let Some(r) = running {
            let _ = r.stop.send(true);
            let _ = block_on(self.rt(), r.task);
        }
    }

    /// Listens again on the same port after [`HttpServer::stop`].
    pub fn resume(&self) {
        if self.running.lock().unwrap().is_some() {
            return;
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut tries = 0;
        let listener = loop {
            match block_on(self.rt(), TcpListener::bind(addr)) {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("cannot listen on {addr} again: {e}"),
            }
        };
        self.run(listener);
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(r) = self.running.lock().unwrap().take() {
            let _ = r.stop.send(true);
            r.task.abort();
        }
        if let Some(rt) = self.rt.take() {
            // Not a blocking shutdown: the server may be dropped inside an async test.
            rt.shutdown_background();
        }
    }
}

/// Runs `f` to completion on `rt` from a helper thread, so that it also works when the caller is
/// itself inside an async runtime (a `#[tokio::test]`).
fn block_on<F>(rt: &tokio::runtime::Runtime, f: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| rt.block_on(f))
            .join()
            .expect("fake server thread")
    })
}

async fn serve_conn<I>(io: I, handler: Handler)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = service_fn(move |req: hyper::Request<Incoming>| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handle(req, handler).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, svc)
        .await;
}

async fn handle(req: hyper::Request<Incoming>, handler: Handler) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let query = url::form_urlencoded::parse(raw_query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let headers = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let r = Req {
        method: parts.method.as_str().to_string(),
        path: parts.uri.path().to_string(),
        raw_query,
        query,
        headers,
        body,
    };
    let resp = tokio::task::spawn_blocking(move || handler(r))
        .await
        .unwrap_or_else(|_| Resp::text(500, "fake handler panicked"));
    if let Some(d) = resp.delay {
        tokio::time::sleep(d).await;
    }
    let mut b = hyper::Response::builder().status(resp.status);
    for (k, v) in &resp.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    b.body(Full::new(Bytes::from(resp.body)))
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}
