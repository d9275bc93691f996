use super::plan::totals;
use super::*;

fn put(body: &str) -> Result<PutRequest, ApiError> {
    parse_put(body.as_bytes())
}

fn cur(addr: &str, backup: bool) -> Current {
    Current {
        addr: Addr::parse(addr).unwrap(),
        weight: 1,
        max_fails: 1,
        fail_timeout_s: 10,
        max_conns: 0,
        backup,
        down: false,
        drain: false,
    }
}

#[test]
fn parses_a_full_set_with_defaults() {
    let r = put(r#"{"servers":[{"address":"10.0.0.1:8080","weight":3},
            {"address":"[::1]:80","backup":true,"down":true,"max_fails":0,"fail_timeout_ms":2000},
            {"address":"unix:/run/a.sock"}],"generation":7}"#)
    .unwrap();
    assert_eq!(r.generation, Some(7));
    assert_eq!(r.servers.len(), 3);
    assert_eq!(r.servers[0].weight, 3);
    assert_eq!(r.servers[0].max_fails, 1);
    assert_eq!(r.servers[0].fail_timeout_s, 10);
    assert_eq!(r.servers[1].addr.name(), "[::1]:80");
    assert!(r.servers[1].backup && r.servers[1].down);
    assert_eq!(r.servers[1].fail_timeout_s, 2);
    assert_eq!(r.servers[2].addr, Addr::Unix("/run/a.sock".into()));
    assert_eq!(r.servers[2].addr.name(), "unix:/run/a.sock");
}

