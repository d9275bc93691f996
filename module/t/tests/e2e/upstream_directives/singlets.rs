//! `combine_server_singlets` (name forms, backup, sticky sessions) and `extend_single_peers`.

use super::*;

/// Default names, suffix, width, `byname`, `suffix byname`, and "servers so far".
pub(super) fn singlets_all_name_forms() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream uhost { server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; server 127.0.0.1:{P3} backup;
                          combine_server_singlets; server 127.0.0.1:{P4}; }
         upstream w { server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; combine_server_singlets _single_ 2; }
         upstream n { server 127.0.0.1:{P2}; combine_server_singlets _x_; }
         upstream bn { server 127.0.0.1:{P3}; server 127.0.0.1:{P4}; combine_server_singlets byname; }
         upstream sb { server 127.0.0.1:{P1}; combine_server_singlets _x_ byname; }
         server { listen 127.0.0.1:{P0};
                  location / { proxy_pass http://$arg_u; } }",
    ))?;
    ng.expect_log("no resolver defined to resolve uhost4");
    let p = |i: usize| ng.ports()[i];
    let cases = [
        ("uhost1".to_string(), "b1"),
        ("uhost2".to_string(), "b2"),
        ("uhost3".to_string(), "b3"),
        ("w_single_01".to_string(), "b1"),
        ("w_single_02".to_string(), "b2"),
        ("n_x_1".to_string(), "b2"),
        (format!("bn127.0.0.1_{}", p(3)), "b3"),
        (format!("bn127.0.0.1_{}", p(4)), "b4"),
        (format!("sb_x_127.0.0.1_{}", p(1)), "b1"),
    ];
    for (name, want) in &cases {
        for _ in 0..3 {
            let r = ng.get_on(0, &format!("/?u={name}"))?;
            check_eq(
                (r.status, r.text().as_str()),
                (200, *want),
                &format!("singlet {name}"),
            )?;
        }
    }
    // the server declared after combine_server_singlets has no singlet
    let r = ng.get_on(0, "/?u=uhost4")?;
    check(r.status == 502, || {
        format!("uhost4 must not exist, got {} {:?}", r.status, r.text())
    })?;
    expect_emerg(
        "upstream uhost { server 127.0.0.1:{P1}; combine_server_singlets; server 127.0.0.1:{P2}; }
         upstream c { add_upstream uhost2; }",
        "upstream \"uhost2\" not found",
    )
}

/// Default mode: the other servers are backups (the singlet fails over); `nobackup`: they are
/// down (no failover).
pub(super) fn singlets_backup_and_nobackup() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream d { server 127.0.0.1:{DEAD}; server 127.0.0.1:{P2}; combine_server_singlets; }
         upstream nb { server 127.0.0.1:{DEAD}; server 127.0.0.1:{P2}; combine_server_singlets _n_ nobackup; }
         server { listen 127.0.0.1:{P0};
                  add_header X-Upstream $upstream_addr always;
                  location / { proxy_pass http://$arg_u; } }",
    ))?;
    ng.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let r = ng.get_on(0, "/?u=d1")?;
    check_eq(
        (r.status, r.text().as_str()),
        (200, "b2"),
        "d1: dead primary, backup answers",
    )?;
    let r = ng.get_on(0, "/?u=d2")?;
    check_eq((r.status, r.text().as_str()), (200, "b2"), "d2")?;
    let r = ng.get_on(0, "/?u=nb_n_1")?;
    check_eq(r.status, 502, "nb_n_1: dead primary, other server down")?;
    let r = ng.get_on(0, "/?u=nb_n_2")?;
    check_eq((r.status, r.text().as_str()), (200, "b2"), "nb_n_2")
}

