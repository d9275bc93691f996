//! Cases for `add_upstream`, `combine_server_singlets` and `extend_single_peers` against a real
//! nginx with the module loaded. Every row is a named test; run directly it ends with
//! `N passed, N failed`.
//!
//! Backends are `server {}` blocks of the same nginx answering `return 200 "bN"` on `{P1}`…`{P4}`;
//! `{DEAD}` is a port nobody listens on (a dead server).
//!
//! nginx runs with its master process and 2 workers (the harness default). Round-robin state and
//! failed-peer accounting of an upstream without a `zone` are per worker, so cases that count
//! answers or follow a sequence send their requests over one keep-alive connection: one worker
//! serves them all, and the exact per-worker behaviour is asserted.

use std::collections::BTreeMap;

use crate::case::Case;
use ngx_harness::{check, check_eq, expect_emerg, expect_ok, CaseResult, Failed, KeepAlive, Nginx};

const BACKENDS: &str = r#"
server { listen 127.0.0.1:{P1}; return 200 "b1"; }
server { listen 127.0.0.1:{P2}; return 200 "b2"; }
server { listen 127.0.0.1:{P3}; return 200 "b3"; }
server { listen 127.0.0.1:{P4}; return 200 "b4"; }
"#;

/// `nginx -t` must fail with this `[emerg]` text.
const EMERG: &[(&str, &str, &str)] = &[
    (
        "add_upstream_unknown_name",
        "upstream c { add_upstream nope; }",
        "upstream \"nope\" not found",
    ),
    (
        "add_upstream_name_defined_later",
        "upstream c { add_upstream u1; } upstream u1 { server 127.0.0.1:{P1}; }",
        "upstream \"u1\" not found",
    ),
    (
        "add_upstream_self_reference",
        "upstream c { server 127.0.0.1:{P1}; add_upstream c; }",
        "upstream \"c\" makes recursion",
    ),
    (
        "add_upstream_backup_twice",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 backup backup; }",
        "parameter \"backup\" has been already declared",
    ),
    (
        "add_upstream_weight_twice",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 weight=2 weight=3; }",
        "parameter \"weight\" has been already declared",
    ),
    (
        "add_upstream_weight_zero",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 weight=0; }",
        "parameter \"weight\" must be a positive integer value",
    ),
    (
        "add_upstream_weight_not_a_number",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 weight=2x; }",
        "parameter \"weight\" must be a positive integer value",
    ),
    (
        "add_upstream_backup_prefix_is_not_backup",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 backupx; }",
        "invalid parameter \"backupx\"",
    ),
    (
        "add_upstream_too_many_arguments",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { add_upstream u1 backup weight=2 x; }",
        "invalid number of arguments in \"add_upstream\" directive",
    ),
    (
        "add_upstream_outside_upstream",
        "upstream u1 { server 127.0.0.1:{P1}; } server { listen 127.0.0.1:{P0}; add_upstream u1; }",
        "\"add_upstream\" directive is not allowed here",
    ),
    (
        "add_upstream_implicit_upstream_without_servers",
        "server { listen 127.0.0.1:{P0}; location / { proxy_pass http://localhost; } }
         upstream c { add_upstream localhost; }",
        "upstream \"localhost\" has no server list to copy",
    ),
    (
        "add_upstream_backup_into_balancer_without_backup",
        "upstream u1 { server 127.0.0.1:{P1}; } upstream c { hash $uri; add_upstream u1 backup; }",
        "balancing method does not support parameter \"backup\"",
    ),
    (
        "add_upstream_weight_overflow",
        "upstream u1 { server 127.0.0.1:{P1} weight=100; }
         upstream c { add_upstream u1 weight=4294967296; }",
        "is too large in upstream \"u1\"",
    ),
    (
        "singlets_byname_with_width",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets byname 2; }",
        "setting field width is not permitted when using \"byname\" value",
    ),
    (
        "singlets_suffix_byname_with_width",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ byname 2; }",
        "setting field width is not permitted when using \"byname\" value",
    ),
    (
        "singlets_width_not_an_integer",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ two; }",
        "field width \"two\" must be an integer value",
    ),
    (
        "singlets_extra_parameter",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ 2 3; }",
        "invalid parameter \"3\"",
    ),
    (
        "singlets_too_many_arguments",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _x_ 2 3 nobackup; }",
        "invalid number of arguments in \"combine_server_singlets\" directive",
    ),
    (
        "singlets_name_collides_with_earlier_upstream",
        "upstream u1 { server 127.0.0.1:{P2}; }
         upstream u { server 127.0.0.1:{P1}; combine_server_singlets; }",
        "duplicate upstream \"u1\"",
    ),
    (
        "singlets_name_collides_with_later_upstream",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets _s_; }
         upstream u_s_1 { server 127.0.0.1:{P2}; }",
        "duplicate upstream \"u_s_1\"",
    ),
    (
        "singlets_byname_same_server_twice",
        "upstream u { server 127.0.0.1:{P1}; server 127.0.0.1:{P1}; combine_server_singlets byname; }",
        "duplicate upstream \"u127.0.0.1_",
    ),
    (
        "singlets_twice_in_one_upstream",
        "upstream u { server 127.0.0.1:{P1}; combine_server_singlets; combine_server_singlets; }",
        "duplicate upstream \"u1\"",
    ),
    (
        "singlets_outside_upstream",
        "combine_server_singlets;",
        "\"combine_server_singlets\" directive is not allowed here",
    ),
    (
        "extend_single_peers_duplicate",
        "upstream u { server 127.0.0.1:{P1}; extend_single_peers; extend_single_peers; }",
        "\"extend_single_peers\" directive is duplicate",
    ),
    (
        "extend_single_peers_with_argument",
        "upstream u { server 127.0.0.1:{P1}; extend_single_peers on; }",
        "invalid number of arguments in \"extend_single_peers\" directive",
    ),
    (
        "extend_single_peers_outside_upstream",
        "server { listen 127.0.0.1:{P0}; extend_single_peers; }",
        "\"extend_single_peers\" directive is not allowed here",
    ),
];

