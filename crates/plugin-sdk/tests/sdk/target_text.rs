//! `split_target`, `parse_port` and `root_cause`: the pieces the text-entry parsers of the static,
//! file and etcd plugins share.

use tributary_plugin_sdk::{parse_port, root_cause, split_target, TargetText};

#[test]
fn splits_address_port_and_weight_as_written() {
    let t = |address, port, weight| TargetText {
        address,
        port,
        weight,
    };
    for (entry, want) in [
        ("10.0.0.1:80", t("10.0.0.1", "80", None)),
        ("web.local:8080:5", t("web.local", "8080", Some("5"))),
        ("[2001:db8::1]:443", t("2001:db8::1", "443", None)),
        ("[::1]:1:7", t("::1", "1", Some("7"))),
        // Pieces are not judged here: empty address, bad port and weight pass through.
        (":x:", t("", "x", Some(""))),
        ("[]:0", t("", "0", None)),
    ] {
        assert_eq!(split_target(entry), Ok(want), "{entry}");
    }
}

#[test]
fn malformed_entries_say_why_without_quoting_them() {
    for (entry, why) in [
        ("10.0.0.1", "expected address:port[:weight]"),
        ("2001:db8::1:80", "too many `:`"),
        ("[2001:db8::1:80", "`[` without `]`"),
        ("[2001:db8::1]80", "a port must follow `]:`"),
    ] {
        let e = split_target(entry).unwrap_err();
        assert!(e.contains(why), "{entry}: {e}");
        assert!(!e.contains(entry), "{entry} quoted in {e}");
    }
}

#[test]
fn ports_are_1_to_65535() {
    assert_eq!(parse_port("1"), Ok(1));
    assert_eq!(parse_port("65535"), Ok(65535));
    for bad in ["0", "65536", "", "http", "-1", " 80"] {
        assert_eq!(
            parse_port(bad),
            Err("port must be a number from 1 to 65535"),
            "{bad:?}"
        );
    }
}

#[derive(Debug)]
struct Layer(&'static str, Option<Box<Layer>>);

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Layer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|l| l as _)
    }
}

#[test]
fn root_cause_is_the_innermost_source_never_the_outer_text() {
    let e = Layer(
        "GET http://secret@host/ failed",
        Some(Box::new(Layer(
            "connect error",
            Some(Box::new(Layer("Connection refused", None))),
        ))),
    );
    assert_eq!(root_cause(&e), "Connection refused");
    assert_eq!(
        root_cause(&Layer("GET http://secret@host/", None)),
        "unknown error"
    );
}

#[test]
fn weights_are_0_to_1000_and_0_means_none() {
    use serde_json::json;
    use tributary_plugin_sdk::{parse_weight, weight_value};
    assert_eq!(parse_weight("0"), Ok(None));
    assert_eq!(parse_weight("1"), Ok(Some(1)));
    assert_eq!(parse_weight("1000"), Ok(Some(1000)));
    for bad in ["1001", "-1", "", "x", "65536"] {
        let e = parse_weight(bad).unwrap_err();
        assert!(
            e.starts_with("weight must be a number from 0 to 1000"),
            "{bad:?}: {e}"
        );
    }
    assert_eq!(weight_value(None), Ok(None));
    assert_eq!(weight_value(Some(&json!(null))), Ok(None));
    assert_eq!(weight_value(Some(&json!(0))), Ok(None));
    assert_eq!(weight_value(Some(&json!(7))), Ok(Some(7)));
    for bad in [json!(1001), json!(-1), json!(1.5), json!("5"), json!(70000)] {
        let e = weight_value(Some(&bad)).unwrap_err();
        assert!(
            e.starts_with("weight must be a whole number from 0 to 1000"),
            "{bad}: {e}"
        );
    }
}
