//! Cases for the per-worker state of `upstrand`: the round-robin cursor (`order`, also moved by
//! `$upstrand_NAME` outside `proxy_pass`) and the blacklist, against Debian's nginx with the
//! module loaded (master process, 2 workers). Layout as in `upstrand/mod.rs`. A worker's state is
//! observed over one keep-alive connection, which that worker serves; `start_random` is observed
//! over many workers. Run directly it ends with `N passed, N failed`.

use std::time::Duration;

use crate::case::Case;
use ngx_harness::{check, check_eq, CaseResult, Failed, KeepAlive, Nginx, Options};

use crate::upstrand_common::*;

// ---- 3. order -----------------------------------------------------------------------------

/// u01, u02, u03 (by regex) answering `s`, with the `order` line `order` (may be empty).
fn ordered(order: &str, s: [u16; 3]) -> String {
    config(
        &[("u01", 1), ("u02", 2), ("u03", 3)],
        &format!("upstrand us1 {{ upstream ~^u0; {order} next_upstream_statuses 5xx; }}"),
        "location / { proxy_pass http://$upstrand_us1; }",
        &[(1, "u01", s[0]), (2, "u02", s[1]), (3, "u03", s[2])],
    )
}

/// `X-From` of `count` answers to `GET /` in a row.
fn from_sequence(conn: &mut KeepAlive, count: usize) -> Result<Vec<String>, Failed> {
    (0..count).map(|_| answered_by(conn)).collect()
}

fn order_default_round_robin() -> CaseResult {
    let n = Nginx::start(&ordered("", [200, 200, 200]))?;
    let seq = from_sequence(&mut n.keep_alive(0)?, 7)?;
    check_eq(
        seq.join(","),
        "u01,u02,u03,u01,u02,u03,u01".to_string(),
        "one step per request",
    )?;
    // Failover does not move the cursor more than one step per request.
    let n = Nginx::start(&ordered("", [503, 200, 200]))?;
    let seq = from_sequence(&mut n.keep_alive(0)?, 4)?;
    check_eq(
        seq.join(","),
        "u02,u02,u03,u02".to_string(),
        "starts u01,u02,u03,u01",
    )?;
    check_path(&n, 0, "u01 -> u02", "path 1")?;
    check_path(&n, 2, "u03", "path 3")
}

fn rotation_ok(seq: &[String]) -> bool {
    let idx = |s: &str| ["u01", "u02", "u03"].iter().position(|x| *x == s);
    seq.windows(2).all(|w| match (idx(&w[0]), idx(&w[1])) {
        (Some(a), Some(b)) => b == (a + 1) % 3,
        _ => false,
    })
}

fn order_start_random() -> CaseResult {
    let n = Nginx::start(&ordered("order start_random;", [200, 200, 200]))?;
    let seq = from_sequence(&mut n.keep_alive(0)?, 9)?;
    check(rotation_ok(&seq), || {
        format!("round robin after a random start: {seq:?}")
    })
}

/// Fresh nginx starts for [`order_start_random_differs_across_workers`].
const RANDOM_STARTS: usize = 5;
/// Workers per start.
const RANDOM_WORKERS: usize = 4;

