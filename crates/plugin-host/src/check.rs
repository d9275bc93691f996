//! Conformance checker: exercises a plugin folder with the protocol's edge cases.
//!
//! [`check_plugin`] validates the manifest, starts the executable and talks to it directly (not
//! through [`crate::PluginHost`], which would refuse some of the edge cases before the plugin sees
//! them). A valid resolve needs a working backend, which the checker cannot know: it reads a sample
//! from `conformance.json` in the plugin folder (see [`Sample`]) or from [`CheckOptions::sample`];
//! without one, the checks that need it are skipped, not failed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tributary_protocol::{
    ConfigMap, FieldType, Id, Manifest, Request, Response, ResponsePayload, RpcError, ERR_CONFIG,
    ERR_METHOD_NOT_FOUND, ERR_PARSE, RESOLVE_METHOD,
};

use crate::lines::{read_line, Line};
use crate::MANIFEST_FILE;

/// File in a plugin folder that gives the checker a sample resolve.
pub const SAMPLE_FILE: &str = "conformance.json";

/// A resolve that works against the plugin's backend, e.g. for `static`:
/// `{"provider":"static","config":{"targets":"127.0.0.1:8080"},"service":"demo"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    pub provider: String,
    pub config: ConfigMap,
    pub service: String,
    /// A service the provider does not know (answered with -32003, `data.field` = `"service"`).
    /// Leave it out for providers where every service resolves.
    #[serde(default)]
    pub unknown_service: Option<String>,
}

/// Options of [`check_plugin_with`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// How long the plugin may take for one answer (default 10 s).
    pub timeout: Duration,
    /// The sample; `None` reads `conformance.json` from the plugin folder when there is one.
    pub sample: Option<Sample>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            sample: None,
        }
    }
}

/// Outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// One check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Everything the checker found. `Display` prints one line per check and a summary line, each
/// ending in `\n`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub dir: PathBuf,
    /// The plugin's name, when the manifest could be read.
    pub plugin: Option<String>,
    pub checks: Vec<Check>,
}

impl CheckReport {
    /// No check failed.
    pub fn passed(&self) -> bool {
        !self
            .checks
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Fail(_)))
    }

    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Fail(_)))
            .collect()
    }

    fn push(&mut self, name: impl Into<String>, outcome: Outcome) {
        self.checks.push(Check {
            name: name.into(),
            outcome,
        });
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plugin {} ({})",
            self.plugin.as_deref().unwrap_or("?"),
            self.dir.display()
        )?;
        let (mut pass, mut fail, mut skip) = (0, 0, 0);
        for c in &self.checks {
            match &c.outcome {
                Outcome::Pass => {
                    pass += 1;
                    writeln!(f, "  PASS  {}", c.name)?
                }
                Outcome::Fail(d) => {
                    fail += 1;
                    writeln!(f, "  FAIL  {}: {d}", c.name)?
                }
                Outcome::Skip(d) => {
                    skip += 1;
                    writeln!(f, "  SKIP  {}: {d}", c.name)?
                }
            }
        }
        let verdict = if fail == 0 {
            "conforms"
        } else {
            "does NOT conform"
        };
        writeln!(
            f,
            "{verdict}: {pass} of {} checks passed, {fail} failing, {skip} skipped",
            pass + fail + skip
        )
    }
}

/// [`check_plugin_with`] with default options.
pub async fn check_plugin(dir: &Path) -> CheckReport {
    check_plugin_with(dir, &CheckOptions::default()).await
}

