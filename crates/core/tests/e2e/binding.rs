//! Binding checks: generic ones and against a provider declaration (the seed's `registry`).
use std::time::Duration;

use serde_json::{json, Value};
use tributary_core::{coerce_config, Binding, BindingError, ExtraDirective, UpstreamName};
use tributary_protocol::{ConfigMap, ProviderDecl};

fn registry_decl() -> ProviderDecl {
    serde_json::from_value(json!({
        "code": "registry",
        "name": "Service registry",
        "configuration": { "fields": [
            { "key": "address", "display_name": "Registry address", "required": true },
            { "key": "token", "display_name": "ACL token", "secret": true },
            { "key": "healthy_only", "type": "bool", "display_name": "Only healthy instances" },
            { "key": "limit", "type": "number", "display_name": "Limit" },
            { "key": "dc", "display_name": "Datacenter", "required": true, "default": "dc1" }
        ]}
    }))
    .unwrap()
}

fn binding(config: &[(&str, Value)]) -> Binding {
    let mut c = ConfigMap::new();
    for (k, v) in config {
        c.insert(*k, v.clone());
    }
    Binding {
        name: UpstreamName::parse("api").unwrap(),
        plugin: "consul".into(),
        provider: "registry".into(),
        config: c,
        service: "api".into(),
        interval: Duration::from_secs(60),
        directives: vec![ExtraDirective::parse("keepalive 32;").unwrap()],
        drain_secs: 0,
        probe: None,
    }
}

const SECRET: &str = "tok_live_s3cr3t";

#[test]
fn include_line() {
    assert_eq!(binding(&[]).include_line(), "include upstreams/api.conf;");
}

#[test]
fn valid_binding_passes() {
    let b = binding(&[
        ("address", json!("https://registry.example.com:8500")),
        ("token", json!(SECRET)),
        ("healthy_only", json!(true)),
        ("limit", json!(5)),
    ]);
    b.validate().unwrap();
    b.validate_against(&registry_decl()).unwrap();
    assert!(
        !format!("{b:?}").contains(SECRET),
        "Debug must not show config values"
    );
}

#[test]
fn provider_errors_name_the_field_and_never_the_value() {
    let cases: Vec<(Vec<(&str, Value)>, BindingError)> = vec![
        (
            vec![],
            BindingError::MissingField {
                key: "address".into(),
            },
        ),
        (
            vec![("address", json!(null))],
            BindingError::MissingField {
                key: "address".into(),
            },
        ),
        (
            vec![("address", json!(""))],
            BindingError::MissingField {
                key: "address".into(),
            },
        ),
        (
            vec![("address", json!("a")), ("healthy_only", json!(SECRET))],
            BindingError::WrongType {
                key: "healthy_only".into(),
                expected: "bool (true or false)",
            },
        ),
        (
            vec![("address", json!("a")), ("limit", json!(SECRET))],
            BindingError::WrongType {
                key: "limit".into(),
                expected: "number",
            },
        ),
        (
            vec![("address", json!(42))],
            BindingError::WrongType {
                key: "address".into(),
                expected: "string",
            },
        ),
        (
            vec![("address", json!("a")), ("tokn", json!(SECRET))],
            BindingError::UnknownField { key: "tokn".into() },
        ),
    ];
    for (config, expected) in cases {
        let err = binding(&config)
            .validate_against(&registry_decl())
            .unwrap_err();
        assert_eq!(err, expected);
        assert!(!err.to_string().contains(SECRET), "{err}");
        assert!(
            err.to_string().contains(err.field()),
            "{err} names {}",
            err.field()
        );
    }
}

#[test]
fn provider_mismatch() {
    let mut b = binding(&[("address", json!("a"))]);
    b.provider = "other".into();
    let err = b.validate_against(&registry_decl()).unwrap_err();
    assert_eq!(err.field(), "provider");
}

#[test]
fn generic_checks() {
    let mut b = binding(&[]);
    b.interval = Duration::from_secs(9);
    assert_eq!(
        b.validate(),
        Err(BindingError::IntervalTooShort { seconds: 9 })
    );
    assert_eq!(
        b.validate().unwrap_err().to_string(),
        "refresh interval 9 s is too short: the minimum is 10 s"
    );
    assert_eq!(b.validate().unwrap_err().field(), "interval_secs");
    b.interval = Duration::from_secs(7 * 24 * 3600 + 1);
    assert_eq!(
        b.validate(),
        Err(BindingError::IntervalTooLong {
            seconds: 7 * 24 * 3600 + 1
        })
    );
    b.interval = Duration::from_secs(10);
    b.validate().unwrap();
    b.service = "s".repeat(1025);
    assert_eq!(b.validate(), Err(BindingError::ServiceTooLong));
    b.service = " ".into();
    assert_eq!(b.validate(), Err(BindingError::EmptyService));
    b.service = "a\nb".into();
    assert_eq!(b.validate(), Err(BindingError::ServiceControlChar));
    b.service = "api".into();
    b.plugin = String::new();
    assert_eq!(b.validate(), Err(BindingError::EmptyPlugin));
    b.plugin = "p".into();
    b.provider = String::new();
    assert_eq!(b.validate(), Err(BindingError::EmptyProvider));
}

#[test]
fn coerce_cli_text() {
    let decl = registry_decl();
    let mut b = binding(&[
        ("address", json!("10.0.0.1")),
        ("healthy_only", json!("true")),
        ("limit", json!("25")),
    ]);
    coerce_config(&mut b.config, &decl).unwrap();
    assert_eq!(b.config.get("healthy_only"), Some(&json!(true)));
    assert_eq!(b.config.get("limit"), Some(&json!(25)));
    assert_eq!(b.config.get("address"), Some(&json!("10.0.0.1")));
    b.validate_against(&decl).unwrap();

    let mut c = ConfigMap::new();
    c.insert("healthy_only", json!(SECRET));
    let err = coerce_config(&mut c, &decl).unwrap_err();
    assert_eq!(err.field(), "healthy_only");
    assert!(!err.to_string().contains(SECRET));
}
