//! The protocol loop: requests read line by line from stdin, answered concurrently on stdout.

use std::process::ExitCode;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::{
    check_params, Id, Manifest, Plugin, Request, ResolveParams, Response, RpcError, MAX_LINE,
    RESOLVE_METHOD,
};

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
