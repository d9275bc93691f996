use serde_json::Value;

use super::*;
use crate::plus::body;
use crate::plus::view::tests::{server, upstream};

fn fields(json: &str) -> ServerFields {
    body::parse(json.as_bytes()).unwrap()
}

fn names(p: &PutRequest) -> Vec<String> {
    p.servers.iter().map(|s| s.addr.name()).collect()
}

fn two() -> UpstreamView {
    let mut b = server(5, "10.0.0.2:80");
    b.weight = 3;
    b.drain = true;
    upstream(vec![server(0, "10.0.0.1:80"), b])
}

#[test]
fn add_appends_with_nginx_defaults_and_the_read_generation() {
    let p = plan(&two(), &WriteOp::Add(fields(r#"{"server":"10.0.0.3:81"}"#))).unwrap();
    assert_eq!(p.generation, Some(7));
    assert_eq!(names(&p), ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:81"]);
    let n = &p.servers[2];
    assert_eq!(
        (
            n.weight,
            n.max_fails,
            n.fail_timeout_s,
            n.max_conns,
            n.backup,
            n.down,
            n.drain
        ),
        (1, 1, 10, 0, false, false, false)
    );
    // The others go back as they are.
    assert_eq!((p.servers[1].weight, p.servers[1].drain), (3, true));
    let p = plan(
        &two(),
        &WriteOp::Add(fields(
            r#"{"server":"10.0.0.4","weight":2,"backup":true,"down":true,"fail_timeout":"1m"}"#,
        )),
    )
    .unwrap();
    let n = &p.servers[2];
    assert_eq!(n.addr.name(), "10.0.0.4:80");
    assert_eq!(
        (n.weight, n.backup, n.down, n.fail_timeout_s),
        (2, true, true, 60)
    );
}

#[test]
fn add_refuses_an_existing_address_and_a_missing_one_and_ignores_an_id() {
    let e = plan(&two(), &WriteOp::Add(fields(r#"{"server":"10.0.0.2:80"}"#))).unwrap_err();
    assert_eq!((e.status, e.code), (409, "EntryExists"));
    let e = plan(&two(), &WriteOp::Add(fields(r#"{"weight":2}"#))).unwrap_err();
    assert_eq!((e.status, e.code), (400, "UpstreamConfFormatError"));
    assert!(e.text.contains("missing \"server\""));
    // An id sent back is ignored: the planned set is the same as without it.
    let with_id = plan(
        &two(),
        &WriteOp::Add(fields(r#"{"server":"10.0.0.9:80","id":0}"#)),
    );
    let without = plan(&two(), &WriteOp::Add(fields(r#"{"server":"10.0.0.9:80"}"#)));
    assert_eq!(with_id.unwrap(), without.unwrap());
}

#[test]
fn patch_changes_only_the_given_fields_of_that_server() {
    let p = plan(
        &two(),
        &WriteOp::Patch(5, fields(r#"{"weight":9,"drain":false}"#)),
    )
    .unwrap();
    assert_eq!(names(&p), ["10.0.0.1:80", "10.0.0.2:80"]);
    assert_eq!((p.servers[1].weight, p.servers[1].drain), (9, false));
    assert_eq!(
        p.servers[0],
        plan(&two(), &WriteOp::Delete(5)).unwrap().servers[0]
    );
    // Sending back what GET .../servers/ID gave changes nothing.
    let same = serde_json::to_string(&ConfServer::of(&two().servers[1])).unwrap();
    let p = plan(&two(), &WriteOp::Patch(5, fields(&same))).unwrap();
    assert_eq!(
        p.servers,
        plan(&two(), &WriteOp::Patch(5, ServerFields::default()))
            .unwrap()
            .servers
    );
    assert_eq!((p.servers[1].weight, p.servers[1].drain), (3, true));
}

#[test]
fn patch_refuses_unknown_ids_and_immutable_fields() {
    let e = plan(&two(), &WriteOp::Patch(1, ServerFields::default())).unwrap_err();
    assert_eq!((e.status, e.code), (404, "UpstreamServerNotFound"));
    for body in [r#"{"server":"10.0.0.9:80"}"#, r#"{"backup":true}"#] {
        let e = plan(&two(), &WriteOp::Patch(5, fields(body))).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (400, "UpstreamServerImmutable"),
            "{body}"
        );
    }
    let e = plan(&two(), &WriteOp::Patch(5, fields(r#"{"id":6}"#))).unwrap_err();
    assert_eq!((e.status, e.code), (400, "UpstreamBadServerId"));
    assert!(plan(
        &two(),
        &WriteOp::Patch(5, fields(r#"{"id":5,"server":"10.0.0.2"}"#))
    )
    .is_ok());
}

#[test]
fn delete_removes_one_and_keeps_a_primary() {
    let p = plan(&two(), &WriteOp::Delete(0)).unwrap();
    assert_eq!(names(&p), ["10.0.0.2:80"]);
    let e = plan(&two(), &WriteOp::Delete(9)).unwrap_err();
    assert_eq!((e.status, e.code), (404, "UpstreamServerNotFound"));
    let mut u = two();
    u.servers[1].backup = true;
    let e = plan(&u, &WriteOp::Delete(0)).unwrap_err();
    assert_eq!((e.status, e.code), (400, "UpstreamServerImmutable"));
    assert!(plan(&u, &WriteOp::Delete(5)).is_ok());
}

#[test]
fn a_set_with_a_duplicate_address_is_not_rewritten() {
    let u = upstream(vec![server(0, "10.0.0.1:80"), server(1, "10.0.0.1:80")]);
    let e = plan(&u, &WriteOp::Patch(0, fields(r#"{"weight":2}"#))).unwrap_err();
    assert_eq!((e.status, e.code), (409, "UpstreamConflict"));
}

#[test]
fn answers_read_the_set_back() {
    let add = WriteOp::Add(fields(r#"{"server":"10.0.0.2:80"}"#));
    let (status, body) = answer(&add, &two()).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, v["id"].as_u64()), (201, Some(5)));
    let gone = WriteOp::Add(fields(r#"{"server":"10.0.0.8:80"}"#));
    let (status, body) = answer(&gone, &two()).unwrap();
    assert_eq!(
        (status, body.as_str()),
        (201, r#"{"server":"10.0.0.8:80"}"#)
    );
    let (status, body) = answer(&WriteOp::Patch(0, ServerFields::default()), &two()).unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["server"],
        "10.0.0.1:80"
    );
    assert_eq!(
        answer(&WriteOp::Patch(3, ServerFields::default()), &two())
            .unwrap_err()
            .status,
        404
    );
    let (status, body) = answer(&WriteOp::Delete(3), &two()).unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}