/// `start_random` draws each worker's start at random. Over [`RANDOM_STARTS`] fresh starts of
/// [`RANDOM_WORKERS`] workers (`listen ... reuseport` spreads new connections over the workers;
/// `X-Pid` names the one that answered), the first answer of every worker is its start, and the
/// following answers of each worker continue the rotation. With 3 members and uniform starts:
/// - all 20 starts equal (what a fixed start always gives) has probability 3^-19 ≈ 9e-10;
/// - every start's workers agreeing (what a start drawn once in the master, before the fork,
///   gives) has probability (3^-3)^5 = 3^-15 ≈ 7e-8.
fn order_start_random_differs_across_workers() -> CaseResult {
    let http = ordered("order start_random;", [200, 200, 200])
        .replace("listen 127.0.0.1:{P0};", "listen 127.0.0.1:{P0} reuseport;")
        .replace(
            "location / { proxy_pass",
            "location / { add_header X-Pid $pid; proxy_pass",
        );
    let mut all_firsts = Vec::new();
    let mut mixed_starts = 0;
    for _ in 0..RANDOM_STARTS {
        let n = Options::new().workers(RANDOM_WORKERS).start(&http)?;
        let mut seqs: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for _ in 0..400 {
            let a = n.get_on(0, "/")?;
            check_eq(a.status, 200, "status")?;
            let pid = a.header("X-Pid").ok_or("no X-Pid")?.to_string();
            let from = a.header("X-From").ok_or("no X-From")?.to_string();
            seqs.entry(pid).or_default().push(from);
            if seqs.len() == RANDOM_WORKERS && seqs.values().all(|s| s.len() >= 3) {
                break;
            }
        }
        check(
            seqs.len() == RANDOM_WORKERS && seqs.values().all(|s| s.len() >= 3),
            || format!("400 requests did not reach every worker 3 times: {seqs:?}"),
        )?;
        for (pid, seq) in &seqs {
            check(rotation_ok(seq), || {
                format!("worker {pid}: round robin after a random start: {seq:?}")
            })?;
        }
        let firsts: std::collections::BTreeSet<&String> = seqs.values().map(|s| &s[0]).collect();
        mixed_starts += usize::from(firsts.len() > 1);
        all_firsts.extend(seqs.values().map(|s| s[0].clone()));
        n.stop()?;
    }
    let distinct: std::collections::BTreeSet<&String> = all_firsts.iter().collect();
    check(distinct.len() > 1, || {
        format!("all {} worker starts were {distinct:?}", all_firsts.len())
    })?;
    check(mixed_starts > 0, || {
        format!(
            "in each of {RANDOM_STARTS} starts all workers began at the same upstream \
             (drawn before the fork?): {all_firsts:?}"
        )
    })
}

fn order_per_request() -> CaseResult {
    let n = Nginx::start(&ordered("order per_request;", [503, 503, 200]))?;
    for i in 0..3 {
        // new connections: any worker, always the same walk
        check_eq(n.get_on(0, "/")?.header("X-From"), Some("u03"), "answer")?;
        check_path(&n, i, "u01 -> u02 -> u03", "path")?;
    }
    Ok(())
}

fn order_start_random_per_request() -> CaseResult {
    let n = Nginx::start(&ordered("order start_random per_request;", [503, 503, 503]))?;
    let mut starts = std::collections::BTreeSet::new();
    for i in 0..30 {
        n.get_on(0, "/")?;
        let p = path_of(&n, i)?;
        let walked: Vec<String> = p.split(" -> ").map(str::to_string).collect();
        check(walked.len() == 3 && rotation_ok(&walked), || {
            format!("walk {p}")
        })?;
        starts.insert(walked[0].clone());
    }
    check(starts.len() >= 2, || {
        format!("30 random starts all at {starts:?}")
    })
}

/// The seed's "no round robin" example: singlets, `order per_request`, blacklisting.
fn order_seed_no_round_robin_with_singlets() -> CaseResult {
    let body = |first: &str| {
        config(
            &[],
            &format!(
                "upstream u1 {{ server 127.0.0.1:{{{first}}}; server 127.0.0.1:{{P2}}; \
                 combine_server_singlets _single_ nobackup; }}
                 upstrand us1 {{
                     upstream ~^u1_single_ blacklist_interval=60s;
                     order per_request;
                     next_upstream_statuses error timeout non_idempotent 5xx;
                     intercept_statuses 5xx /Internal/failover;
                 }}"
            ),
            "location / { proxy_pass http://$upstrand_us1; }
             location /Internal/failover { internal; return 503 \"failover\\n\"; }",
            &[(1, "s1", 200), (2, "s2", 200)],
        )
    };
    let n = Nginx::start(&body("P1"))?;
    for i in 0..3 {
        // new connections: whichever worker serves it starts at the first server
        check_eq(n.get_on(0, "/")?.header("X-From"), Some("s1"), "s1")?;
        check_path(&n, i, "u1_single_1", "always the first server")?;
    }
    let n = Nginx::start(&body("P9"))?;
    n.expect_log("connect() failed (111: Connection refused) while connecting to upstream");
    let mut conn = n.keep_alive(0)?; // the blacklist is per worker
    check_eq(answered_by(&mut conn)?.as_str(), "s2", "s2")?;
    check_path(&n, 0, "u1_single_1 -> u1_single_2", "failover")?;
    check_eq(answered_by(&mut conn)?.as_str(), "s2", "s2")?;
    check_path(&n, 1, "u1_single_2", "the dead singlet is blacklisted")
}

/// Decision 2: `order start_random per_request` with an empty normal list does not crash.
fn order_random_with_only_backups() -> CaseResult {
    let n = Nginx::start(&config(
        &[("b01", 1), ("b02", 2)],
        "upstrand us1 { upstream ~^b0 backup; order start_random per_request; next_upstream_statuses 5xx; }",
        "location / { proxy_pass http://$upstrand_us1; }",
        &[(1, "b01", 503), (2, "b02", 200)],
    ))?;
    for _ in 0..10 {
        let a = n.get_on(0, "/")?;
        check_eq(a.status, 200, "status")?;
        check_eq(a.header("X-From"), Some("b02"), "answer")?;
    }
    Ok(())
}

// ---- 4. blacklist -------------------------------------------------------------------------

fn blacklist_skips_failed_upstream_until_interval_ends() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2), ("u03", 3)],
        "upstrand us1 { upstream u01 blacklist_interval=1s; upstream u02; upstream u03; \
         order per_request; next_upstream_statuses 5xx; }",
        "location / { proxy_pass http://$upstrand_us1; }",
        &[(1, "u01", 503), (2, "u02", 200), (3, "u03", 200)],
    ))?;
    let mut conn = n.keep_alive(0)?; // the blacklist is per worker
    check_eq(conn.get("/")?.status, 200, "status")?;
    check_path(&n, 0, "u01 -> u02", "first request")?;
    check_eq(conn.get("/")?.status, 200, "status")?;
    check_path(&n, 1, "u02", "u01 skipped while blacklisted")?;
    std::thread::sleep(Duration::from_millis(1300));
    check_eq(conn.get("/")?.status, 200, "status")?;
    check_path(&n, 2, "u01 -> u02", "u01 tried again after the interval")
}

