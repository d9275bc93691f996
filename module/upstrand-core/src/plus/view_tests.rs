use serde_json::{json, Value};

use super::*;
use crate::live::probe::HealthView;
use crate::live::stats::ServerStats;

pub(crate) fn server(id: u64, address: &str) -> ServerView {
    ServerView {
        id: Some(id),
        address: address.to_string(),
        weight: 1,
        max_fails: 1,
        fail_timeout_ms: 10_000,
        max_conns: 0,
        backup: false,
        down: false,
        drain: false,
        active: 0,
        fails: 0,
        health: None,
        stats: Some(ServerStats::default()),
    }
}

pub(crate) fn upstream(servers: Vec<ServerView>) -> UpstreamView {
    UpstreamView {
        generation: 7,
        servers,
        retiring: 0,
        retired: Vec::new(),
        rebalanced: 0,
        probe: None,
    }
}

fn health(h: Health) -> Option<HealthView> {
    Some(HealthView {
        health: h,
        probe_fails: 0,
        probe_passes: 0,
        last_probe_ms_ago: None,
        last_status: None,
        last_error: None,
        slow_start_remaining_ms: None,
    })
}

fn json_of<T: Serialize>(v: &T) -> Value {
    serde_json::from_str(&to_json(v)).unwrap()
}

#[test]
fn peer_state_follows_down_bits_health_and_passive_failures() {
    let s = server(0, "10.0.0.1:80");
    assert_eq!(peer_state(&s), "up");
    let with = |f: &dyn Fn(&mut ServerView)| {
        let mut s = s.clone();
        f(&mut s);
        peer_state(&s)
    };
    assert_eq!(with(&|s| s.down = true), "down");
    assert_eq!(with(&|s| s.drain = true), "draining");
    assert_eq!(with(&|s| s.health = health(Health::Checking)), "checking");
    assert_eq!(with(&|s| s.health = health(Health::Unhealthy)), "unhealthy");
    assert_eq!(with(&|s| s.health = health(Health::Healthy)), "up");
    assert_eq!(with(&|s| s.fails = 1), "unavail");
    assert_eq!(
        with(&|s| {
            s.fails = 5;
            s.max_fails = 0
        }),
        "up"
    );
    // The configured down wins over everything, drain over health.
    assert_eq!(
        with(&|s| {
            s.down = true;
            s.drain = true;
            s.health = health(Health::Unhealthy)
        }),
        "down"
    );
    assert_eq!(
        with(&|s| {
            s.drain = true;
            s.health = health(Health::Unhealthy)
        }),
        "draining"
    );
}

#[test]
fn a_peer_has_plus_field_names_and_types() {
    let mut s = server(3, "10.0.0.1:8080");
    s.weight = 5;
    s.active = 2;
    s.max_conns = 20;
    s.backup = true;
    s.stats.as_mut().unwrap().requests = 10;
    s.stats.as_mut().unwrap().responses.c2xx = 9;
    s.stats.as_mut().unwrap().responses.c5xx = 1;
    s.stats.as_mut().unwrap().responses.total = 10;
    s.stats.as_mut().unwrap().sent = 100;
    s.stats.as_mut().unwrap().received = 200;
    s.stats.as_mut().unwrap().fails = 1;
    s.stats.as_mut().unwrap().unavail = 0;
    s.stats.as_mut().unwrap().downtime = 0;
    s.stats.as_mut().unwrap().selected_ms = 1_656_414_561_602;
    s.stats.as_mut().unwrap().header_time = 4;
    s.stats.as_mut().unwrap().response_time = 6;
    let v = json_of(&PeerView::of(&s));
    assert_eq!(
        v,
        json!({
            "id": 3, "server": "10.0.0.1:8080", "name": "10.0.0.1:8080", "backup": true,
            "weight": 5, "state": "up", "active": 2, "max_conns": 20, "requests": 10,
            "responses": {"1xx": 0, "2xx": 9, "3xx": 0, "4xx": 0, "5xx": 1, "total": 10},
            "sent": 100, "received": 200, "fails": 1, "unavail": 0,
            "health_checks": {"checks": 0, "fails": 0, "unhealthy": 0},
            "downtime": 0, "selected": "2022-06-28T11:09:21.602Z",
            "header_time": 4, "response_time": 6
        })
    );
    // Nothing answered yet: no averages, no instants.
    let v = json_of(&PeerView::of(&server(0, "10.0.0.1:80")));
    for absent in ["header_time", "response_time", "selected", "downstart"] {
        assert!(v.get(absent).is_none(), "{absent}: {v}");
    }
    let mut down = server(0, "10.0.0.1:80");
    down.stats.as_mut().unwrap().downstart_ms = 1000;
    down.stats.as_mut().unwrap().health_checks = Some(HealthChecks {
        checks: 4,
        fails: 2,
        unhealthy: 1,
        last_passed: Some(false),
    });
    let v = json_of(&PeerView::of(&down));
    assert_eq!(v["downstart"], "1970-01-01T00:00:01.000Z");
    assert_eq!(
        v["health_checks"],
        json!({"checks": 4, "fails": 2, "unhealthy": 1, "last_passed": false})
    );
}

