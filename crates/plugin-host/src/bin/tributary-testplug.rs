//! A discovery plugin that misbehaves on purpose, for the plugin host's tests. Each request's
//! `service` chooses the behaviour:
//!
//! - `ok`: one target; `sleep:MS`: answers after MS milliseconds (concurrency tests); both echo the
//!   service in the target's `service` member so a test can check which answer it got
//! - `hang`: never answers; `exit`: exits with status 3 without answering
//! - `garbage`: answers a line that is not JSON; `broken`: a cut-off JSON line that still shows its id
//! - `huge`: a valid response line of 5 MiB; `notargets`: a result without `targets`;
//!   `badresult`: `ttl_seconds` is the token's value (a string)
//! - `config-error`: -32003 with `data.field` = `token`, quoting the token's value in the message
//! - `provider-error`: -32000
//! - `stderr`: writes the token's value to stderr, then answers like `ok`; `longstderr`: the same
//!   with a 100 KiB line
//! - `env`: writes its environment as a JSON object to `$HOME/env.json` (and the home folder's
//!   mode as `home_mode`), then answers like `ok` with the object in the target's `env` member
//! - `invalid:N`: N invalid targets (address `bad address`) and one valid, `10.0.0.1:80`
//! - `noread`: stops reading stdin for an hour (its requests are never answered; a long request
//!   line written after it fills the pipe and blocks the writer)
//!
//! Only std and serde_json: it writes its own bytes, which the SDK would not let it do wrong.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

fn main() {
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(req) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if req["params"]["service"] == "noread" {
            std::thread::sleep(Duration::from_secs(3600));
        }
        let out = out.clone();
        std::thread::spawn(move || answer(req, out));
    }
}

fn write(out: &Mutex<std::io::Stdout>, text: &str) {
    let mut o = tributary_base::lock(out);
    let _ = o.write_all(text.as_bytes());
    let _ = o.write_all(b"\n");
    let _ = o.flush();
}

fn answer(req: Value, out: Arc<Mutex<std::io::Stdout>>) {
    let id = req["id"].clone();
    let service = req["params"]["service"].as_str().unwrap_or("").to_string();
    let token = req["params"]["config"]["token"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let ok = |service: &str| {
        json!({"jsonrpc":"2.0","id":id,"result":{
            "targets":[{"address":"10.0.0.1","port":80,"service":service}],"ttl_seconds":5}})
        .to_string()
    };
    match service.as_str() {
        "ok" => write(&out, &ok(&service)),
        "env" => {
            use std::os::unix::fs::PermissionsExt;
            let env: serde_json::Map<String, Value> = std::env::vars()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            let home = std::env::var("HOME").unwrap_or_default();
            let mode = std::fs::metadata(&home)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0);
            let dump = json!({"env": env, "home_mode": format!("{mode:o}")});
            let _ = std::fs::write(format!("{home}/env.json"), dump.to_string());
            write(
                &out,
                &json!({"jsonrpc":"2.0","id":id,"result":{
                    "targets":[{"address":"10.0.0.1","port":80,"env":env,
                        "home_mode":format!("{mode:o}")}]}})
                .to_string(),
            );
        }
        s if s.starts_with("invalid:") => {
            let n: usize = s["invalid:".len()..].parse().unwrap_or(0);
            let mut targets = vec![json!({"address": "bad address", "port": 80}); n];
            targets.push(json!({"address": "10.0.0.1", "port": 80}));
            write(
                &out,
                &json!({"jsonrpc":"2.0","id":id,"result":{"targets":targets}}).to_string(),
            );
        }
        s if s.starts_with("sleep:") => {
            let ms: u64 = s["sleep:".len()..].parse().unwrap_or(0);
            std::thread::sleep(Duration::from_millis(ms));
            write(&out, &ok(&service));
        }
        "hang" => std::thread::sleep(Duration::from_secs(3600)),
        "exit" => std::process::exit(3),
        "garbage" => write(&out, "this is not json"),
        "broken" => write(
            &out,
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"targets":[{{"address""#),
        ),
        "huge" => {
            let pad = "x".repeat(5 * 1024 * 1024);
            write(
                &out,
                &json!({"jsonrpc":"2.0","id":id,"result":{"targets":[],"pad":pad}}).to_string(),
            );
        }
        "badresult" => write(
            &out,
            &json!({"jsonrpc":"2.0","id":id,"result":{"targets":[],"ttl_seconds":token}})
                .to_string(),
        ),
        "notargets" => write(
            &out,
            &json!({"jsonrpc":"2.0","id":id,"result":{"ttl_seconds":5}}).to_string(),
        ),
        "config-error" => write(
            &out,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32003,
                "message":format!("token {token} was rejected"),"data":{"field":"token"}}})
            .to_string(),
        ),
        "provider-error" => write(
            &out,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32000,"message":"registry down"}})
                .to_string(),
        ),
        "longstderr" => {
            eprintln!("{token} {}", "y".repeat(100 * 1024));
            write(&out, &ok(&service));
        }
        "stderr" => {
            eprintln!("connecting with token={token} now");
            write(&out, &ok(&service));
        }
        other => write(
            &out,
            &json!({"jsonrpc":"2.0","id":id,"error":{"code":-32003,
                "message":format!("unknown service {other:?}"),"data":{"field":"service"}}})
            .to_string(),
        ),
    }
}
