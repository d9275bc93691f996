//! The checks in their order, and what each expects of the plugin's answers.

use std::path::Path;

use serde_json::{json, Value};
use tributary_protocol::{
    ConfigMap, FieldType, Id, Manifest, Request, Response, ResponsePayload, RpcError, ERR_CONFIG,
    ERR_METHOD_NOT_FOUND, ERR_PARSE, RESOLVE_METHOD,
};

use super::session::Session;
use super::{CheckOptions, CheckReport, Outcome, Sample, SAMPLE_FILE};
use crate::MANIFEST_FILE;

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
