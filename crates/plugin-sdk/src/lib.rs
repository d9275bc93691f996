//! Write a Tributary discovery plugin by implementing one trait.
//!
//! ```no_run
//! use tributary_plugin_sdk::{target, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError};
//!
//! struct Fixed;
//!
//! impl Plugin for Fixed {
//!     fn manifest(&self) -> Option<&str> {
//!         Some(r#"{"name":"fixed","version":"1.0.0","executable":"fixed",
//!                  "capabilities":["upstream.discovery"],"permissions":["network"],
//!                  "discovery":{"providers":[{"code":"fixed","name":"Fixed","configuration":
//!                  {"fields":[{"key":"host","display_name":"Host","required":true}]}}]}}"#)
//!     }
//!
//!     async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
//!         let host = params.config.required_str("host")?;
//!         Ok(ResolveResult { targets: vec![target(host, 80, None)], ttl_seconds: 0 })
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     tributary_plugin_sdk::run(Fixed)
//! }
//! ```
//!
//! [`run`] serves the protocol on stdin/stdout (one JSON-RPC 2.0 message per line): it answers
//! `discovery.resolve` by calling [`Plugin::resolve`], concurrently, each answer carrying its
//! request's `id`; unknown methods get -32601, unreadable lines -32700 (id `null`), bad params
//! -32602, a panic in `resolve` -32603. With [`Plugin::manifest`], an unknown provider, a missing
//! required field or a field of the wrong type is answered -32003 with `data.field` before `resolve`
//! is called. The plugin exits when stdin closes, after answering the requests in flight.
//!
//! Write logs to stderr (the host keeps the last lines, redacted); never to stdout. Never put config
//! values in error messages: the host redacts whole values, not pieces of them.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

pub use tributary_protocol as protocol;
pub use tributary_protocol::{
    ConfigMap, FieldType, Id, Manifest, ProviderDecl, Request, ResolveParams, ResolveResult,
    Response, RpcError, ERR_CONFIG, ERR_PROVIDER, RESOLVE_METHOD,
};

/// Longest request line accepted (bytes, without `\n`).
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// A discovery plugin.
pub trait Plugin: Send + Sync + 'static {
    /// The plugin's `plugin.json` text (typically `include_str!("../plugin.json")`). When given, the
    /// SDK checks provider, required fields and field types itself before calling
    /// [`Plugin::resolve`]. An invalid manifest stops [`run`] at start with a message.
    fn manifest(&self) -> Option<&str> {
        None
    }

    /// Resolves `params.service` into its current servers. Answer
    /// [`RpcError::config`] (-32003, with the config key at fault or `"service"`) for causes in the
    /// configuration and [`RpcError::provider`] (-32000) otherwise.
    fn resolve(
        &self,
        params: ResolveParams,
    ) -> impl Future<Output = Result<ResolveResult, RpcError>> + Send;
}

/// A target as the protocol wants it: `{"address", "port", "weight"?}`.
pub fn target(address: impl Into<String>, port: u16, weight: Option<u16>) -> Value {
    let mut t = json!({"address": address.into(), "port": port});
    if let Some(w) = weight {
        t["weight"] = json!(w);
    }
    t
}

/// A server written as text, `address:port[:weight]` (IPv6 as `[addr]:port[:weight]`), split into
/// its pieces as written. Checking the address and the weight is the plugin's; [`parse_port`] reads
/// the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetText<'a> {
    pub address: &'a str,
    pub port: &'a str,
    pub weight: Option<&'a str>,
}

