//! The wire types read back: what the module writes, the daemon reads (`render.rs`, `put.rs`),
//! with the same defaults for absent fields and tolerance of fields it does not know.

use super::render::{ErrorView, ListView, PutView, ServerView, UpstreamView, ZoneNeed};
use super::*;

fn server(id: u64, address: &str) -> ServerView {
    ServerView {
        id: Some(id),
        address: address.to_string(),
        weight: 2,
        max_fails: 3,
        fail_timeout_ms: 20_000,
        max_conns: 0,
        backup: false,
        down: false,
        drain: false,
        active: 1,
        fails: 0,
        health: None,
        stats: Some(Default::default()),
    }
}

/// A `GET <loc>/NAME` answer of this module, as it writes it.
fn current() -> UpstreamView {
    let mut one = server(4, "10.0.0.1:80");
    one.drain = true;
    let conf = probe::ProbeConf::parse(&["interval=1s"]).unwrap();
    one.health = Some(probe::HealthState::new_server(true).view(&conf, 0));
    UpstreamView {
        generation: 7,
        servers: vec![one, server(5, "[::1]:81")],
        retiring: 1,
        retired: vec![render::RetiredView {
            address: "10.0.0.9:80".into(),
            active: 2,
            age_ms: 1500,
        }],
        rebalanced: 3,
        probe: Some(conf.view()),
    }
}

#[test]
fn what_the_module_writes_reads_back_equal() {
    let v = current();
    let back: UpstreamView = serde_json::from_str(&v.to_json()).unwrap();
    assert_eq!(back, v);
    assert_eq!(
        back.servers[0].health.as_ref().map(|h| h.health),
        Some(probe::Health::Checking)
    );
}

#[test]
fn an_older_module_reads_with_the_defaults_of_a_put() {
    // Before ids, statistics, drain, max_conns, health and the figures of the set.
    let old = r#"{"generation": 2, "servers": [{"address": "10.0.0.1:80", "weight": 3,
        "active": 1, "fails": 0, "backup": false, "down": true}, {"address": "10.0.0.2:80"}]}"#;
    let v: UpstreamView = serde_json::from_str(old).unwrap();
    assert_eq!((v.generation, v.retiring, v.rebalanced), (2, 0, 0));
    assert!(v.retired.is_empty() && v.probe.is_none());
    let a = &v.servers[0];
    assert_eq!((a.weight, a.down, a.active), (3, true, 1));
    assert_eq!((a.id, a.stats, a.health.clone()), (None, None, None));
    // Every absent setting is what a PUT leaving it out sets.
    let put = parse_put(br#"{"servers": [{"address": "10.0.0.2:80"}]}"#).unwrap();
    let (b, p) = (&v.servers[1], &put.servers[0]);
    assert_eq!(b.weight, u64::from(p.weight));
    assert_eq!(b.max_fails, u64::from(p.max_fails));
    assert_eq!(b.fail_timeout_ms, u64::from(p.fail_timeout_s) * 1000);
    assert_eq!(b.max_conns, u64::from(p.max_conns));
    assert_eq!((b.backup, b.down, b.drain), (p.backup, p.down, p.drain));
    // The listing of a module that did not say whether it takes PUTs: it took them always.
    let l: ListView =
        serde_json::from_str(r#"{"upstreams": [{"name": "api", "generation": 7}]}"#).unwrap();
    assert!(l.write);
    assert_eq!(
        (l.upstreams[0].name.as_str(), l.upstreams[0].generation),
        ("api", 7)
    );
    let p: PutView = serde_json::from_str(r#"{"generation": 8}"#).unwrap();
    assert_eq!((p.generation, p.changed, p.added), (8, false, 0));
}

#[test]
fn a_newer_module_reads_ignoring_what_this_side_does_not_know() {
    let mut v = serde_json::to_value(current()).unwrap();
    v["new_figure"] = 1.into();
    v["probe"] = serde_json::json!({"type": "grpc", "interval_ms": 1000});
    v["servers"][0]["health"] = "warming".into();
    v["servers"][0]["new_field"] = serde_json::json!([1, 2]);
    v["servers"][0]["stats"]["new_counter"] = 3.into();
    let back: UpstreamView = serde_json::from_value(v).unwrap();
    // A probe type or health word this side does not know: shown as none, never an error.
    assert_eq!(back.probe, None);
    assert_eq!(back.servers[0].health, None);
    assert!(back.servers[0].drain);
    assert_eq!(back.servers[0].id, Some(4));
    assert!(back.servers[1].stats.is_some());
}

#[test]
fn a_507_reads_with_the_size_the_zone_needs() {
    let need = ZoneNeed {
        zone_bytes: 65_536,
        needed_bytes: 123_904,
        in_use_bytes: 40_000,
        change_bytes: 80_000,
        servers_added: 30,
        per_server_bytes: 2_666,
        tls_session_bytes: 0,
    };
    let e = ApiError::zone_full("api", "api", need.clone());
    let back: ErrorView = serde_json::from_str(&e.to_json()).unwrap();
    assert_eq!(back.need, Some(need));
    assert!(
        back.error.starts_with("zone \"api\" too small"),
        "{}",
        back.error
    );
    // Without the figures (another error, or a module that does not give them).
    let plain: ErrorView = serde_json::from_str(&ApiError::busy("api", 1).to_json()).unwrap();
    assert_eq!(plain.need, None);
    let partial: ErrorView =
        serde_json::from_str(r#"{"error": "zone full", "needed_bytes": 5}"#).unwrap();
    assert_eq!(partial.need, None);
}

#[test]
fn a_put_body_the_daemon_writes_is_what_the_module_reads() {
    let mut drained = ServerSpec::new("10.0.0.2:80".into(), 2);
    drained.drain = true;
    drained.backup = true;
    let body = PutBody::new(
        vec![ServerSpec::new("10.0.0.1:80".into(), 3), drained],
        Some(9),
    );
    let text = serde_json::to_string(&body).unwrap();
    // Defaults a module before `drain`/`max_conns` would refuse as unknown are left out.
    assert!(
        !text.contains("max_conns") && text.matches("drain").count() == 1,
        "{text}"
    );
    assert_eq!(serde_json::from_str::<PutBody>(&text).unwrap(), body);
    let req = parse_put(text.as_bytes()).unwrap();
    assert_eq!(req.generation, Some(9));
    assert_eq!((req.servers[0].weight, req.servers[0].drain), (3, false));
    assert_eq!(
        (
            req.servers[1].backup,
            req.servers[1].drain,
            req.servers[1].fail_timeout_s
        ),
        (true, true, 10)
    );
    // A GET answer sent back unchanged is a valid body.
    let get = current().to_json();
    assert_eq!(parse_put(get.as_bytes()).unwrap().servers.len(), 2);
}