/// [`ordered`] with `order per_request` and every member blacklisted for 60 s after a failure.
fn blacklisting(s: [u16; 3]) -> String {
    ordered("order per_request;", s)
        .replace("upstream ~^u0;", "upstream ~^u0 blacklist_interval=60s;")
}

/// Decision 1: the first non-blacklisted upstream in cycle order, not the one before it.
fn blacklist_goes_to_first_healthy_in_cycle_order() -> CaseResult {
    let n = Nginx::start(&blacklisting([503, 503, 200]))?;
    let mut conn = n.keep_alive(0)?; // the blacklist is per worker
    check_eq(answered_by(&mut conn)?.as_str(), "u03", "answer")?;
    check_path(&n, 0, "u01 -> u02 -> u03", "first request")?;
    check_eq(answered_by(&mut conn)?.as_str(), "u03", "answer")?;
    check_path(&n, 1, "u03", "both failed upstreams skipped")
}

fn blacklist_everything_whitelists_with_log() -> CaseResult {
    let n = Nginx::start(&blacklisting([503, 503, 503]))?;
    n.expect_log("all upstreams in upstrand \"us1\" are blacklisted, whitelisting them");
    let mut conn = n.keep_alive(0)?; // the blacklist is per worker
    check_eq(conn.get("/")?.status, 503, "status")?;
    check_path(&n, 0, "u01 -> u02 -> u03", "first walk")?;
    check_eq(conn.get("/")?.status, 503, "status")?;
    check_path(&n, 1, "u01 -> u02 -> u03", "all whitelisted again")?;
    let log = n.error_log();
    check(
        log.contains("[error]")
            && log.contains("all upstreams in upstrand \"us1\" are blacklisted, whitelisting them"),
        || format!("error log lacks the whitelist line:\n{log}"),
    )
}

fn variable_elsewhere_yields_name_and_advances() -> CaseResult {
    let n = Nginx::start(&ordered("", [200, 200, 200]).replace(
        "location / {",
        "location /name { return 200 \"$upstrand_us1\\n\"; } location / {",
    ))?;
    let mut conn = n.keep_alive(0)?; // the cursor is per worker
    let names: Vec<String> = (0..4)
        .map(|_| conn.get("/name").map(|a| a.text()))
        .collect::<Result<_, _>>()?;
    check_eq(names.join(""), "u01\nu02\nu03\nu01\n".to_string(), "names")?;
    check_eq(answered_by(&mut conn)?.as_str(), "u02", "cursor")
}

/// The cases of this area, named without the area (`main.rs` adds it).
pub fn cases() -> Vec<Case> {
    cases![
        order_default_round_robin,
        order_start_random,
        order_start_random_differs_across_workers,
        order_per_request,
        order_start_random_per_request,
        order_seed_no_round_robin_with_singlets,
        order_random_with_only_backups,
        blacklist_skips_failed_upstream_until_interval_ends,
        blacklist_goes_to_first_healthy_in_cycle_order,
        blacklist_everything_whitelists_with_log,
        variable_elsewhere_yields_name_and_advances,
    ]
}
