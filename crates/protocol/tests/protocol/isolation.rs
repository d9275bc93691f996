//! The manifest members that isolate plugins: `environment` (what of the daemon's environment a
//! plugin receives) and `endpoint` fields (where a stored secret may be sent).

use serde_json::{json, Value};
use tributary_protocol::*;

fn fixture() -> Value {
    let path = format!(
        "{}/tests/fixtures/manifest_isolation.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn refused(v: Value) -> String {
    Manifest::parse(&v.to_string())
        .expect_err("manifest should be refused")
        .to_string()
}

fn config(v: Value) -> ConfigMap {
    serde_json::from_value(v).unwrap()
}

#[test]
fn environment_and_endpoint_members_parse_and_round_trip() {
    let m = Manifest::parse(&fixture().to_string()).unwrap();
    assert_eq!(m.environment, ["REGISTRY_CACERT", "HTTPS_PROXY", "AWS_*"]);
    let p = m.provider("registry").unwrap();
    assert!(p.field("address").unwrap().endpoint);
    assert!(!p.field("token").unwrap().endpoint);
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(v["environment"], fixture()["environment"]);
    assert_eq!(Manifest::parse(&v.to_string()).unwrap(), m);
    // Left out, both default to nothing and are not written back.
    let mut bare = fixture();
    bare.as_object_mut().unwrap().remove("environment");
    let m = Manifest::parse(&bare.to_string()).unwrap();
    assert!(m.environment.is_empty());
    let v = serde_json::to_value(&m).unwrap();
    assert!(v.get("environment").is_none());
    assert!(v["discovery"]["providers"][0]["configuration"]["fields"][1]
        .get("endpoint")
        .is_none());
}

#[test]
fn environment_allows_names_and_prefixes_but_never_daemon_settings() {
    let env: Vec<String> = ["REGISTRY_CACERT", "AWS_*", "TRIBUTARY_TOKEN"]
        .map(String::from)
        .to_vec();
    assert!(environment_allows(&env, "REGISTRY_CACERT"));
    assert!(!environment_allows(&env, "REGISTRY_CACERT2"));
    assert!(environment_allows(&env, "AWS_REGION"));
    assert!(!environment_allows(&env, "AWS"));
    assert!(!environment_allows(&env, "PATH"));
    // Even a list that names one (not a valid manifest) never lets a daemon setting through.
    assert!(!environment_allows(&env, "TRIBUTARY_TOKEN"));
    let all = vec!["T*".to_string()];
    assert!(!environment_allows(&all, "TRIBUTARY_UI_PASSWORD"));
    assert!(environment_allows(&all, "TERM"));
}

#[test]
fn bad_environment_and_endpoint_declarations_are_refused_naming_the_problem() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "not a name",
            Box::new(|v| v["environment"] = json!(["CONSUL CACERT"])),
            "entry \"CONSUL CACERT\" is invalid",
        ),
        (
            "starts with a digit",
            Box::new(|v| v["environment"] = json!(["1X"])),
            "entry \"1X\" is invalid",
        ),
        (
            "a bare star",
            Box::new(|v| v["environment"] = json!(["*"])),
            "entry \"*\" is invalid",
        ),
        (
            "a star inside",
            Box::new(|v| v["environment"] = json!(["AWS_*_KEY"])),
            "entry \"AWS_*_KEY\" is invalid",
        ),
        (
            "empty",
            Box::new(|v| v["environment"] = json!([""])),
            "entry \"\" is invalid",
        ),
        (
            "twice",
            Box::new(|v| v["environment"] = json!(["AWS_*", "AWS_*"])),
            "\"AWS_*\" is listed twice",
        ),
        (
            "set by the host",
            Box::new(|v| v["environment"] = json!(["HOME"])),
            "\"HOME\" is set by the host",
        ),
        (
            "a daemon setting",
            Box::new(|v| v["environment"] = json!(["TRIBUTARY_TOKEN"])),
            "\"TRIBUTARY_TOKEN\" would pass the daemon's own settings",
        ),
        (
            "a prefix covering the daemon settings",
            Box::new(|v| v["environment"] = json!(["TRIB*"])),
            "\"TRIB*\" would pass the daemon's own settings",
        ),
        (
            "lower-case daemon prefix",
            Box::new(|v| v["environment"] = json!(["tributary_*"])),
            "would pass the daemon's own settings",
        ),
        (
            "not a list of strings",
            Box::new(|v| v["environment"] = json!("AWS_*")),
            "plugin.json is invalid",
        ),
        (
            "secret endpoint",
            Box::new(|v| {
                v["discovery"]["providers"][0]["configuration"]["fields"][1]["endpoint"] =
                    json!(true)
            }),
            "field \"token\" is marked both `secret` and `endpoint`",
        ),
        (
            "endpoint not a bool",
            Box::new(|v| {
                v["discovery"]["providers"][0]["configuration"]["fields"][0]["endpoint"] =
                    json!("yes")
            }),
            "plugin.json is invalid",
        ),
    ];
    for (what, edit, want) in cases {
        let mut v = fixture();
        edit(&mut v);
        let msg = refused(v);
        assert!(
            msg.contains(want),
            "{what}: {msg:?} does not contain {want:?}"
        );
    }
}

fn provider() -> ProviderDecl {
    Manifest::parse(&fixture().to_string())
        .unwrap()
        .provider("registry")
        .unwrap()
        .clone()
}