#[test]
fn an_upstream_has_peers_zombies_and_zone() {
    let mut u = upstream(vec![server(0, "10.0.0.1:80"), server(4, "10.0.0.2:80")]);
    u.retiring = 2;
    let v = json_of(&UpstreamPlus::of(&u, "z1"));
    assert_eq!(v["zombies"], 2);
    assert_eq!(v["zone"], "z1");
    assert_eq!(v["peers"][1]["id"], 4);
    assert_eq!(v.as_object().unwrap().len(), 3);
}

#[test]
fn a_conf_server_has_plus_fields() {
    let mut s = server(1, "10.0.0.1:8089");
    s.weight = 4;
    s.backup = true;
    s.down = true;
    s.fail_timeout_ms = 60_000;
    let v = json_of(&ConfServer::of(&s));
    assert_eq!(
        v,
        json!({"id": 1, "server": "10.0.0.1:8089", "weight": 4, "max_conns": 0,
               "max_fails": 1, "fail_timeout": "60s", "slow_start": "0s", "route": "",
               "backup": true, "down": true, "drain": false})
    );
    let all = json_of(&ConfServer::all(&upstream(vec![
        s.clone(),
        server(2, "[::1]:80"),
    ])));
    assert_eq!(all.as_array().unwrap().len(), 2);
}

#[test]
fn connections_and_requests_come_from_stub_counters() {
    let c = StubCounters {
        accepted: 100,
        handled: 98,
        active: 7,
        reading: 1,
        writing: 2,
        waiting: 4,
        requests: 250,
    };
    assert_eq!(
        json_of(&c.connections()),
        json!({"accepted": 100, "dropped": 2, "active": 3, "idle": 4})
    );
    assert_eq!(json_of(&c.requests()), json!({"total": 250, "current": 3}));
}

#[test]
fn slabs_have_pages_and_slots_by_size() {
    let f = SlabFigures {
        pages_total: 10,
        pages_free: 7,
        slots: vec![
            SlotFigures {
                size: 8,
                total: 0,
                used: 0,
                reqs: 0,
                fails: 0,
            },
            SlotFigures {
                size: 128,
                total: 32,
                used: 3,
                reqs: 5,
                fails: 1,
            },
            SlotFigures {
                size: 16,
                total: 0,
                used: 0,
                reqs: 0,
                fails: 0,
            },
        ],
    };
    let v = json_of(&SlabZone::of(&f));
    assert_eq!(v["pages"], json!({"used": 3, "free": 7}));
    assert_eq!(
        v["slots"]["128"],
        json!({"used": 3, "free": 29, "reqs": 5, "fails": 1})
    );
    assert_eq!(v["slots"].as_object().unwrap().len(), 3);
}

#[test]
fn nginx_info_leaves_out_what_is_unknown() {
    let i = NginxInfo {
        version: "1.22.1".into(),
        build: None,
        address: "127.0.0.1".into(),
        generation: None,
        load_timestamp: None,
        timestamp: "2026-01-01T00:00:00.000Z".into(),
        pid: 10,
        ppid: 9,
    };
    let v = json_of(&i);
    assert_eq!(
        v,
        json!({"version": "1.22.1", "address": "127.0.0.1",
               "timestamp": "2026-01-01T00:00:00.000Z", "pid": 10, "ppid": 9})
    );
}