/// Checks the plugin in `dir`. Needs a tokio runtime; starts the plugin once and stops it at the end.
pub async fn check_plugin_with(dir: &Path, opts: &CheckOptions) -> CheckReport {
    let mut report = CheckReport {
        dir: dir.to_path_buf(),
        plugin: None,
        checks: Vec::new(),
    };
    let manifest = match load_manifest(dir) {
        Ok(m) => m,
        Err(e) => {
            report.push("manifest", Outcome::Fail(e));
            return report;
        }
    };
    report.plugin = Some(manifest.name.clone());
    let exe = match crate::executable_path(dir, &manifest) {
        Ok(p) => p,
        Err(e) => {
            report.push("manifest", Outcome::Fail(e.to_string()));
            return report;
        }
    };
    report.push("manifest", Outcome::Pass);

    let sample = match &opts.sample {
        Some(s) => Some(s.clone()),
        None => match read_sample(dir) {
            Ok(s) => s,
            Err(e) => {
                report.push("sample", Outcome::Fail(e));
                None
            }
        },
    };

    let mut s = match Session::start(&exe, dir, &manifest.environment, opts.timeout).await {
        Ok(s) => s,
        Err(e) => {
            report.push("starts and stays up", Outcome::Fail(e));
            return report;
        }
    };
    report.push("starts and stays up", Outcome::Pass);

    // Unknown method.
    let out = s
        .call("tributary.no_such_method", json!({}))
        .await
        .and_then(|r| expect_error(r, ERR_METHOD_NOT_FOUND, None));
    report.push("unknown method answers -32601", outcome(out));

    // Unknown provider.
    let params = json!({"provider":"tributary-no-such-provider","config":{},"service":"x"});
    let out = s
        .call(RESOLVE_METHOD, params)
        .await
        .and_then(|r| expect_error(r, ERR_CONFIG, Some("provider")));
    report.push(
        "unknown provider answers -32003 field \"provider\"",
        outcome(out),
    );

    // Missing required field, per provider.
    let mut any_required = false;
    for p in manifest.providers() {
        for f in p.configuration.fields.iter().filter(|f| f.required) {
            any_required = true;
            let mut config = match &sample {
                Some(sm) if sm.provider == p.code => sm.config.clone(),
                _ => placeholders(p),
            };
            config.remove(&f.key);
            let service = sample
                .as_ref()
                .filter(|sm| sm.provider == p.code)
                .map_or("conformance", |sm| sm.service.as_str());
            let params = json!({"provider": p.code, "config": config, "service": service});
            let out = s
                .call(RESOLVE_METHOD, params)
                .await
                .and_then(|r| expect_error(r, ERR_CONFIG, Some(&f.key)));
            report.push(
                format!(
                    "provider {:?}: missing required field {:?} answers -32003 with that field",
                    p.code, f.key
                ),
                outcome(out),
            );
        }
    }
    if !any_required {
        report.push(
            "missing required field",
            Outcome::Skip("no provider declares a required field".into()),
        );
    }

    // Valid resolve and unknown service.
    match &sample {
        Some(sm) => {
            let out = s
                .call(RESOLVE_METHOD, sample_params(sm, &sm.service))
                .await
                .and_then(expect_result);
            report.push("valid resolve answers targets", outcome(out));
            match &sm.unknown_service {
                Some(svc) => {
                    let out = s
                        .call(RESOLVE_METHOD, sample_params(sm, svc))
                        .await
                        .and_then(|r| expect_error(r, ERR_CONFIG, Some("service")));
                    report.push(
                        "unknown service answers -32003 field \"service\"",
                        outcome(out),
                    );
                }
                None => report.push(
                    "unknown service",
                    Outcome::Skip("the sample has no `unknown_service`".into()),
                ),
            }
        }
        None => {
            let why = format!("no sample ({SAMPLE_FILE} in the plugin folder)");
            report.push("valid resolve", Outcome::Skip(why.clone()));
            report.push("unknown service", Outcome::Skip(why));
        }
    }

    // Concurrent requests: written at once, answers matched by id.
    let out = concurrent(&mut s, sample.as_ref()).await;
    report.push("concurrent requests are answered by id", outcome(out));

    // An invalid line: -32700 with a null id, and the plugin goes on answering.
    let out = invalid_line(&mut s).await;
    report.push(
        "invalid JSON line answers -32700 and the plugin goes on",
        outcome(out),
    );

    // End of input: the plugin exits.
    let out = s.close().await;
    report.push("exits when stdin closes", outcome(out));
    report
}

fn outcome(r: Result<(), String>) -> Outcome {
    match r {
        Ok(()) => Outcome::Pass,
        Err(e) => Outcome::Fail(e),
    }
}

fn load_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Manifest::parse(&text).map_err(|e| e.to_string())
}

