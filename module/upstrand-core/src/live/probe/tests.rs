//! Unit tests of `probe/`.

use super::*;

fn conf(p: &str) -> ProbeConf {
    ProbeConf::parse(&p.split_whitespace().collect::<Vec<_>>()).unwrap()
}

fn err(p: &str) -> String {
    ProbeConf::parse(&p.split_whitespace().collect::<Vec<_>>())
        .unwrap_err()
        .to_string()
}

#[test]
fn parses_the_issue_example_and_defaults() {
    let c = conf("uri=/healthz interval=1s timeout=500ms fails=2 passes=2 status=200-399");
    assert_eq!(c.uri, "/healthz");
    assert_eq!(
        (c.interval_ms, c.timeout_ms, c.fails, c.passes),
        (1000, 500, 2, 2)
    );
    assert_eq!(c.status, (200, 399));
    assert_eq!(c.kind, ProbeType::Http);
    let d = conf("");
    assert_eq!(
        (d.interval_ms, d.timeout_ms, d.fails, d.passes),
        (5000, 1000, 1, 1)
    );
    let short = conf("interval=200ms");
    assert_eq!(
        short.timeout_ms, 200,
        "the default timeout is at most the interval"
    );
    let all = conf("type=tcp port=9000 mandatory slow_start=30s");
    assert_eq!(all.kind, ProbeType::Tcp);
    assert_eq!(all.port, Some(9000));
    assert!(all.mandatory);
    assert_eq!(all.slow_start_ms, 30_000);
    assert_eq!(conf("status=204").status, (204, 204));
}

#[test]
fn refuses_bad_parameters_with_their_reason() {
    assert_eq!(
        err("urx=/"),
        "invalid parameter \"urx=/\" in \"probe\" directive: the parameters are uri=, \
         interval=, timeout=, fails=, passes=, status=, type=http|tcp, port=, host=, body=, \
         mandatory and slow_start="
    );
    assert!(err("uri=healthz").contains("starting with \"/\""));
    assert!(err("interval=0").contains("interval takes a time"));
    assert!(err("interval=5ms").contains("interval takes a time"));
    assert!(err("fails=0").contains("from 1 to 1000"));
    assert!(err("status=600").contains("100 to 599"));
    assert!(err("status=399-200").contains("low end"));
    assert!(err("type=udp").contains("http or tcp"));
    assert!(err("port=0").contains("port takes"));
    assert!(err("host=a/b").contains("host name"));
    assert!(err("fails=2 fails=3").contains("given twice"));
    assert!(err("type=tcp uri=/x").contains("only for type=http"));
    assert!(err("mandatory=yes").contains("the parameters are"));
    assert!(err("slow_start=1d").contains("slow_start takes a time"));
    assert_eq!(
        err("interval=1s timeout=2s"),
        "invalid \"probe\" directive: timeout is longer than interval"
    );
}

#[test]
fn request_names_the_uri_and_host() {
    let c = conf("uri=/h?x=1 host=api.example");
    let r = String::from_utf8(c.request("app")).unwrap();
    assert!(r.starts_with("GET /h?x=1 HTTP/1.0\r\nHost: api.example\r\n"));
    assert!(r.ends_with("\r\n\r\n"));
    assert!(String::from_utf8(conf("").request("app"))
        .unwrap()
        .contains("Host: app\r\n"));
}

#[test]
fn judges_answers() {
    let c = conf("status=200-299");
    assert_eq!(
        judge_answer(&c, b"HTTP/1.1 200 OK\r\n", false),
        Some(Outcome::Pass { status: 200 })
    );
    assert_eq!(judge_answer(&c, b"HTTP/1.1 20", false), None);
    assert_eq!(
        judge_answer(&c, b"HTTP/1.0 503 Busy\r\n\r\n", false),
        Some(Outcome::Fail {
            why: Failure::Status,
            errno: 0,
            status: 503
        })
    );
    assert_eq!(
        judge_answer(&c, b"", true),
        Some(Outcome::Fail {
            why: Failure::NoAnswer,
            errno: 0,
            status: 0
        })
    );
    assert_eq!(
        judge_answer(&c, b"SSH-2.0\r\n", false),
        Some(Outcome::Fail {
            why: Failure::BadAnswer,
            errno: 0,
            status: 0
        })
    );
    let b = conf("body=ready");
    let head = b"HTTP/1.1 200 OK\r\nX: ready\r\n\r\n";
    assert_eq!(
        judge_answer(&b, head, false),
        None,
        "the header does not count"
    );
    assert_eq!(
        judge_answer(&b, head, true),
        Some(Outcome::Fail {
            why: Failure::BodyMismatch,
            errno: 0,
            status: 200
        })
    );
    let mut full = head.to_vec();
    full.extend_from_slice(b"all ready\n");
    assert_eq!(
        judge_answer(&b, &full, false),
        Some(Outcome::Pass { status: 200 })
    );
    assert_eq!(judge_status_line(b"HTTP/1.1 204"), Some(204));
    assert_eq!(judge_status_line(b"HTTP/1.1 2040 x"), None);
}

