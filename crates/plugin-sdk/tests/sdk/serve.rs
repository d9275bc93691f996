//! `serve` over in-memory pipes with a toy plugin.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tributary_plugin_sdk::{
    call, serve, target, ConfigExt, Plugin, ResolveParams, ResolveResult, RpcError, ServeError,
};

const MANIFEST: &str = r#"{"name":"toy","version":"1","executable":"toy",
  "capabilities":["upstream.discovery"],"permissions":["network"],
  "discovery":{"providers":[{"code":"toy","name":"Toy","configuration":{"fields":[
    {"key":"host","display_name":"Host","required":true},
    {"key":"tls","display_name":"TLS","type":"bool"},
    {"key":"port","display_name":"Port","type":"number"}]}}]}}"#;

struct Toy {
    manifest: Option<&'static str>,
}

impl Plugin for Toy {
    fn manifest(&self) -> Option<&str> {
        self.manifest
    }

    async fn resolve(&self, params: ResolveParams) -> Result<ResolveResult, RpcError> {
        let host = params.config.required_str("host")?.to_string();
        match params.service.as_str() {
            "panic" => panic!("toy panics"),
            "down" => return Err(RpcError::provider("registry down")),
            s if s.starts_with("sleep:") => {
                let ms: u64 = s[6..].parse().unwrap();
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            _ => {}
        }
        Ok(ResolveResult {
            targets: vec![
                target(host, 80, Some(2)),
                json!({"service": params.service}),
            ],
            ttl_seconds: 7,
        })
    }
}

/// Runs `serve` on the given input lines and returns every answer line once input has ended.
async fn exchange(manifest: Option<&'static str>, input: &str) -> Vec<Value> {
    let (mut to_plugin, plugin_in) = tokio::io::duplex(1 << 20);
    let (plugin_out, from_plugin) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(serve(Toy { manifest }, plugin_in, plugin_out));
    to_plugin.write_all(input.as_bytes()).await.unwrap();
    drop(to_plugin);
    let mut lines = BufReader::new(from_plugin).lines();
    let mut out = Vec::new();
    while let Some(l) = lines.next_line().await.unwrap() {
        out.push(serde_json::from_str(&l).unwrap());
    }
    server.await.unwrap().unwrap();
    out
}

fn req(id: u64, provider: &str, config: Value, service: &str) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"discovery.resolve",
        "params":{"provider":provider,"config":config,"service":service}})
    .to_string()
        + "\n"
}

fn by_id(answers: &[Value], id: u64) -> &Value {
    answers
        .iter()
        .find(|a| a["id"] == json!(id))
        .unwrap_or_else(|| panic!("no answer for {id}: {answers:?}"))
}

#[tokio::test]
async fn answers_resolve_concurrently_matched_by_id() {
    let mut input = String::new();
    for i in 1..=5u64 {
        input += &req(
            i,
            "toy",
            json!({"host":"h"}),
            &format!("sleep:{}", (6 - i) * 20),
        );
    }
    let answers = exchange(Some(MANIFEST), &input).await;
    assert_eq!(answers.len(), 5);
    // The longest sleep was sent first and answered last: they ran at the same time.
    assert_eq!(answers[0]["id"], json!(5));
    assert_eq!(answers[4]["id"], json!(1));
    for i in 1..=5u64 {
        let a = by_id(&answers, i);
        assert_eq!(a["jsonrpc"], "2.0");
        assert_eq!(
            a["result"]["targets"][0],
            json!({"address":"h","port":80,"weight":2})
        );
        assert_eq!(
            a["result"]["targets"][1]["service"],
            json!(format!("sleep:{}", (6 - i) * 20))
        );
        assert_eq!(a["result"]["ttl_seconds"], json!(7));
    }
}