#[test]
fn a_secret_left_out_is_kept_while_the_endpoint_stays() {
    let p = provider();
    let prev = config(json!({"address": "http://a:8500", "token": "s3cret-token", "port": 8500}));
    // Same endpoint (the port typed as text, spaces around the address): the secret is kept.
    let mut input =
        config(json!({"address": " http://a:8500 ", "port": "8500", "healthy_only": true}));
    p.carry_secrets(&prev, &mut input).unwrap();
    assert_eq!(input.get_str("token"), Some("s3cret-token"));
    // A secret given again is taken as given, whatever the endpoint.
    let mut input = config(json!({"address": "http://b:8500", "token": "new-token"}));
    p.carry_secrets(&prev, &mut input).unwrap();
    assert_eq!(input.get_str("token"), Some("new-token"));
    // Nothing stored, nothing to carry.
    let mut input = config(json!({"address": "http://b:8500"}));
    p.carry_secrets(&config(json!({"address": "http://a"})), &mut input)
        .unwrap();
    assert!(!input.contains_key("token"));
}

#[test]
fn a_changed_endpoint_without_the_secret_is_refused_naming_the_secret() {
    let p = provider();
    let prev = config(json!({"address": "http://a:8500", "token": "s3cret-token", "port": 8500}));
    for (what, input) in [
        (
            "address changed",
            json!({"address": "http://evil:8500", "port": 8500}),
        ),
        (
            "port changed",
            json!({"address": "http://a:8500", "port": 9}),
        ),
        ("port removed", json!({"address": "http://a:8500"})),
        (
            "port blank",
            json!({"address": "http://a:8500", "port": " "}),
        ),
    ] {
        let mut input = config(input);
        let before = input.clone();
        let e = p.carry_secrets(&prev, &mut input).unwrap_err();
        assert_eq!(e.secret, "token", "{what}");
        let msg = e.to_string();
        assert!(
            msg.contains("\"token\"") && msg.contains("give"),
            "{what}: {msg}"
        );
        assert!(!msg.contains("s3cret"), "{what}: {msg}");
        assert_eq!(input, before, "{what}: nothing carried");
    }
    // Blank and absent are the same endpoint.
    let prev = config(json!({"address": "http://a", "token": "s3cret-token"}));
    let mut input = config(json!({"address": "http://a", "port": ""}));
    p.carry_secrets(&prev, &mut input).unwrap();
    assert_eq!(input.get_str("token"), Some("s3cret-token"));
}

/// A provider as a third-party plugin written from the seed manifest declares it: no field
/// marked `endpoint`.
fn unmarked_provider() -> ProviderDecl {
    let v = json!({
        "name": "third", "version": "1.0.0", "executable": "run",
        "capabilities": ["upstream.discovery"], "permissions": ["network"],
        "discovery": {"providers": [{"code": "p", "name": "P", "configuration": {"fields": [
            {"key": "address", "display_name": "Address", "required": true},
            {"key": "token", "display_name": "Token", "secret": true},
            {"key": "port", "display_name": "Port", "type": "number"},
            {"key": "password", "display_name": "Password", "secret": true}
        ]}}]}
    });
    Manifest::parse(&v.to_string())
        .unwrap()
        .provider("p")
        .unwrap()
        .clone()
}

#[test]
fn without_an_endpoint_field_every_plain_field_counts_as_one() {
    let p = unmarked_provider();
    let prev = config(
        json!({"address": "http://a", "port": 80, "token": "s3cret-t",
                             "password": "s3cret-p"}),
    );
    for (what, input) in [
        (
            "address changed",
            json!({"address": "http://evil", "port": 80}),
        ),
        ("port changed", json!({"address": "http://a", "port": 81})),
        ("port removed", json!({"address": "http://a"})),
    ] {
        let mut input = config(input);
        let before = input.clone();
        let e = p.carry_secrets(&prev, &mut input).unwrap_err();
        assert_eq!(e.secrets, ["token", "password"], "{what}");
        assert!(e.implied, "{what}");
        let msg = e.to_string();
        assert!(
            msg.contains("give \"token\", \"password\" again") && msg.contains("marks no field"),
            "{what}: {msg}"
        );
        assert!(!msg.contains("s3cret"), "{what}: {msg}");
        assert_eq!(input, before, "{what}: nothing carried");
    }
    // One secret given again, the other left out: the one left out is named.
    let mut input = config(json!({"address": "http://b", "port": 80, "token": "new"}));
    let e = p.carry_secrets(&prev, &mut input).unwrap_err();
    assert_eq!(e.secrets, ["password"]);
    assert!(
        e.to_string().starts_with("field \"password\" is secret"),
        "{e}"
    );
    // Every plain field unchanged: both secrets are kept.
    let mut input = config(json!({"address": " http://a ", "port": "80"}));
    p.carry_secrets(&prev, &mut input).unwrap();
    assert_eq!(input.get_str("token"), Some("s3cret-t"));
    assert_eq!(input.get_str("password"), Some("s3cret-p"));
    // Both given again: taken as given, whatever changed.
    let mut input = config(json!({"address": "http://b", "token": "t2", "password": "p2"}));
    p.carry_secrets(&prev, &mut input).unwrap();
    assert_eq!(input.get_str("password"), Some("p2"));
}