/// Splits `address:port[:weight]` (IPv6 as `[addr]:port[:weight]`). The error says what is wrong
/// without quoting the text (config values are secret).
pub fn split_target(entry: &str) -> Result<TargetText<'_>, &'static str> {
    let (address, rest) = if let Some(after) = entry.strip_prefix('[') {
        let (addr, rest) = after
            .split_once(']')
            .ok_or("`[` without `]` (IPv6 is written [addr]:port)")?;
        let rest = rest
            .strip_prefix(':')
            .ok_or("a port must follow `]:` (IPv6 is written [addr]:port)")?;
        (addr, rest)
    } else {
        let (addr, rest) = entry
            .split_once(':')
            .ok_or("expected address:port[:weight]")?;
        if rest.split(':').count() > 2 {
            return Err("too many `:` (write IPv6 as [addr]:port[:weight])");
        }
        (addr, rest)
    };
    let (port, weight) = match rest.split_once(':') {
        Some((p, w)) => (p, Some(w)),
        None => (rest, None),
    };
    Ok(TargetText {
        address,
        port,
        weight,
    })
}

/// A port written as text: a number from 1 to 65535.
pub fn parse_port(text: &str) -> Result<u16, &'static str> {
    text.parse()
        .ok()
        .filter(|p| *p >= 1)
        .ok_or("port must be a number from 1 to 65535")
}

/// A weight written as text, for plugins where `0` means "no weight" (nginx's default, 1): `0` to
/// `1000`, `0` giving `None`.
pub fn parse_weight(text: &str) -> Result<Option<u16>, &'static str> {
    text.parse::<u16>()
        .ok()
        .filter(|w| *w <= 1000)
        .map(|w| (w > 0).then_some(w))
        .ok_or("weight must be a number from 0 to 1000 (0 means 1)")
}

/// [`parse_weight`] for a JSON `weight` member: absent or `null` is `None`; else a whole number from
/// `0` to `1000`, `0` giving `None`.
pub fn weight_value(v: Option<&Value>) -> Result<Option<u16>, &'static str> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(w) => w
            .as_u64()
            .filter(|w| *w <= 1000)
            .map(|w| (w > 0).then_some(w as u16))
            .ok_or("weight must be a whole number from 0 to 1000 (0 means 1)"),
    }
}

/// The innermost cause under `e` (its last `source()`), as text; `"unknown error"` when it has
/// none. For HTTP clients whose own message carries the URL (which may hold config values).
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e.source();
    let mut last = None;
    while let Some(s) = cur {
        last = Some(s);
        cur = s.source();
    }
    last.map_or_else(|| "unknown error".to_string(), ToString::to_string)
}

/// Typed access to config fields, failing with -32003 and the field's key. Messages never quote
/// the value.
pub trait ConfigExt {
    /// A string that must be set and not empty.
    fn required_str(&self, key: &str) -> Result<&str, RpcError>;
    /// A string that may be absent (`None` also for `null` and `""`).
    fn optional_str(&self, key: &str) -> Result<Option<&str>, RpcError>;
    /// A bool, `default` when absent or `null`.
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, RpcError>;
    /// A number, `None` when absent or `null`.
    fn number(&self, key: &str) -> Result<Option<f64>, RpcError>;
}

impl ConfigExt for ConfigMap {
    fn required_str(&self, key: &str) -> Result<&str, RpcError> {
        match self.optional_str(key)? {
            Some(s) => Ok(s),
            None => Err(RpcError::config(
                key,
                format!("missing required field {key:?}"),
            )),
        }
    }

    fn optional_str(&self, key: &str) -> Result<Option<&str>, RpcError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(RpcError::config(
                key,
                format!("field {key:?} must be a string"),
            )),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, RpcError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(RpcError::config(
                key,
                format!("field {key:?} must be a bool"),
            )),
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, RpcError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(_) => Err(RpcError::config(
                key,
                format!("field {key:?} must be a number"),
            )),
        }
    }
}

/// Checks `params` against the manifest: provider known, required fields set, types right.
pub fn check_params(manifest: &Manifest, params: &ResolveParams) -> Result<(), RpcError> {
    let Some(provider) = manifest.provider(&params.provider) else {
        return Err(RpcError::config(
            "provider",
            format!("unknown provider {:?}", params.provider),
        ));
    };
    for f in &provider.configuration.fields {
        let v = params.config.get(&f.key);
        let unset = matches!(v, None | Some(Value::Null))
            || v.and_then(Value::as_str).is_some_and(str::is_empty);
        if unset {
            if f.required {
                return Err(RpcError::config(
                    &f.key,
                    format!("missing required field {:?}", f.key),
                ));
            }
            continue;
        }
        if let Some(v) = v {
            if !f.field_type.accepts(v) {
                return Err(RpcError::config(
                    &f.key,
                    format!("field {:?} must be a {}", f.key, f.field_type.as_str()),
                ));
            }
        }
    }
    Ok(())
}