#[test]
fn a_get_answer_can_be_sent_back() {
    let r = put(r#"{"servers":[{"address":"10.0.0.1:8080","weight":1,"max_fails":1,"fail_timeout_ms":10000,"backup":false,"down":false,"active":4}]}"#).unwrap();
    assert_eq!(r.servers.len(), 1);
    assert_eq!(r.generation, None);
}

#[test]
fn refuses_bad_input_with_clear_messages() {
    let cases: &[(&str, u16, &str)] = &[
        ("{", 400, "bad JSON"),
        ("", 400, "empty body"),
        (
            r#"{"servers":[{"address":"backend.local:80"}]}"#,
            400,
            "addresses only",
        ),
        (
            r#"{"servers":[{"address":"10.0.0.1"}]}"#,
            400,
            "has no port",
        ),
        (r#"{"servers":[{"address":"10.0.0.1:0"}]}"#, 400, "port 0"),
        (
            r#"{"servers":[{"address":"unix:rel.sock"}]}"#,
            400,
            "absolute",
        ),
        (
            r#"{"servers":[{"address":"10.0.0.1:80","weight":0}]}"#,
            400,
            "weight must be",
        ),
        (
            r#"{"servers":[{"address":"10.0.0.1:80","fail_timeout_ms":1500}]}"#,
            400,
            "whole seconds",
        ),
        (
            r#"{"servers":[{"address":"10.0.0.1:80"},{"address":"10.0.0.1:80"}]}"#,
            400,
            "listed twice",
        ),
        (
            r#"{"servers":[{"address":"10.0.0.1:80","backup":true}]}"#,
            400,
            "not backup",
        ),
        (r#"{"servers":[]}"#, 400, "not backup"),
        (
            r#"{"servers":[{"address":"10.0.0.1:80","wieght":2}]}"#,
            400,
            "unknown field",
        ),
        (r#"{"generation":1}"#, 400, "missing field `servers`"),
        (
            r#"{"servers":[{"address":"10.0.0.1:80"}],"generation":-1}"#,
            400,
            "bad JSON",
        ),
    ];
    for (body, status, text) in cases {
        let e = put(body).expect_err(body);
        assert_eq!(e.status, *status, "{body}: {e}");
        assert!(e.message.contains(text), "{body}: {e}");
    }
}

#[test]
fn limits_servers_and_body_size() {
    let one = r#"{"address":"10.0.0.1:1"}"#;
    let many: Vec<String> = (1..=MAX_SERVERS + 1)
        .map(|i| format!(r#"{{"address":"10.0.{}.{}:80"}}"#, i / 256, i % 256))
        .collect();
    let e = put(&format!(r#"{{"servers":[{}]}}"#, many.join(","))).unwrap_err();
    assert_eq!(e.status, 400);
    assert!(e.message.contains("at most 16384"), "{e}");
    let ok: Vec<String> = many[..MAX_SERVERS].to_vec();
    assert_eq!(
        put(&format!(r#"{{"servers":[{}]}}"#, ok.join(",")))
            .unwrap()
            .servers
            .len(),
        MAX_SERVERS
    );
    let big = format!(r#"{{"servers":[{one}]{}}}"#, " ".repeat(MAX_BODY));
    assert_eq!(put(&big).unwrap_err().status, 413);
}

#[test]
fn plan_keeps_adds_removes_and_sees_identical_sets() {
    let current = vec![
        cur("10.0.0.1:80", false),
        cur("10.0.0.2:80", false),
        cur("10.0.0.9:80", true),
    ];
    let same = put(r#"{"servers":[{"address":"10.0.0.2:80"},{"address":"10.0.0.1:80"},{"address":"10.0.0.9:80","backup":true}]}"#).unwrap();
    assert!(plan(&current, &same.servers).unchanged);

    let w = put(r#"{"servers":[{"address":"10.0.0.2:80","weight":5},{"address":"10.0.0.3:80"},{"address":"10.0.0.1:80","backup":true}]}"#).unwrap();
    let p = plan(&current, &w.servers);
    assert!(!p.unchanged);
    assert_eq!(p.keep, vec![(1, 0)]);
    assert_eq!(p.add, vec![1, 2]);
    assert_eq!(p.remove, vec![0, 2]);

    let settings = put(r#"{"servers":[{"address":"10.0.0.1:80","down":true},{"address":"10.0.0.2:80"},{"address":"10.0.0.9:80","backup":true}]}"#).unwrap();
    let p = plan(&current, &settings.servers);
    assert!(!p.unchanged);
    assert_eq!(p.keep.len(), 3);
    assert!(p.add.is_empty() && p.remove.is_empty());
}

#[test]
fn totals_match_round_robin_init() {
    let w = put(r#"{"servers":[{"address":"10.0.0.1:80","weight":3},{"address":"10.0.0.2:80","down":true},{"address":"10.0.0.3:80","backup":true}]}"#).unwrap();
    let p = totals(&w.servers, false);
    assert_eq!(
        (p.number, p.total_weight, p.tries, p.single, p.weighted),
        (2, 4, 1, false, true)
    );
    let b = totals(&w.servers, true);
    assert_eq!(
        (b.number, b.total_weight, b.tries, b.single, b.weighted),
        (1, 1, 1, false, false)
    );
    let one =
        put(r#"{"servers":[{"address":"10.0.0.1:80"},{"address":"10.0.0.3:80","backup":true}]}"#)
            .unwrap();
    assert!(
        !totals(&one.servers, false).single,
        "a primary with backups is never single"
    );
    let alone = put(r#"{"servers":[{"address":"10.0.0.1:80"}]}"#).unwrap();
    assert!(totals(&alone.servers, false).single);
}

#[test]
fn routes_paths() {
    assert_eq!(route(b""), Some(Route::List));
    assert_eq!(route(b"/"), Some(Route::List));
    assert_eq!(route(b"/app"), Some(Route::Upstream("app".into())));
    assert_eq!(route(b"/a/b"), None);
}

#[test]
fn a_path_glued_to_the_location_prefix_names_nothing() {
    // `location /api` sees `/apiapp` with the rest `app`: not the upstream `app`.
    assert_eq!(route(b"app"), None);
    assert_eq!(route(b"-x"), None);
    assert_eq!(route(b"/a/b"), None);
    assert_eq!(route(b"/a%2fb"), None);
}

#[test]
fn renders_json() {
    let v = render::UpstreamView {
        generation: 3,
        servers: vec![render::ServerView {
            id: Some(7),
            address: "10.0.0.1:80".into(),
            weight: 1,
            max_fails: 1,
            fail_timeout_ms: 10_000,
            max_conns: 0,
            backup: false,
            down: false,
            drain: false,
            active: 2,
            fails: 0,
            health: None,
            stats: Some(Default::default()),
        }],
        retiring: 1,
        retired: vec![],
        rebalanced: 0,
        probe: None,
    };
    assert_eq!(
        v.to_json(),
        r#"{"generation":3,"servers":[{"id":7,"address":"10.0.0.1:80","weight":1,"max_fails":1,"fail_timeout_ms":10000,"max_conns":0,"backup":false,"down":false,"drain":false,"active":2,"fails":0,"stats":{"requests":0,"responses":{"1xx":0,"2xx":0,"3xx":0,"4xx":0,"5xx":0,"total":0},"sent":0,"received":0,"fails":0,"unavail":0,"downtime":0,"downstart_ms":0,"selected_ms":0,"header_time":0,"response_time":0}}],"retiring":1,"rebalanced":0}"#
    );
    assert_eq!(
        ApiError::unknown_upstream("x\"y").to_json(),
        r#"{"error":"no upstream \"x\"y\" in the running configuration"}"#
    );
}

#[test]
fn retired_servers_are_listed_with_their_age_when_there_are_some() {
    let v = render::UpstreamView {
        generation: 3,
        servers: vec![],
        retiring: 1,
        retired: vec![render::RetiredView {
            address: "10.0.0.2:80".into(),
            active: 1,
            age_ms: 61_000,
        }],
        rebalanced: 0,
        probe: None,
    };
    assert_eq!(
        v.to_json(),
        r#"{"generation":3,"servers":[],"retiring":1,"retired":[{"address":"10.0.0.2:80","active":1,"age_ms":61000}],"rebalanced":0}"#
    );
}

#[test]
fn every_field_of_a_get_answer_is_accepted_back() {
    let probe_conf =
        crate::live::probe::ProbeConf::parse(&["interval=1s", "slow_start=5s"]).unwrap();
    let v = render::ServerView {
        id: Some(3),
        address: "10.0.0.1:80".into(),
        weight: 2,
        max_fails: 3,
        fail_timeout_ms: 5_000,
        max_conns: 0,
        backup: false,
        down: false,
        drain: true,
        active: 2,
        fails: 1,
        health: Some(crate::live::probe::HealthState::new_server(true).view(&probe_conf, 10)),
        stats: Some(crate::live::stats::ServerStats {
            requests: 5,
            health_checks: Some(Default::default()),
            ..Default::default()
        }),
    };
    let view = render::UpstreamView {
        generation: 9,
        servers: vec![v],
        retiring: 1,
        retired: vec![render::RetiredView {
            address: "10.0.0.9:80".into(),
            active: 1,
            age_ms: 1_500,
        }],
        rebalanced: 4,
        probe: Some(probe_conf.view()),
    };
    let body = view.to_json();
    let r = put(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
    assert_eq!(r.generation, Some(9));
    assert_eq!(r.servers[0].weight, 2);
    assert_eq!(r.servers[0].max_fails, 3);
}

#[test]
fn max_conns_is_carried() {
    let r =
        put(r#"{"servers":[{"address":"10.0.0.1:80","max_conns":7},{"address":"10.0.0.2:80"}]}"#)
            .unwrap();
    assert_eq!((r.servers[0].max_conns, r.servers[1].max_conns), (7, 0));
    let mut c = cur("10.0.0.1:80", false);
    c.max_conns = 7;
    assert!(plan(std::slice::from_ref(&c), &r.servers[..1]).unchanged);
    c.max_conns = 8;
    assert!(!plan(&[c], &r.servers[..1]).unchanged);
}

#[test]
fn unspecified_multicast_and_broadcast_addresses_are_refused() {
    for a in [
        "0.0.0.0:80",
        "[::]:80",
        "224.0.0.1:80",
        "239.1.2.3:80",
        "[ff02::1]:80",
        "255.255.255.255:80",
        "[::ffff:0.0.0.0]:80",
        "[::ffff:224.0.0.1]:80",
    ] {
        let e = Addr::parse(a).expect_err(a);
        assert_eq!(e.status, 400, "{a}: {e}");
        assert!(e.message.contains(a), "{a}: {e}");
    }
    for a in ["10.0.0.255:80", "127.0.0.1:80", "[::1]:80", "[fe80::1]:80"] {
        assert!(Addr::parse(a).is_ok(), "{a}");
    }
}

#[test]
fn the_log_line_names_client_upstream_changes_and_generation() {
    let current = vec![cur("10.0.0.1:80", false), cur("10.0.0.2:80", false)];
    let w = put(r#"{"servers":[{"address":"10.0.0.2:80"},{"address":"10.0.0.3:80"}]}"#).unwrap();
    let p = plan(&current, &w.servers);
    let v = render::PutView {
        generation: 42,
        changed: true,
        added: 1,
        removed: 1,
        retiring: 0,
        names: p.names(&current, &w.servers),
    };
    assert_eq!(
        v.log_line("127.0.0.1", "app"),
        "upstreams_api: client 127.0.0.1 changed upstream \"app\": added 1 (10.0.0.3:80), removed 1 (10.0.0.1:80), generation 42"
    );
    assert!(
        !v.to_json().contains("10.0.0.3"),
        "names stay out of the answer"
    );
    let many = render::PutView {
        added: 20,
        removed: 0,
        names: render::ChangedNames {
            added: (0..20).map(|i| format!("10.0.1.{i}:80")).collect(),
            removed: vec![],
        },
        ..v
    };
    let line = many.log_line("unix:", "app");
    assert!(
        line.contains("10.0.1.15:80 and 4 more), removed 0 (-)"),
        "{line}"
    );
}

#[test]
fn zone_full_names_the_size_needed_in_text_and_fields() {
    let need = render::ZoneNeed {
        zone_bytes: 65536,
        needed_bytes: 111_616,
        in_use_bytes: 49152,
        change_bytes: 51520,
        servers_added: 20,
        per_server_bytes: 2576,
        tls_session_bytes: 2048,
    };
    let e = ApiError::zone_full("up", "z", need.clone());
    assert_eq!(e.status, 507);
    assert!(
        e.message.starts_with(
            "zone \"z\" too small: about 111616 bytes needed for this set (zone is 65536)"
        ),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("2048 for the TLS session"),
        "{}",
        e.message
    );
    let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
    assert_eq!(v["error"], e.message.as_str());
    assert_eq!(v["needed_bytes"], 111_616);
    assert_eq!(v["zone_bytes"], 65536);
    assert_eq!(v["per_server_bytes"], 2576);
    assert_eq!(v["tls_session_bytes"], 2048);
    assert_eq!(v["servers_added"], 20);
    // Other errors keep their one field.
    let v: serde_json::Value =
        serde_json::from_str(&ApiError::unknown_upstream("x").to_json()).unwrap();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1));
}

#[test]
fn overdue_retired_line_names_the_servers_and_the_way_out() {
    let one = [render::RetiredView {
        address: "10.0.0.2:8080".into(),
        active: 1,
        age_ms: 61_500,
    }];
    assert_eq!(
        render::overdue_retired_line("app", &one, 60_000),
        "upstreams_api: upstream \"app\": removed server 10.0.0.2:8080 (1 active, removed 61 s ago) still counted connections longer than retired_warn=60s after removal: if no request to it can last that long, a worker died holding them (nginx never gives back a dead worker's counts), and it keeps its zone memory until a reload frees it"
    );
    let many: Vec<render::RetiredView> = (0..18)
        .map(|i| render::RetiredView {
            address: format!("10.0.0.{i}:80"),
            active: 2,
            age_ms: 1_500,
        })
        .collect();
    let line = render::overdue_retired_line("app", &many, 1_500);
    assert!(line.contains("removed servers 10.0.0.0:80 (2 active, removed 1 s ago), "));
    assert!(line.contains("10.0.0.15:80 (2 active, removed 1 s ago), and 2 more still"));
    assert!(!line.contains("10.0.0.16:80"));
    assert!(line.contains("retired_warn=1500ms"));
    assert!(line.contains("each keeps its zone memory"));
}

#[test]
fn drain_is_parsed_per_server_and_independent_of_down() {
    let r = put(r#"{"servers":[{"address":"10.0.0.1:80","drain":true},
            {"address":"10.0.0.2:80","drain":true,"down":true},{"address":"10.0.0.3:80"}]}"#)
    .unwrap();
    let flags: Vec<(bool, bool)> = r.servers.iter().map(|s| (s.down, s.drain)).collect();
    assert_eq!(flags, [(false, true), (true, true), (false, false)]);
    let e = put(r#"{"servers":[{"address":"10.0.0.1:80","drain":"yes"}]}"#).unwrap_err();
    assert_eq!(e.status, 400);
}

#[test]
fn draining_or_undraining_a_kept_server_is_a_change_and_costs_a_try() {
    let current = [cur("10.0.0.1:80", false), cur("10.0.0.2:80", false)];
    let mut wanted =
        put(r#"{"servers":[{"address":"10.0.0.1:80"},{"address":"10.0.0.2:80","drain":true}]}"#)
            .unwrap()
            .servers;
    let p = plan::plan(&current, &wanted);
    assert!(!p.unchanged, "a drain is a change");
    assert_eq!((p.keep.len(), p.add.len(), p.remove.len()), (2, 0, 0));
    assert_eq!(totals(&wanted, false).tries, 1);
    let mut drained = current.clone();
    drained[1].drain = true;
    assert!(plan::plan(&drained, &wanted).unchanged);
    wanted[1].drain = false;
    let p = plan::plan(&drained, &wanted);
    assert!(!p.unchanged, "an undrain is a change");
    assert_eq!(p.keep.len(), 2);
    assert_eq!(totals(&wanted, false).tries, 2);
}
