//! Bad input as tables: each row must be refused with the named problem.
use serde_json::{json, Value};
use tributary_core::{
    validate, Address, DirectiveError, DropReason, ExtraDirective, NameError, Target, UpstreamName,
};

#[test]
fn bad_upstream_names() {
    let long = "a".repeat(200);
    let cases: Vec<(&str, NameError)> = vec![
        ("../x", NameError::LeadingDot),
        (
            "a/b",
            NameError::BadChar {
                ch: '/',
                position: 1,
            },
        ),
        (".hidden", NameError::LeadingDot),
        (".", NameError::LeadingDot),
        ("", NameError::Empty),
        (&long, NameError::TooLong { len: 200 }),
        (
            "a b",
            NameError::BadChar {
                ch: ' ',
                position: 1,
            },
        ),
        (
            "api;",
            NameError::BadChar {
                ch: ';',
                position: 3,
            },
        ),
        (
            "x\ny",
            NameError::BadChar {
                ch: '\n',
                position: 1,
            },
        ),
        (
            "ápi",
            NameError::BadChar {
                ch: 'á',
                position: 0,
            },
        ),
        (
            "a\\b",
            NameError::BadChar {
                ch: '\\',
                position: 1,
            },
        ),
        (
            "{x}",
            NameError::BadChar {
                ch: '{',
                position: 0,
            },
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(
            UpstreamName::parse(input),
            Err(expected.clone()),
            "input {input:?}"
        );
        let msg = expected.to_string();
        assert!(
            msg.starts_with("upstream name"),
            "message names the subject: {msg}"
        );
    }
    assert!(NameError::LeadingDot
        .to_string()
        .contains("must not start with \".\""));
    assert!(NameError::TooLong { len: 200 }.to_string().contains("128"));
}

#[test]
fn good_upstream_names() {
    let max = "b".repeat(128);
    for ok in [
        "api",
        "a",
        "API_v2",
        "pool-1.internal",
        "a..b",
        "9lives",
        max.as_str(),
    ] {
        let n = UpstreamName::parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        assert_eq!(n.as_str(), ok);
        assert_eq!(n.to_string(), ok);
    }
}

#[test]
fn upstream_name_serde_validates() {
    let n: UpstreamName = serde_json::from_str("\"api\"").unwrap();
    assert_eq!(serde_json::to_string(&n).unwrap(), "\"api\"");
    let err = serde_json::from_str::<UpstreamName>("\"../x\"").unwrap_err();
    assert!(err.to_string().contains("must not start with"), "{err}");
    assert!(serde_json::from_str::<UpstreamName>("\"\"").is_err());
}

#[test]
fn bad_extra_directives() {
    let long = format!("keepalive {};", "1".repeat(1100));
    let cases: Vec<(&str, DirectiveError)> = vec![
        (
            "server_tokens off; location / {",
            DirectiveError::Brace('{'),
        ),
        ("keepalive 32 {", DirectiveError::Brace('{')),
        ("}", DirectiveError::Brace('}')),
        ("keepalive 32; }", DirectiveError::Brace('}')),
        ("keepalive 32; # more", DirectiveError::Comment),
        ("# keepalive 32;", DirectiveError::Comment),
        ("include /etc/passwd;", DirectiveError::Include),
        ("INCLUDE x.conf;", DirectiveError::Include),
        ("server 10.0.0.9:80;", DirectiveError::Server),
        ("  server 10.0.0.9:80 backup;", DirectiveError::Server),
        ("SERVER 10.0.0.9:80;", DirectiveError::Server),
        (
            "server\tbackend.internal:80 resolve;",
            DirectiveError::Server,
        ),
        ("keepalive 32;\nserver 1.2.3.4;", DirectiveError::Newline),
        ("keepalive 32;\r", DirectiveError::Newline),
        ("keepalive 32", DirectiveError::MissingSemicolon),
        (
            "keepalive 32; least_conn;",
            DirectiveError::MultipleDirectives,
        ),
        ("hash \"$uri;", DirectiveError::UnclosedQuote),
        ("hash '$uri;", DirectiveError::UnclosedQuote),
        ("hash \"$uri\\\";", DirectiveError::UnclosedQuote),
        ("hash $uri\\;", DirectiveError::Backslash),
        ("hash a\\ b;", DirectiveError::Backslash),
        ("", DirectiveError::Empty),
        ("   ", DirectiveError::Empty),
        (";", DirectiveError::BadName),
        ("1keepalive 3;", DirectiveError::BadName),
        ("keep-alive 3;", DirectiveError::BadName),
        ("keepalive\u{0} 3;", DirectiveError::ControlChar),
        (&long, DirectiveError::TooLong { len: long.len() }),
    ];
    for (input, expected) in cases {
        assert_eq!(
            ExtraDirective::parse(input),
            Err(expected.clone()),
            "input {input:?}"
        );
        assert!(
            expected.to_string().starts_with("extra directive"),
            "{expected}"
        );
    }
}

#[test]
fn good_extra_directives() {
    let cases = [
        ("keepalive 32;", "keepalive 32;"),
        ("  least_conn;\t", "least_conn;"),
        (
            "hash $request_uri consistent;",
            "hash $request_uri consistent;",
        ),
        ("hash \"$host$uri\";", "hash \"$host$uri\";"),
        ("hash \"a\\\"b\";", "hash \"a\\\"b\";"),
        ("keepalive_timeout 60s;", "keepalive_timeout 60s;"),
        ("zone api_zone 64k;", "zone api_zone 64k;"),
        ("included_thing on;", "included_thing on;"),
        ("servers_hint on;", "servers_hint on;"),
    ];
    for (input, stored) in cases {
        let d = ExtraDirective::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(d.as_str(), stored);
    }
    let d: ExtraDirective = serde_json::from_str("\"keepalive 8;\"").unwrap();
    assert_eq!(d.as_str(), "keepalive 8;");
    assert!(serde_json::from_str::<ExtraDirective>("\"include x;\"").is_err());
}

#[test]
fn bad_targets_are_dropped_with_reason() {
    let long_host = format!("{}.example.com", vec!["a".repeat(60); 5].join("."));
    assert!(long_host.len() > 253 && long_host.len() < 320);
    let long_label = format!("{}.com", "a".repeat(64));
    let cases: Vec<(Value, DropReason)> = vec![
        (
            json!({"address": "10.0.0.1", "port": "80"}),
            DropReason::PortNotInteger,
        ),
        (
            json!({"address": "10.0.0.1", "port": 80.5}),
            DropReason::PortNotInteger,
        ),
        (
            json!({"address": "10.0.0.1", "port": true}),
            DropReason::PortNotInteger,
        ),
        (
            json!({"address": "10.0.0.1", "port": 0}),
            DropReason::PortOutOfRange,
        ),
        (
            json!({"address": "10.0.0.1", "port": 65536}),
            DropReason::PortOutOfRange,
        ),
        (
            json!({"address": "10.0.0.1", "port": -80}),
            DropReason::PortOutOfRange,
        ),
        (json!({"address": "10.0.0.1"}), DropReason::MissingPort),
        (
            json!({"address": "10.0.0.1", "port": null}),
            DropReason::MissingPort,
        ),
        (
            json!({"address": "10.0.0.1", "port": 80, "weight": 1001}),
            DropReason::WeightOutOfRange,
        ),
        (
            json!({"address": "10.0.0.1", "port": 80, "weight": -1}),
            DropReason::WeightOutOfRange,
        ),
        (
            json!({"address": "10.0.0.1", "port": 80, "weight": "2"}),
            DropReason::WeightNotInteger,
        ),
        (
            json!({"address": "10.0.0.1", "port": 80, "weight": 1.5}),
            DropReason::WeightNotInteger,
        ),
        (
            json!({"address": "10.0.0.1:80", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "http://x", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "[::1]", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "a b", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "fe80::1%eth0", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": long_host, "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "a".repeat(300), "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": long_label, "port": 80}),
            DropReason::BadAddress,
        ),
        (json!({"address": "", "port": 80}), DropReason::BadAddress),
        (
            json!({"address": "host/path", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "-bad.example", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "bad-.example", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "a..b", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "trailing.dot.", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "under_score.example", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "10.0.0.256", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "010.0.0.1", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "api;", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": "x\ninclude", "port": 80}),
            DropReason::BadAddress,
        ),
        (
            json!({"address": 167772161, "port": 80}),
            DropReason::BadAddress,
        ),
        (json!({"port": 80}), DropReason::MissingAddress),
        (
            json!({"address": null, "port": 80}),
            DropReason::MissingAddress,
        ),
        (json!("10.0.0.1:80"), DropReason::NotAnObject),
        (json!(null), DropReason::NotAnObject),
        (json!([1, 2]), DropReason::NotAnObject),
    ];
    for (raw, reason) in cases {
        assert_eq!(Target::from_json(&raw), Err(reason), "target {raw}");
        let v = validate(std::slice::from_ref(&raw));
        assert!(v.targets.is_empty(), "target {raw} kept");
        assert_eq!(v.dropped.len(), 1);
        assert_eq!(v.dropped[0].reason, reason);
        assert_eq!(
            v.dropped[0].target, raw,
            "the raw target is kept for the status"
        );
    }
}

#[test]
fn good_targets() {
    let host253 = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(host253.len(), 253);
    let cases: Vec<(Value, Target)> = vec![
        (
            json!({"address": "10.0.0.1", "port": 1, "tags": ["a"], "extra": {"x": 1}}),
            Target {
                address: Address::V4("10.0.0.1".parse().unwrap()),
                port: 1,
                weight: 1,
            },
        ),
        (
            json!({"address": "2001:DB8::1", "port": 65535, "weight": 1000}),
            Target {
                address: Address::V6("2001:db8::1".parse().unwrap()),
                port: 65535,
                weight: 1000,
            },
        ),
        (
            json!({"address": "::ffff:10.0.0.1", "port": 80, "weight": 0}),
            Target {
                address: Address::V6("::ffff:10.0.0.1".parse().unwrap()),
                port: 80,
                weight: 1,
            },
        ),
        (
            json!({"address": "Svc-1.NS.Cluster.Local", "port": 80, "weight": null}),
            Target {
                address: Address::Host("svc-1.ns.cluster.local".into()),
                port: 80,
                weight: 1,
            },
        ),
        (
            json!({"address": "localhost", "port": 80}),
            Target {
                address: Address::Host("localhost".into()),
                port: 80,
                weight: 1,
            },
        ),
        (
            json!({"address": host253.clone(), "port": 80}),
            Target {
                address: Address::Host(host253.clone()),
                port: 80,
                weight: 1,
            },
        ),
    ];
    for (raw, expected) in cases {
        assert_eq!(Target::from_json(&raw), Ok(expected), "target {raw}");
    }
}

#[test]
fn target_json_shape_for_the_cli() {
    let v = validate(&[json!({"address": "2001:db8::17", "port": 8443, "tags": ["t"]})]);
    assert_eq!(
        serde_json::to_value(&v).unwrap(),
        json!({"targets": [{"address": "2001:db8::17", "port": 8443, "weight": 1}], "dropped": []})
    );
    let v = validate(&[json!({"address": "x y", "port": 1})]);
    assert_eq!(
        serde_json::to_value(&v.dropped).unwrap(),
        json!([{"target": {"address": "x y", "port": 1}, "reason": "bad address"}])
    );
}

#[test]
fn empty_answer_keeps_nothing() {
    let v = validate(&[]);
    assert!(v.targets.is_empty() && v.dropped.is_empty());
    assert_eq!(tributary_core::summarize_dropped(&v.dropped), "");
}

#[test]
fn summary_wording() {
    let v = validate(&[
        json!({"address": "10.0.0.1", "port": 0}),
        json!({"address": "http://x", "port": 80}),
    ]);
    assert_eq!(
        tributary_core::summarize_dropped(&v.dropped),
        "2 dropped: port out of range, bad address"
    );
}

#[test]
fn target_deserialize_runs_the_checks() {
    let t: Target = serde_json::from_value(json!({"address": "Web.Example", "port": 80})).unwrap();
    assert_eq!(t.address, Address::Host("web.example".into()));
    assert_eq!(t.weight, 1);
    for bad in [
        json!({"address": "10.0.0.1", "port": 0}),
        json!({"address": "a b", "port": 80}),
        json!({"address": "10.0.0.1", "port": 80, "weight": 1001}),
    ] {
        assert!(
            serde_json::from_value::<Target>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    let round: Target = serde_json::from_value(
        serde_json::to_value(Target {
            address: Address::V6("::1".parse().unwrap()),
            port: 1,
            weight: 7,
        })
        .unwrap(),
    )
    .unwrap();
    assert_eq!(round.weight, 7);
}