/// Calls `plugin` in-process the way [`serve`] would for one request (manifest checks first, then
/// [`Plugin::resolve`]): for plugins' unit tests, without a process or stdio.
pub async fn call<P: Plugin>(plugin: &P, params: ResolveParams) -> Result<ResolveResult, RpcError> {
    if let Some(text) = plugin.manifest() {
        let manifest = Manifest::parse(text).map_err(|e| {
            RpcError::new(
                tributary_protocol::ERR_INTERNAL,
                format!("the plugin's own manifest is invalid: {e}"),
            )
        })?;
        check_params(&manifest, &params)?;
    }
    plugin.resolve(params).await
}

/// Serves the protocol on this process's stdin/stdout until stdin closes. Use it as the body of
/// `main`; the exit code is 1 when the manifest is invalid or stdout fails.
pub fn run<P: Plugin>(plugin: P) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = rt.block_on(async {
        match stdio_pipes() {
            // Pipes (how the host starts a plugin): registered with the event loop directly, no
            // blocking-thread hop per read and write.
            Some((input, output)) => serve(plugin, input, output).await,
            None => serve(plugin, tokio::io::stdin(), tokio::io::stdout()).await,
        }
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Stdin and stdout as non-blocking pipes, when both are pipes (else `None`, leaving both as they
/// are).
fn stdio_pipes() -> Option<(
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Sender,
)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let input = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned().ok()?);
    let output = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().ok()?);
    let is_fifo = |f: &std::fs::File| f.metadata().is_ok_and(|m| m.file_type().is_fifo());
    if !is_fifo(&input) || !is_fifo(&output) {
        return None;
    }
    let input = tokio::net::unix::pipe::Receiver::from_file(input).ok()?;
    let output = tokio::net::unix::pipe::Sender::from_file(output).ok()?;
    Some((input, output))
}

