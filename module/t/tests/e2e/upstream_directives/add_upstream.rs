//! `add_upstream`: weights, attributes, `max_fails`/`fail_timeout`, backups, chains, snapshots
//! and implicit upstreams.

use super::*;

/// `add_upstream u2 weight=2` splits 1:2 exactly like the hand-written upstream, request by request.
pub(super) fn add_upstream_weights_like_hand_written() -> CaseResult {
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
pub(super) fn add_upstream_keeps_attributes() -> CaseResult {
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
pub(super) const FAILING: &str = "
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
pub(super) fn dead_tries(
    conn: &mut KeepAlive,
    u: &str,
    dead: &str,
    n: usize,
) -> Result<usize, Failed> {
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
pub(super) fn add_upstream_keeps_max_fails_and_fail_timeout() -> CaseResult {
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
pub(super) fn add_upstream_backup_only_when_primary_down() -> CaseResult {
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
pub(super) fn add_upstream_chains() -> CaseResult {
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
pub(super) fn add_upstream_is_a_snapshot() -> CaseResult {
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
pub(super) fn add_upstream_from_implicit_upstream() -> CaseResult {
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