#[test]
fn health_follows_fails_and_passes() {
    let c = conf("fails=2 passes=2");
    let fail = Outcome::Fail {
        why: Failure::Timeout,
        errno: 0,
        status: 0,
    };
    let pass = Outcome::Pass { status: 200 };
    let mut s = HealthState::new_server(false);
    assert_eq!(s.record(&c, fail, 10), Transition::None);
    assert_eq!(s.health(), Health::Healthy);
    assert_eq!(
        s.record(&c, pass, 20),
        Transition::None,
        "a pass resets the fails"
    );
    assert_eq!(s.record(&c, fail, 30), Transition::None);
    assert_eq!(s.record(&c, fail, 40), Transition::BecameUnhealthy);
    assert_eq!(s.health(), Health::Unhealthy);
    assert_eq!(s.last_change_ms, 40);
    assert_eq!(s.error_text().as_deref(), Some("timeout"));
    assert_eq!(s.record(&c, fail, 50), Transition::None);
    assert_eq!(s.record(&c, pass, 60), Transition::None);
    assert_eq!(s.record(&c, pass, 70), Transition::BecameHealthy);
    assert_eq!(s.health(), Health::Healthy);
    assert_eq!(s.error_text(), None);
    let v = s.view(&c, 100);
    assert_eq!(v.last_probe_ms_ago, Some(30));
    assert_eq!(v.last_status, Some(200));
    assert_eq!(v.slow_start_remaining_ms, None);
}

#[test]
fn mandatory_servers_pass_once_and_slow_start_begins() {
    let c = conf("mandatory fails=3 passes=3 slow_start=10s");
    let mut s = HealthState::new_server(true);
    assert_eq!(s.health(), Health::Checking);
    let refused = Outcome::Fail {
        why: Failure::Connect,
        errno: 111,
        status: 0,
    };
    assert_eq!(s.record(&c, refused, 5), Transition::None);
    assert_eq!(
        s.health(),
        Health::Checking,
        "checking stays checking until a pass"
    );
    assert_eq!(
        s.error_text().as_deref(),
        Some("connect: connection refused")
    );
    assert_eq!(
        s.record(&c, Outcome::Pass { status: 200 }, 1000),
        Transition::BecameHealthy
    );
    assert_eq!(s.slow_start_remaining(&c, 4000), 7000);
    assert_eq!(s.slow_start_remaining(&c, 20_000), 0);
    let j = serde_json::to_value(s.view(&c, 4000)).unwrap();
    assert_eq!(j["health"], "healthy");
    assert_eq!(j["slow_start_remaining_ms"], 7000);
    assert!(j.get("last_error").is_none());
}

#[test]
fn slow_start_ramps_the_available_share() {
    let c = conf("slow_start=10s");
    let s = HealthState::added(&c, 1000);
    assert_eq!(s.health(), Health::Healthy);
    assert_eq!(s.ramp_fraction(&c, 1000), Some(0.0));
    assert_eq!(s.ramp_fraction(&c, 6000), Some(0.5));
    assert_eq!(s.ramp_fraction(&c, 11_000), None);
    let m = conf("slow_start=10s mandatory");
    let s = HealthState::added(&m, 1000);
    assert_eq!(s.health(), Health::Checking);
    assert_eq!(
        s.ramp_fraction(&m, 2000),
        None,
        "no ramp before the first pass"
    );
    // Over 1,000 slots at a fraction of 0.1, available in 100.
    let mut credit = 0.0;
    let on = (0..1000).filter(|_| ramp_slot(&mut credit, 0.1)).count();
    assert!((99..=101).contains(&on), "{on}");
    let mut credit = 0.0;
    assert!(!(0..10).any(|_| ramp_slot(&mut credit, 0.0)));
}

#[test]
fn view_of_the_upstream() {
    let j = serde_json::to_value(conf("type=tcp interval=300ms").view()).unwrap();
    assert_eq!(j["type"], "tcp");
    assert_eq!(j["interval_ms"], 300);
    assert!(j.get("uri").is_none());
}