/// Sends `n` requests to `path` over `conn` (one worker) and counts the bodies.
fn tally(conn: &mut KeepAlive, path: &str, n: usize) -> Result<BTreeMap<String, usize>, Failed> {
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let r = conn.get(path)?;
        check_eq(r.status, 200, &format!("status of {path}"))?;
        *m.entry(r.text()).or_insert(0) += 1;
    }
    Ok(m)
}

/// Bodies of `n` answers to `path` over `conn` (one worker), in order.
fn sequence(conn: &mut KeepAlive, path: &str, n: usize) -> Result<Vec<String>, Failed> {
    (0..n).map(|_| Ok(conn.get(path)?.text())).collect()
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn with_backends(http: &str) -> String {
    format!("{BACKENDS}\n{http}")
}

/// `add_upstream u2 weight=2` splits 1:2 exactly like the hand-written upstream, request by request.
fn add_upstream_weights_like_hand_written() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream u1 { server 127.0.0.1:{P1}; }
         upstream u2 { server 127.0.0.1:{P2}; }
         upstream c { add_upstream u1; add_upstream u2 weight=2; }
         upstream h { server 127.0.0.1:{P1}; server 127.0.0.1:{P2} weight=2; }
         server { listen 127.0.0.1:{P0};
                  location /c { proxy_pass http://c; }
                  location /h { proxy_pass http://h; } }",
    ))?;
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/c", 30)?,
        counts(&[("b1", 10), ("b2", 20)]),
        "split through c",
    )?;
    let c = sequence(&mut conn, "/c", 12)?;
    let h = sequence(&mut conn, "/h", 12)?;
    check_eq(c, h, "order of answers, combined vs hand-written")
}

/// Source weights are kept and multiplied; `down` is kept (`max_fails`/`fail_timeout`: see
/// [`add_upstream_keeps_max_fails_and_fail_timeout`]).
fn add_upstream_keeps_attributes() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream u1 { server 127.0.0.1:{P1} weight=3 max_fails=2 fail_timeout=5s; server 127.0.0.1:{P2}; }
         upstream u2 { server 127.0.0.1:{P3} down; server 127.0.0.1:{P4}; }
         upstream c { add_upstream u1 weight=2; }
         upstream d { add_upstream u2; }
         server { listen 127.0.0.1:{P0};
                  location /c { proxy_pass http://c; }
                  location /d { proxy_pass http://d; } }",
    ))?;
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/c", 40)?,
        counts(&[("b1", 30), ("b2", 10)]),
        "weights 6:2",
    )?;
    check_eq(
        tally(&mut conn, "/d", 6)?,
        counts(&[("b4", 6)]),
        "down server of the source stays down",
    )
}

