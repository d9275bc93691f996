//! Golden fixtures pinning the wire format: each fixture parses, and serialising the parsed value
//! gives the fixture's bytes again (compact, members in the fixture's order).

use serde_json::{json, Value};
use tributary_protocol::*;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim_end()
        .to_string()
}

#[test]
fn resolve_request_round_trips_byte_for_byte() {
    let text = fixture("resolve_request.json");
    let req: Request = serde_json::from_str(&text).unwrap();
    assert_eq!(req.id, Id::Num(50));
    assert_eq!(req.method, RESOLVE_METHOD);
    let params: ResolveParams = serde_json::from_value(req.params.clone()).unwrap();
    assert_eq!(params.provider, "registry");
    assert_eq!(params.service, "api");
    assert_eq!(params.config.get_str("token"), Some("tok_live_xxx"));
    // Built from the typed params, the request is the same bytes.
    let built = Request::resolve(50, &params);
    assert_eq!(serde_json::to_string(&built).unwrap(), text);
}

#[test]
fn resolve_response_round_trips_and_keeps_targets_raw() {
    let text = fixture("resolve_response.json");
    let resp: Response = serde_json::from_str(&text).unwrap();
    assert_eq!(resp.id, Some(Id::Num(50)));
    assert_eq!(serde_json::to_string(&resp).unwrap(), text);
    let result: ResolveResult = serde_json::from_value(resp.into_result().unwrap()).unwrap();
    assert_eq!(result.ttl_seconds, 30);
    assert_eq!(result.targets.len(), 3);
    assert_eq!(result.targets[1]["tags"], json!(["zone-b", "canary"]));
    assert!(result.targets[2].get("weight").is_none());
}

#[test]
fn error_responses_round_trip() {
    for (name, code, field) in [
        ("error_config.json", ERR_CONFIG, Some("service")),
        ("error_provider.json", ERR_PROVIDER, None),
        ("error_parse.json", ERR_PARSE, None),
    ] {
        let text = fixture(name);
        let resp: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&resp).unwrap(), text, "{name}");
        let err = resp.clone().into_result().unwrap_err();
        assert_eq!(err.code, code, "{name}");
        assert_eq!(err.field(), field, "{name}");
    }
    let built = Response::error(
        Some(Id::Num(7)),
        RpcError::config("service", "unknown service"),
    );
    assert_eq!(
        serde_json::to_string(&built).unwrap(),
        fixture("error_config.json")
    );
    let parse = Response::error(None, RpcError::new(ERR_PARSE, "line is not valid JSON"));
    assert_eq!(
        serde_json::to_string(&parse).unwrap(),
        fixture("error_parse.json")
    );
}

#[test]
fn constants_are_pinned() {
    assert_eq!(RESOLVE_METHOD, "discovery.resolve");
    assert_eq!(ERR_CONFIG, -32003);
    assert_eq!(ERR_PROVIDER, -32000);
    assert_eq!(JSONRPC_VERSION, "2.0");
}

#[test]
fn seed_manifest_parses() {
    let m = Manifest::parse(&fixture("manifest_seed.json")).unwrap();
    assert_eq!(m.name, "registry");
    assert_eq!(m.capabilities, vec![Capability::UpstreamDiscovery]);
    assert_eq!(m.permissions, vec![Permission::Network]);
    let p = m.provider("registry").unwrap();
    assert_eq!(p.name, "Service registry");
    let f = &p.configuration.fields;
    assert_eq!(f.len(), 3);
    assert!(f[0].required && !f[0].secret && f[0].field_type == FieldType::String);
    assert!(f[1].secret && !f[1].required);
    assert_eq!(f[2].field_type, FieldType::Bool);
    assert!(m.provider("nope").is_none());
    // Serialising the manifest keeps the wire names (`type`, capability strings).
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(v["capabilities"], json!(["upstream.discovery"]));
    assert_eq!(
        v["discovery"]["providers"][0]["configuration"]["fields"][2]["type"],
        "bool"
    );
    let again = Manifest::parse(&v.to_string()).unwrap();
    assert_eq!(again, m);
}