/// The seed's sticky-session example: backends in their own nginx instances so one can be
/// stopped while the proxy keeps running.
pub(super) fn singlets_sticky_sessions() -> CaseResult {
    let ports = ngx_harness::free_ports(ngx_harness::PORTS);
    let backend = |n: usize| {
        format!(
            "server {{ listen 127.0.0.1:{{P{n}}}; server_name server{n};
               location / {{ add_header Set-Cookie \"rt={n}\"; return 200 \"Passed to $server_name\"; }} }}"
        )
    };
    let mut b1 = Some(Nginx::start_on(&backend(1), &ports)?);
    let mut b2 = Some(Nginx::start_on(&backend(2), &ports)?);
    let main = Nginx::start_on(
        "upstream uhost { server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; combine_server_singlets; }
         server { listen 127.0.0.1:{P0}; server_name main;
                  location / { proxy_pass http://uhost$cookie_rt; } }",
        &ports,
    )?;
    main.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let first = main.get_on(0, "/")?;
    check_eq(first.status, 200, "first request")?;
    let cookie = first
        .header("Set-Cookie")
        .ok_or("no Set-Cookie on the first answer")?
        .to_string();
    let pinned: usize = cookie
        .trim_start_matches("rt=")
        .parse()
        .map_err(|_| format!("cookie {cookie:?}"))?;
    for _ in 0..6 {
        let r = main.get_with(0, "/", &[("Cookie", &cookie)])?;
        check_eq(
            r.text(),
            format!("Passed to server{pinned}"),
            "pinned by the cookie",
        )?;
    }
    // the pinned server goes down: its singlet's backup (the other server) answers and re-pins
    if pinned == 1 {
        b1.take()
    } else {
        b2.take()
    };
    let other = 3 - pinned;
    let r = main.get_with(0, "/", &[("Cookie", &cookie)])?;
    check_eq(
        (r.status, r.text()),
        (200, format!("Passed to server{other}")),
        "failover",
    )?;
    check_eq(
        r.header("Set-Cookie"),
        Some(format!("rt={other}").as_str()),
        "new cookie",
    )?;
    let cookie = format!("rt={other}");
    for _ in 0..3 {
        let r = main.get_with(0, "/", &[("Cookie", &cookie)])?;
        check_eq(
            r.text(),
            format!("Passed to server{other}"),
            "pinned to the survivor",
        )?;
    }
    drop((b1, b2));
    Ok(())
}

pub(super) const DEAD_SINGLE: &str = "
    upstream ext { server 127.0.0.1:{DEAD} max_fails=1 fail_timeout=60s; extend_single_peers; }
    upstream plain { server 127.0.0.1:{DEAD} max_fails=1 fail_timeout=60s; }
    upstream lc { least_conn; server 127.0.0.1:{DEAD} max_fails=1 fail_timeout=60s; extend_single_peers; }
    upstream live { server 127.0.0.1:{P1}; extend_single_peers; }
    upstream two { server 127.0.0.1:{P1}; server 127.0.0.1:{P2}; extend_single_peers; }
    server { listen 127.0.0.1:{P0};
             add_header X-Upstream $upstream_addr always;
             location / { proxy_pass http://$arg_u; } }";

/// A lone dead primary behind `max_fails=1`: with the directive the second request gets
/// "no live upstreams" without trying the server; without it, the server is tried every time.
pub(super) fn extend_single_peers_marks_lone_peer_failed() -> CaseResult {
    let ng = Nginx::start(&with_backends(DEAD_SINGLE))?;
    ng.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    ng.expect_log("no live upstreams while connecting to upstream");
    // Failed-peer state is per worker: one keep-alive connection, one worker.
    let mut conn = ng.keep_alive(0)?;
    let dead = format!("127.0.0.1:{}", ng.dead_port());
    for u in ["ext", "lc"] {
        let r = conn.get(&format!("/?u={u}"))?;
        check_eq(r.status, 502, &format!("{u}: first request"))?;
        check(
            r.header("X-Upstream").unwrap_or("").starts_with(&dead),
            || {
                format!(
                    "{u}: first request must try the server, upstream_addr {:?}",
                    r.header("X-Upstream")
                )
            },
        )?;
        for _ in 0..3 {
            let r = conn.get(&format!("/?u={u}"))?;
            check_eq(
                (r.status, r.header("X-Upstream")),
                (502, Some(u)),
                &format!("{u}: no live upstreams"),
            )?;
        }
    }
    check(ng.error_log().contains("no live upstreams"), || {
        "error log lacks \"no live upstreams\"".into()
    })?;
    for _ in 0..4 {
        let r = conn.get("/?u=plain")?;
        check_eq(
            (r.status, r.header("X-Upstream")),
            (502, Some(dead.as_str())),
            "plain: tried again",
        )?;
    }
    Ok(())
}

/// The fake peer never answers and does not change a part with more peers.
pub(super) fn extend_single_peers_keeps_live_traffic() -> CaseResult {
    let ng = Nginx::start(&with_backends(DEAD_SINGLE))?;
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/?u=live", 5)?,
        counts(&[("b1", 5)]),
        "lone live server",
    )?;
    check_eq(
        tally(&mut conn, "/?u=two", 6)?,
        counts(&[("b1", 3), ("b2", 3)]),
        "two servers",
    )
}

/// A balancer directive after `extend_single_peers` replaces it: nginx -t warns.
pub(super) fn extend_single_peers_warns_when_overridden() -> CaseResult {
    let stderr = expect_ok(
        "upstream u { server 127.0.0.1:{P1}; extend_single_peers; least_conn; }
         upstream ok { least_conn; server 127.0.0.1:{P1}; extend_single_peers; keepalive 4; }",
    )?;
    let warn = "\"extend_single_peers\" has no effect in upstream \"u\"";
    check(stderr.contains(warn), || {
        format!("expected warning {warn:?}, got:\n{stderr}")
    })?;
    check(!stderr.contains("in upstream \"ok\""), || {
        format!("false warning:\n{stderr}")
    })
}