/// Upstreams whose first server is dead, with the failure accounting of `src` (`max_fails=2
/// fail_timeout=1s`), `zero` (`max_fails=0`: never marked failed) and `dflt` (nginx's defaults,
/// `max_fails=1 fail_timeout=10s`), and copies of the first two through `add_upstream`.
const FAILING: &str = "
    upstream src { server 127.0.0.1:{DEAD} max_fails=2 fail_timeout=1s; server 127.0.0.1:{P1}; }
    upstream zero { server 127.0.0.1:{DEAD} max_fails=0; server 127.0.0.1:{P1}; }
    upstream dflt { server 127.0.0.1:{DEAD}; server 127.0.0.1:{P1}; }
    upstream src_copy { add_upstream src; }
    upstream zero_copy { add_upstream zero; }
    server { listen 127.0.0.1:{P0};
             add_header X-Upstream $upstream_addr always;
             location / { proxy_pass http://$arg_u; } }";

/// How many of `n` requests through upstream `u` (over `conn`: one worker, whose failed-peer
/// state is being observed) tried the dead server before the live one answered.
fn dead_tries(conn: &mut KeepAlive, u: &str, dead: &str, n: usize) -> Result<usize, Failed> {
    let mut tries = 0;
    for _ in 0..n {
        let r = conn.get(&format!("/?u={u}"))?;
        check_eq(
            (r.status, r.text().as_str()),
            (200, "b1"),
            &format!("{u}: the live server answers"),
        )?;
        tries += usize::from(r.header("X-Upstream").unwrap_or("").contains(dead));
    }
    Ok(tries)
}

/// `add_upstream` keeps `max_fails` and `fail_timeout` of the copied servers: the copy skips a
/// dead server after the same number of failures and tries it again after the same time as the
/// original, which differs from nginx's defaults (so a copy that lost them would fail).
fn add_upstream_keeps_max_fails_and_fail_timeout() -> CaseResult {
    let ng = Nginx::start(&with_backends(FAILING))?;
    ng.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let mut conn = ng.keep_alive(0)?;
    let dead = format!("127.0.0.1:{}", ng.dead_port());
    let ups = ["src", "src_copy", "zero", "zero_copy", "dflt"];
    // A burst well inside the 1 s fail_timeout, then one after it has passed (nginx counts whole
    // seconds: 2.5 s is more than 1 s for any start time, and less than the default 10 s).
    let mut first = BTreeMap::new();
    for u in ups {
        first.insert(u, dead_tries(&mut conn, u, &dead, 8)?);
    }
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut second = BTreeMap::new();
    for u in ups {
        second.insert(u, dead_tries(&mut conn, u, &dead, 8)?);
    }
    let seen = |u: &str| (first[u], second[u]);
    check_eq(seen("dflt"), (1, 0), "defaults: one failure, then 10 s off")?;
    check_eq(
        seen("src"),
        (2, 1),
        "max_fails=2 fail_timeout=1s: two failures, then tried again after 1 s",
    )?;
    check_eq(
        seen("src_copy"),
        seen("src"),
        "copy of src behaves like src",
    )?;
    check(first["zero"] >= 3 && second["zero"] >= 3, || {
        format!(
            "max_fails=0: the dead server stays in the rotation, {:?}",
            seen("zero")
        )
    })?;
    check_eq(
        seen("zero_copy"),
        seen("zero"),
        "copy of zero behaves like zero",
    )
}

/// Servers copied with `backup` answer only when the primary ones are down.
fn add_upstream_backup_only_when_primary_down() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream u1 { server 127.0.0.1:{P1}; }
         upstream u2 { server 127.0.0.1:{P2}; }
         upstream dead { server 127.0.0.1:{DEAD}; }
         upstream live { add_upstream u1; add_upstream u2 backup; }
         upstream failover { add_upstream dead; add_upstream u2 backup; }
         server { listen 127.0.0.1:{P0};
                  location /live { proxy_pass http://live; }
                  location /failover { proxy_pass http://failover; } }",
    ))?;
    ng.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/live", 8)?,
        counts(&[("b1", 8)]),
        "primary alive: backup unused",
    )?;
    check_eq(
        tally(&mut conn, "/failover", 4)?,
        counts(&[("b2", 4)]),
        "primary down: backup answers",
    )
}

/// C adds B which added A; a later `server` line of the host is added after the copies.
fn add_upstream_chains() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream a { server 127.0.0.1:{P1}; }
         upstream b { add_upstream a; server 127.0.0.1:{P2}; }
         upstream c { add_upstream b; server 127.0.0.1:{P3}; }
         server { listen 127.0.0.1:{P0}; location / { proxy_pass http://c; } }",
    ))?;
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/", 9)?,
        counts(&[("b1", 3), ("b2", 3), ("b3", 3)]),
        "chain a -> b -> c",
    )
}

