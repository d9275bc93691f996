//! A plugin process driven line by line, as the checker needs it (no id matching, no restart).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tributary_protocol::{Request, Response};

use crate::lines::{read_line, Line};

/// A plugin process driven line by line.
pub(super) struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    timeout: Duration,
    next_id: u64,
    /// The plugin's private HOME for the check (removed afterwards).
    _home: tempfile::TempDir,
}

impl Session {
    /// Starts the plugin as the host does: in its folder, with the clean environment and the
    /// variables its manifest declares, `HOME` a private temporary folder.
    pub(super) async fn start(
        exe: &Path,
        dir: &Path,
        environment: &[String],
        timeout: Duration,
    ) -> Result<Session, String> {
        let home = tempfile::Builder::new()
            .prefix("tributary-check-home-")
            .tempdir()
            .map_err(|e| format!("cannot create a home folder for the plugin: {e}"))?;
        let env = crate::load::plugin_environment(environment, std::env::vars_os());
        let mut child = Command::new(exe)
            .current_dir(dir)
            .env_clear()
            .envs(env)
            .env("HOME", home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let stdin = child.stdin.take();
        let out = child.stdout.take().map(BufReader::new);
        let Some(out) = out else {
            return Err("no stdout pipe".into());
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited at once ({status})"));
        }
        Ok(Session {
            child,
            stdin,
            out,
            timeout,
            next_id: 1,
            _home: home,
        })
    }

    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin is closed")?;
        stdin
            .write_all(bytes)
            .await
            .map_err(|e| format!("cannot write to the plugin: {e}"))?;
        stdin
            .flush()
            .await
            .map_err(|e| format!("cannot write to the plugin: {e}"))
    }

    pub(super) async fn read_response(&mut self) -> Result<Response, String> {
        let limit = crate::HostOptions::default().max_line;
        let line = tokio::time::timeout(self.timeout, read_line(&mut self.out, limit))
            .await
            .map_err(|_| format!("no answer within {}s", self.timeout.as_secs_f32()))?
            .map_err(|e| format!("cannot read from the plugin: {e}"))?;
        match line {
            Line::Complete(l) => serde_json::from_slice(&l)
                .map_err(|e| format!("the answer is not a JSON-RPC 2.0 response: {e}")),
            Line::TooLong { len, .. } => Err(format!("the answer line is {len} bytes, over 4 MiB")),
            Line::Eof => Err("the plugin closed stdout (exited?)".into()),
        }
    }

    pub(super) async fn call(&mut self, method: &str, params: Value) -> Result<Response, String> {
        let req = Request::new(self.id(), method, params);
        let mut line = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.write(&line).await?;
        let r = self.read_response().await?;
        if r.id != Some(req.id.clone()) {
            return Err(format!("answered id {:?}, expected {}", r.id, req.id));
        }
        Ok(r)
    }

    pub(super) async fn close(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("cannot wait for the plugin: {e}")),
            Err(_) => {
                let _ = self.child.kill().await;
                Err("still running 5 s after stdin closed (killed)".into())
            }
        }
    }
}