fn seed() -> Value {
    serde_json::from_str(&fixture("manifest_seed.json")).unwrap()
}

fn refused(v: Value) -> String {
    Manifest::parse(&v.to_string())
        .expect_err("manifest should be refused")
        .to_string()
}

#[test]
fn discovery_without_network_permission_is_refused_saying_so() {
    let mut v = seed();
    v["permissions"] = json!([]);
    let msg = refused(v.clone());
    assert!(msg.contains("\"network\" permission"), "{msg}");
    assert!(msg.contains("upstream.discovery"), "{msg}");
    v.as_object_mut().unwrap().remove("permissions");
    assert!(refused(v).contains("\"network\" permission"));
}

#[test]
fn manifest_refusals_name_the_problem() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "unknown capability",
            Box::new(|v| v["capabilities"] = json!(["upstream.discovery", "notify.email"])),
            "unknown capability \"notify.email\"",
        ),
        (
            "unknown permission",
            Box::new(|v| v["permissions"] = json!(["network", "root"])),
            "unknown permission \"root\"",
        ),
        (
            "duplicate provider",
            Box::new(|v| {
                let p = v["discovery"]["providers"][0].clone();
                v["discovery"]["providers"].as_array_mut().unwrap().push(p);
            }),
            "provider code \"registry\" is declared twice",
        ),
        (
            "duplicate field",
            Box::new(|v| {
                v["discovery"]["providers"][0]["configuration"]["fields"][1]["key"] =
                    json!("address")
            }),
            "field key \"address\" is declared twice",
        ),
        (
            "missing executable",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("executable");
            }),
            "missing field `executable`",
        ),
        (
            "empty executable",
            Box::new(|v| v["executable"] = json!("")),
            "`executable` must not be empty",
        ),
        (
            "no capability",
            Box::new(|v| v["capabilities"] = json!([])),
            "at least one capability",
        ),
        (
            "duplicate capability",
            Box::new(|v| v["capabilities"] = json!(["upstream.discovery", "upstream.discovery"])),
            "declared twice",
        ),
        (
            "no providers",
            Box::new(|v| v["discovery"]["providers"] = json!([])),
            "at least one provider",
        ),
        (
            "no discovery section",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("discovery");
            }),
            "discovery.providers",
        ),
        (
            "unknown field type",
            Box::new(|v| {
                v["discovery"]["providers"][0]["configuration"]["fields"][0]["type"] = json!("list")
            }),
            "unknown variant `list`",
        ),
        (
            "unknown member",
            Box::new(|v| v["homepage"] = json!("x")),
            "unknown field `homepage`",
        ),
        (
            "bad name",
            Box::new(|v| v["name"] = json!("../evil")),
            "name \"../evil\" is invalid",
        ),
        (
            "bad default",
            Box::new(|v| {
                v["discovery"]["providers"][0]["configuration"]["fields"][2]["default"] =
                    json!("yes")
            }),
            "`default` is not a bool",
        ),
        (
            "empty display name",
            Box::new(|v| {
                v["discovery"]["providers"][0]["configuration"]["fields"][0]["display_name"] =
                    json!(" ")
            }),
            "display_name` must not be empty",
        ),
        (
            "not json",
            Box::new(|v| *v = json!("plugin")),
            "plugin.json is invalid",
        ),
    ];
    for (what, edit, want) in cases {
        let mut v = seed();
        edit(&mut v);
        let msg = refused(v);
        assert!(
            msg.contains(want),
            "{what}: {msg:?} does not contain {want:?}"
        );
    }
    let msg = Manifest::parse("{not json").unwrap_err().to_string();
    assert!(msg.starts_with("plugin.json is invalid"), "{msg}");
}