fn read_sample(dir: &Path) -> Result<Option<Sample>, String> {
    let path = dir.join(SAMPLE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t)
            .map(Some)
            .map_err(|e| format!("{} is invalid: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn sample_params(sm: &Sample, service: &str) -> Value {
    json!({"provider": sm.provider, "config": sm.config, "service": service})
}

fn placeholders(p: &tributary_protocol::ProviderDecl) -> ConfigMap {
    p.configuration
        .fields
        .iter()
        .map(|f| {
            let v = f
                .default
                .clone()
                .filter(|d| !d.is_null())
                .unwrap_or(match f.field_type {
                    FieldType::String => json!("conformance-placeholder"),
                    FieldType::Bool => json!(false),
                    FieldType::Number => json!(0),
                });
            (f.key.clone(), v)
        })
        .collect()
}

fn expect_error(r: Response, code: i64, field: Option<&str>) -> Result<(), String> {
    match r.payload {
        ResponsePayload::Result(_) => Err(format!("answered a result, expected error {code}")),
        ResponsePayload::Error(e) if e.code != code => {
            Err(format!("answered error code {}, expected {code}", e.code))
        }
        ResponsePayload::Error(e) => match field {
            Some(want) if e.field() != Some(want) => Err(format!(
                "answered data.field {:?}, expected {want:?}",
                e.field()
            )),
            _ => Ok(()),
        },
    }
}

fn expect_result(r: Response) -> Result<(), String> {
    let v = match r.payload {
        ResponsePayload::Error(RpcError { code, message, .. }) => {
            return Err(format!("answered error {code}: {message}"))
        }
        ResponsePayload::Result(v) => v,
    };
    let Some(targets) = v.get("targets").and_then(Value::as_array) else {
        return Err("the result has no `targets` array".into());
    };
    match v.get("ttl_seconds") {
        None => {}
        Some(t) if t.as_u64().is_some() => {}
        Some(_) => return Err("`ttl_seconds` is not a non-negative integer".into()),
    }
    for (i, t) in targets.iter().enumerate() {
        if !t.get("address").is_some_and(Value::is_string) {
            return Err(format!("target {i} has no string `address`"));
        }
        if !t.get("port").is_some_and(Value::is_u64) {
            return Err(format!("target {i} has no integer `port`"));
        }
    }
    Ok(())
}

async fn concurrent(s: &mut Session, sample: Option<&Sample>) -> Result<(), String> {
    const N: usize = 8;
    let mut expect_ok = std::collections::HashMap::new();
    let mut batch = Vec::new();
    for i in 0..N {
        let id = s.id();
        let valid = sample.is_some() && i % 2 == 0;
        let req = match sample {
            Some(sm) if valid => Request::new(id, RESOLVE_METHOD, sample_params(sm, &sm.service)),
            _ => Request::new(id, format!("tributary.no_such_method_{i}"), json!({})),
        };
        expect_ok.insert(id, valid);
        batch.extend(serde_json::to_vec(&req).map_err(|e| e.to_string())?);
        batch.push(b'\n');
    }
    s.write(&batch).await?;
    for _ in 0..N {
        let r = s.read_response().await?;
        let Some(Id::Num(id)) = r.id else {
            return Err(format!(
                "an answer has id {:?}, not one that was sent",
                r.id
            ));
        };
        let Some(valid) = expect_ok.remove(&id) else {
            return Err(format!("an answer has id {id}, not one in flight"));
        };
        let is_ok = matches!(r.payload, ResponsePayload::Result(_));
        if valid != is_ok {
            return Err(format!("the answer for id {id} belongs to another request"));
        }
    }
    Ok(())
}

async fn invalid_line(s: &mut Session) -> Result<(), String> {
    s.write(b"this is not json\n").await?;
    let r = s.read_response().await?;
    if r.id.is_some() {
        return Err(format!("answered with id {:?}, expected null", r.id));
    }
    expect_error(r, ERR_PARSE, None)?;
    let after = s
        .call("tributary.no_such_method", json!({}))
        .await
        .map_err(|e| format!("the plugin stopped answering after an invalid line: {e}"))?;
    expect_error(after, ERR_METHOD_NOT_FOUND, None)
}

/// A plugin process driven line by line.
struct Session {
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
    async fn start(
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

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
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

    async fn read_response(&mut self) -> Result<Response, String> {
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

    async fn call(&mut self, method: &str, params: Value) -> Result<Response, String> {
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

    async fn close(mut self) -> Result<(), String> {
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
