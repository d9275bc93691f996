//! Zone memory under the API: it does not grow over many changes, and servers from the API take
//! the memory configured ones do.

use ngx_harness::{check, check_eq, CaseResult};

use super::helpers::*;
use super::master::Master;

pub(super) fn case_zone_memory_does_not_grow() -> CaseResult {
    let mut m = Master::start(&standard())?;
    // Warm-up: the first set with backups makes the backup list, which stays (it is small and
    // in-flight requests may point at it); from then on the figures must come back exactly.
    check_eq(
        m.put("app", &set_body(&m, &[1], &[2]))?.status,
        200,
        "warm-up PUT",
    )?;
    check_eq(
        m.put("app", &set_body(&m, &[1], &[]))?.status,
        200,
        "warm-up PUT back",
    )?;
    let base = slab(&m, "app")?;
    let big: Vec<usize> = vec![1, 2, 3, 4, 5];
    for round in 0..40 {
        let body = match round % 4 {
            0 => set_body(&m, &big, &[]),
            1 => {
                // many distinct addresses, some backups
                let s: Vec<String> = (0..60)
                    .map(|i| {
                        format!(
                            r#"{{"address":"10.9.{round}.{}:80","backup":{}}}"#,
                            i + 1,
                            i % 3 == 0
                        )
                    })
                    .collect();
                format!(r#"{{"servers":[{}]}}"#, s.join(","))
            }
            2 => set_body(&m, &[2], &[3, 4]),
            _ => set_body(&m, &[1], &[]),
        };
        let r = m.put("app", &body)?;
        check_eq(r.status, 200, &format!("PUT round {round} ({})", r.text()))?;
    }
    // Back to the configured set, with traffic in between.
    both_workers_answer(&m, &["b1"], 3)?;
    let after_puts = slab(&m, "app")?;
    check_eq(
        after_puts,
        base,
        "slab (chunks used, free pages) after 40 PUTs",
    )?;
    let http = m.http.clone();
    let mut after_reloads = Vec::new();
    for _ in 0..3 {
        m.reload(&http)?;
        for i in 0..5 {
            check_eq(
                m.put("app", &set_body(&m, &[1 + i % 5], &[6]))?.status,
                200,
                "PUT between reloads",
            )?;
        }
        check_eq(
            m.put("app", &set_body(&m, &[1], &[]))?.status,
            200,
            "PUT back",
        )?;
        after_reloads.push(slab(&m, "app")?);
    }
    check(after_reloads.windows(2).all(|w| w[0] == w[1]), || {
        format!("slab after each reload cycle: {after_reloads:?}")
    })?;
    check_eq(
        after_reloads[0],
        base,
        "slab after a reload and the same changes",
    )?;
    m.check_workers_unchanged()
}

pub(super) fn case_servers_from_the_api_take_the_memory_of_configured_ones() -> CaseResult {
    // A server the API adds takes exactly the zone memory a configured server takes (the zone
    // module's layout: peer, address, name, server string and, in nginx builds with sticky
    // sessions, a `sid` buffer), and freeing any of them returns all of it: otherwise the
    // figures of `zone_memory_does_not_grow` could balance a leak against a smaller peer.
    let conf = |servers: &[usize]| {
        let list: String = servers
            .iter()
            .map(|i| format!(" server 127.0.0.1:{{P{i}}};"))
            .collect();
        format!(
            "upstream solo {{ zone solo 64k;{list} }}\n{}",
            front("solo", "")
        )
    };
    let mut m = Master::start(&conf(&[1, 2, 3]))?;
    let three = slab(&m, "solo")?;
    m.reload(&conf(&[1, 2]))?;
    let two = slab(&m, "solo")?;
    let per_configured = three
        .0
        .checked_sub(two.0)
        .ok_or("3 servers use fewer chunks than 2")?;
    check(per_configured > 0, || {
        "a configured server uses no chunk".into()
    })?;
    // Replace both configured servers by two others, then add a third.
    check_eq(
        m.put("solo", &set_body(&m, &[4, 5], &[]))?.status,
        200,
        "PUT b4 b5",
    )?;
    both_workers_answer(&m, &["b4", "b5"], 2)?;
    let two_api = slab(&m, "solo")?;
    check_eq(
        two_api,
        two,
        "slab with 2 servers from the API vs 2 configured",
    )?;
    check_eq(
        m.put("solo", &set_body(&m, &[3, 4, 5], &[]))?.status,
        200,
        "PUT b3 b4 b5",
    )?;
    let three_api = slab(&m, "solo")?;
    check_eq(
        three_api.0 - two_api.0,
        per_configured,
        "chunks of one server from the API vs one configured",
    )?;
    m.check_workers_unchanged()
}