/// Errors that stop [`serve`].
#[derive(Debug)]
pub enum ServeError {
    /// [`Plugin::manifest`] is not a valid manifest.
    Manifest(tributary_protocol::ManifestError),
    /// Reading requests or writing answers failed.
    Io(std::io::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Manifest(e) => write!(f, "the plugin's own manifest is invalid: {e}"),
            ServeError::Io(e) => write!(f, "stdio failed: {e}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// Serves the protocol on any reader/writer pair (stdin/stdout in [`run`]; in-memory pipes in tests)
/// until `input` ends and every request in flight is answered.
pub async fn serve<P, R, W>(plugin: P, input: R, output: W) -> Result<(), ServeError>
where
    P: Plugin,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let manifest = match plugin.manifest() {
        Some(text) => Some(Manifest::parse(text).map_err(ServeError::Manifest)?),
        None => None,
    };
    let plugin = Arc::new(plugin);
    let manifest = Arc::new(manifest);
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(write_lines(output, rx));
    let mut input = BufReader::with_capacity(64 * 1024, input);
    let mut tasks = tokio::task::JoinSet::new();
    let read_result = loop {
        let line = match read_request_line(&mut input).await {
            Ok(Some(line)) => line,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        while tasks.try_join_next().is_some() {}
        match line {
            Ok(bytes) => {
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match parse(&bytes, manifest.as_ref().as_ref()) {
                    Ok((id, params)) => {
                        let plugin = plugin.clone();
                        let tx = tx.clone();
                        tasks.spawn(async move {
                            let call = tokio::spawn(async move { plugin.resolve(params).await });
                            let answer = match call.await {
                                Ok(Ok(result)) => match serde_json::to_value(&result) {
                                    Ok(v) => Response::result(id, v),
                                    Err(e) => Response::error(
                                        Some(id),
                                        RpcError::new(
                                            tributary_protocol::ERR_INTERNAL,
                                            format!("cannot encode the result: {e}"),
                                        ),
                                    ),
                                },
                                Ok(Err(e)) => Response::error(Some(id), e),
                                Err(_) => Response::error(
                                    Some(id),
                                    RpcError::new(
                                        tributary_protocol::ERR_INTERNAL,
                                        "the plugin panicked while resolving",
                                    ),
                                ),
                            };
                            send(&tx, &answer);
                        });
                    }
                    Err(answer) => send(&tx, &answer),
                }
            }
            Err(len) => send(
                &tx,
                &Response::error(
                    None,
                    RpcError::new(
                        tributary_protocol::ERR_INVALID_REQUEST,
                        format!("request line of {len} bytes is over the limit of {MAX_LINE}"),
                    ),
                ),
            ),
        }
    };
    while tasks.join_next().await.is_some() {}
    drop(tx);
    let write_result = writer.await.unwrap_or(Ok(()));
    read_result.map_err(ServeError::Io)?;
    write_result.map_err(ServeError::Io)
}

fn send(tx: &mpsc::UnboundedSender<Vec<u8>>, answer: &Response) {
    if let Ok(mut line) = serde_json::to_vec(answer) {
        line.push(b'\n');
        let _ = tx.send(line);
    }
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut out: W,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) -> std::io::Result<()> {
    while let Some(line) = rx.recv().await {
        out.write_all(&line).await?;
        // Write whatever else is ready before flushing once.
        while let Ok(more) = rx.try_recv() {
            out.write_all(&more).await?;
        }
        out.flush().await?;
    }
    out.flush().await
}

/// One request line: `Ok(Some(Ok(bytes)))`, `Ok(Some(Err(len)))` for a line over [`MAX_LINE`]
/// (read and thrown away), `Ok(None)` at the end.
async fn read_request_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<Result<Vec<u8>, usize>>> {
    let mut buf = Vec::new();
    let mut len = 0usize;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(match len {
                0 => None,
                n if n > MAX_LINE => Some(Err(n)),
                _ => Some(Ok(buf)),
            });
        }
        let (chunk, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        if len + chunk.len() <= MAX_LINE {
            buf.extend_from_slice(chunk);
        } else {
            buf.clear();
        }
        len += chunk.len();
        r.consume(used);
        if done {
            return Ok(Some(if len > MAX_LINE { Err(len) } else { Ok(buf) }));
        }
    }
}

/// Turns a request line into a call, or into the error answer for it.
fn parse(line: &[u8], manifest: Option<&Manifest>) -> Result<(Id, ResolveParams), Response> {
    let value: Value = serde_json::from_slice(line).map_err(|_| {
        Response::error(
            None,
            RpcError::new(
                tributary_protocol::ERR_PARSE,
                "the request line is not valid JSON",
            ),
        )
    })?;
    let raw_id = value
        .get("id")
        .and_then(|v| serde_json::from_value::<Id>(v.clone()).ok());
    let req: Request = serde_json::from_value(value).map_err(|e| {
        Response::error(
            raw_id.clone(),
            RpcError::new(
                tributary_protocol::ERR_INVALID_REQUEST,
                format!("not a JSON-RPC 2.0 request: {e}"),
            ),
        )
    })?;
    if req.method != RESOLVE_METHOD {
        return Err(Response::error(
            Some(req.id),
            RpcError::new(
                tributary_protocol::ERR_METHOD_NOT_FOUND,
                format!("unknown method {:?}", req.method),
            ),
        ));
    }
    let params: ResolveParams = match serde_json::from_value(req.params) {
        Ok(p) => p,
        Err(e) => {
            return Err(Response::error(
                Some(req.id),
                RpcError::new(
                    tributary_protocol::ERR_INVALID_PARAMS,
                    format!("invalid discovery.resolve params: {e}"),
                ),
            ))
        }
    };
    if let Some(m) = manifest {
        check_params(m, &params).map_err(|e| Response::error(Some(req.id.clone()), e))?;
    }
    Ok((req.id, params))
}
