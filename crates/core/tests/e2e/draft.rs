//! The one binding validation: every invalid field at once, one message per field.
use std::time::Duration;

use serde_json::{json, Value};
use tributary_core::{BindingDraft, FieldError};
use tributary_protocol::{ConfigMap, ProviderDecl};

fn decl() -> ProviderDecl {
    serde_json::from_value(json!({
        "code": "r", "name": "R",
        "configuration": {"fields": [
            {"key": "address", "display_name": "Address", "required": true},
            {"key": "token", "display_name": "Token", "required": true, "secret": true},
            {"key": "healthy_only", "display_name": "Healthy", "type": "bool"},
            {"key": "limit", "display_name": "Limit", "type": "number"},
            {"key": "dc", "display_name": "Datacenter", "required": true, "default": "dc1"}
        ]}
    }))
    .unwrap()
}

const SECRET: &str = "tok_live_s3cr3t";

fn draft(config: &[(&str, Value)]) -> BindingDraft {
    BindingDraft {
        name: "api".into(),
        plugin: Some("p".into()),
        provider: Some("r".into()),
        config: config
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect::<ConfigMap>(),
        service: Some("demo".into()),
        interval_secs: None,
        directives: vec!["keepalive 16;".into()],
        drain_secs: 0,
        probe: None,
    }
}

fn fields(e: &[FieldError]) -> Vec<&str> {
    e.iter().map(|e| e.field.as_str()).collect()
}

#[test]
fn a_valid_draft_becomes_a_binding_with_typed_config() {
    let d = draft(&[
        ("address", json!("http://r:1")),
        ("token", json!(SECRET)),
        ("healthy_only", json!("true")),
        ("limit", json!(" 5 ")),
    ]);
    let b = d.check(Some(&decl())).unwrap();
    assert_eq!(b.name.as_str(), "api");
    assert_eq!(b.interval, Duration::from_secs(60), "the default interval");
    assert_eq!(b.config.get("healthy_only"), Some(&json!(true)));
    assert_eq!(b.config.get("limit"), Some(&json!(5)));
    assert_eq!(b.directives.len(), 1);
    // Without a declaration the config is taken as it is (a stored binding at start-up).
    let b = draft(&[("anything", json!("x"))]).check(None).unwrap();
    assert_eq!(b.config.get("anything"), Some(&json!("x")));
}

#[test]
fn every_invalid_field_is_reported_at_once_ordered_by_field() {
    let mut d = draft(&[
        ("limit", json!("many")),
        ("healthy_only", json!(SECRET)),
        ("colour", json!("blue")),
    ]);
    d.name = ".x".into();
    d.service = Some(String::new());
    d.interval_secs = Some(1);
    d.directives = vec!["keepalive 1;".into(), "include x;".into(), "root /;".into()];
    let e = d.check(Some(&decl())).unwrap_err();
    assert_eq!(
        fields(&e),
        [
            "address",
            "colour",
            "directives",
            "healthy_only",
            "interval_secs",
            "limit",
            "name",
            "service",
            "token"
        ]
    );
    // One message per field; the first bad directive is the one named.
    assert!(e[2].message.contains("include x;"), "{:?}", e[2]);
    assert!(e[4].message.contains("too short"), "{:?}", e[4]);
    assert!(e[5].message.contains("must be a number"), "{:?}", e[5]);
    for x in &e {
        assert!(!x.message.contains(SECRET), "{x:?}");
        assert!(!x.message.is_empty());
    }
}

#[test]
fn limits_of_service_interval_and_plugin() {
    let base = draft(&[("address", json!("a")), ("token", json!("t"))]);
    let mut d = base.clone();
    d.service = Some("s".repeat(1025));
    d.interval_secs = Some(7 * 24 * 3600 + 1);
    d.plugin = Some(" ".into());
    d.provider = Some(String::new());
    let e = d.check(None).unwrap_err();
    assert_eq!(
        fields(&e),
        ["interval_secs", "plugin", "provider", "service"]
    );
    assert!(e[0].message.contains("too long"), "{e:?}");
    let mut d = base.clone();
    d.service = Some("a\u{7}b".into());
    d.interval_secs = Some(7 * 24 * 3600);
    let e = d.check(Some(&decl())).unwrap_err();
    assert_eq!(fields(&e), ["service"]);
    assert!(e[0].message.contains("control character"));
    let mut d = base;
    d.interval_secs = Some(10);
    d.check(Some(&decl())).unwrap();
}

#[test]
fn required_fields_left_out_are_reported_with_the_others() {
    let mut d = draft(&[("address", json!("a")), ("token", json!("t"))]);
    d.plugin = None;
    d.service = None;
    d.interval_secs = Some(1);
    let e = d.check(None).unwrap_err();
    assert_eq!(fields(&e), ["interval_secs", "plugin", "service"]);
    assert_eq!(e[1].message, "plugin is required");
    assert_eq!(e[2].message, "service is required");
    d.plugin = Some("p".into());
    d.provider = None;
    d.service = Some("demo".into());
    d.interval_secs = None;
    let e = d.check(None).unwrap_err();
    assert_eq!(fields(&e), ["provider"]);
    assert_eq!(e[0].message, "provider is required");
}

#[test]
fn empty_and_null_required_values_are_missing_and_defaults_count() {
    let d = draft(&[
        ("address", json!("")),
        ("token", Value::Null),
        ("dc", json!("")),
    ]);
    let e = d.check(Some(&decl())).unwrap_err();
    assert_eq!(fields(&e), ["address", "token"]);
    assert!(e[0].message.contains("required"));
}

#[test]
fn a_provider_other_than_the_declaration_is_an_error() {
    let mut d = draft(&[("address", json!("a")), ("token", json!("t"))]);
    d.provider = Some("other".into());
    let e = d.check(Some(&decl())).unwrap_err();
    assert_eq!(fields(&e), ["provider"]);
}

#[test]
fn a_server_directive_is_refused_naming_it() {
    // A binding's servers come from its targets: a `server` line of its own would be a server the
    // live API never sees (every change of that binding a reload with `not_rendered`).
    let mut d = draft(&[("address", json!("a")), ("token", json!("t"))]);
    d.directives = vec!["keepalive 8;".into(), "server 10.0.0.9:80 backup;".into()];
    let e = d.check(Some(&decl())).unwrap_err();
    assert_eq!(fields(&e), ["directives"]);
    assert!(
        e[0].message.contains("server 10.0.0.9:80 backup;")
            && e[0].message.contains("\"server\" is not allowed"),
        "{:?}",
        e[0]
    );
    // A directive whose name only starts with "server" is still fine.
    d.directives = vec!["server_tokens_like on;".into()];
    assert!(d.check(Some(&decl())).is_ok());
}