#[tokio::test]
async fn protocol_errors() {
    let input = [
        "this is not json\n".to_string(),
        r#"{"jsonrpc":"2.0","id":2,"method":"other.method","params":{}}"#.to_string() + "\n",
        r#"{"jsonrpc":"2.0","id":3,"method":"discovery.resolve","params":{"provider":"toy"}}"#
            .to_string()
            + "\n",
        r#"{"jsonrpc":"1.0","id":4,"method":"discovery.resolve"}"#.to_string() + "\n",
        "\n".to_string(),
        req(5, "toy", json!({"host":"h"}), "panic"),
        req(6, "toy", json!({"host":"h"}), "down"),
        req(7, "toy", json!({"host":"h"}), "fine"),
    ]
    .concat();
    let answers = exchange(None, &input).await;
    assert_eq!(answers.len(), 7, "{answers:?}");
    let parse = answers.iter().find(|a| a["id"].is_null()).unwrap();
    assert_eq!(parse["error"]["code"], json!(-32700));
    assert_eq!(by_id(&answers, 2)["error"]["code"], json!(-32601));
    assert_eq!(by_id(&answers, 3)["error"]["code"], json!(-32602));
    assert_eq!(by_id(&answers, 4)["error"]["code"], json!(-32600));
    assert_eq!(by_id(&answers, 5)["error"]["code"], json!(-32603));
    assert_eq!(
        by_id(&answers, 6)["error"],
        json!({"code":-32000,"message":"registry down"})
    );
    assert!(by_id(&answers, 7)["result"]["targets"].is_array());
}

#[tokio::test]
async fn manifest_checks_answer_minus_32003_with_the_field() {
    let input = [
        req(1, "nope", json!({"host":"h"}), "x"),
        req(2, "toy", json!({}), "x"),
        req(3, "toy", json!({"host":""}), "x"),
        req(4, "toy", json!({"host":"h","tls":"yes"}), "x"),
        req(5, "toy", json!({"host":"h","port":"80"}), "x"),
        req(6, "toy", json!({"host":"h","tls":true,"port":80}), "x"),
    ]
    .concat();
    let answers = exchange(Some(MANIFEST), &input).await;
    for (id, field) in [
        (1, "provider"),
        (2, "host"),
        (3, "host"),
        (4, "tls"),
        (5, "port"),
    ] {
        let e = &by_id(&answers, id)["error"];
        assert_eq!(e["code"], json!(-32003), "{id}: {e}");
        assert_eq!(e["data"]["field"], json!(field), "{id}: {e}");
    }
    assert!(by_id(&answers, 6)["result"].is_object());
    // Without the manifest the plugin's own ConfigExt check still names the field.
    let answers = exchange(None, &req(9, "toy", json!({}), "x")).await;
    assert_eq!(answers[0]["error"]["data"]["field"], json!("host"));
}

#[tokio::test]
async fn an_invalid_manifest_stops_serve() {
    let (_a, plugin_in) = tokio::io::duplex(64);
    let (plugin_out, _b) = tokio::io::duplex(64);
    let bad: &'static str = r#"{"name":"toy","version":"1","executable":"toy","capabilities":["upstream.discovery"],"permissions":[],"discovery":{"providers":[{"code":"toy","name":"Toy"}]}}"#;
    let err = serve(
        Toy {
            manifest: Some(bad),
        },
        plugin_in,
        plugin_out,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ServeError::Manifest(_)));
    assert!(err.to_string().contains("\"network\" permission"), "{err}");
}

#[tokio::test]
async fn call_runs_the_same_checks_in_process() {
    let toy = Toy {
        manifest: Some(MANIFEST),
    };
    let p = |config: Value| ResolveParams {
        provider: "toy".into(),
        config: serde_json::from_value(config).unwrap(),
        service: "x".into(),
    };
    let ok = call(&toy, p(json!({"host":"h"}))).await.unwrap();
    assert_eq!(ok.targets[0], json!({"address":"h","port":80,"weight":2}));
    let e = call(&toy, p(json!({"host":"h","tls":1})))
        .await
        .unwrap_err();
    assert_eq!((e.code, e.field()), (-32003, Some("tls")));
}