/// Snapshot: a singlet used as a source has the servers of its host only up to
/// `combine_server_singlets`; the host's later `server` lines are not seen by the copy.
fn add_upstream_is_a_snapshot() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "upstream h { server 127.0.0.1:{P1}; combine_server_singlets; server 127.0.0.1:{P2}; }
         upstream c { add_upstream h; }
         upstream s { add_upstream h1; }
         server { listen 127.0.0.1:{P0};
                  location /c { proxy_pass http://c; }
                  location /s { proxy_pass http://s; } }",
    ))?;
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/c", 4)?,
        counts(&[("b1", 2), ("b2", 2)]),
        "copy of h",
    )?;
    check_eq(
        tally(&mut conn, "/s", 4)?,
        counts(&[("b1", 4)]),
        "copy of singlet h1",
    )
}

/// An upstream implied by `proxy_pass http://127.0.0.1:PORT` can be a source.
fn add_upstream_from_implicit_upstream() -> CaseResult {
    let ng = Nginx::start(&with_backends(
        "server { listen 127.0.0.1:{P0};
                  location /direct { proxy_pass http://127.0.0.1:{P3}; }
                  location /c { proxy_pass http://c; } }
         upstream c { add_upstream 127.0.0.1; }",
    ))?;
    let mut conn = ng.keep_alive(0)?;
    check_eq(
        tally(&mut conn, "/c", 3)?,
        counts(&[("b3", 3)]),
        "through the copy",
    )
}

/// Default names, suffix, width, `byname`, `suffix byname`, and "servers so far".
fn singlets_all_name_forms() -> CaseResult {
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
fn singlets_backup_and_nobackup() -> CaseResult {
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
fn singlets_sticky_sessions() -> CaseResult {
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

const DEAD_SINGLE: &str = "
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
fn extend_single_peers_marks_lone_peer_failed() -> CaseResult {
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
fn extend_single_peers_keeps_live_traffic() -> CaseResult {
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
fn extend_single_peers_warns_when_overridden() -> CaseResult {
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

/// The module loads and an empty configuration with it passes `nginx -t`.
fn module_loads() -> CaseResult {
    expect_ok("").map(|_| ())
}

/// The cases of this area, named without the area (`main.rs` adds it).
pub fn cases() -> Vec<Case> {
    let mut trials: Vec<Case> = vec![
        Case::test("module_loads", module_loads),
        Case::test(
            "add_upstream_weights_like_hand_written",
            add_upstream_weights_like_hand_written,
        ),
        Case::test(
            "add_upstream_keeps_attributes",
            add_upstream_keeps_attributes,
        ),
        Case::test(
            "add_upstream_keeps_max_fails_and_fail_timeout",
            add_upstream_keeps_max_fails_and_fail_timeout,
        ),
        Case::test(
            "add_upstream_backup_only_when_primary_down",
            add_upstream_backup_only_when_primary_down,
        ),
        Case::test("add_upstream_chains", add_upstream_chains),
        Case::test("add_upstream_is_a_snapshot", add_upstream_is_a_snapshot),
        Case::test(
            "add_upstream_from_implicit_upstream",
            add_upstream_from_implicit_upstream,
        ),
        Case::test("singlets_all_name_forms", singlets_all_name_forms),
        Case::test("singlets_backup_and_nobackup", singlets_backup_and_nobackup),
        Case::test("singlets_sticky_sessions", singlets_sticky_sessions),
        Case::test(
            "extend_single_peers_marks_lone_peer_failed",
            extend_single_peers_marks_lone_peer_failed,
        ),
        Case::test(
            "extend_single_peers_keeps_live_traffic",
            extend_single_peers_keeps_live_traffic,
        ),
        Case::test(
            "extend_single_peers_warns_when_overridden",
            extend_single_peers_warns_when_overridden,
        ),
    ];
    trials.extend(
        EMERG
            .iter()
            .map(|(name, http, want)| Case::emerg(format!("emerg_{name}"), http, want)),
    );
    trials
}
