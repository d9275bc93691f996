//! The short form of the scale benchmark (long form `module/t/bench/live_scale.rs`):
//! the correctness half only — zone slab figures and worker memory after a few hundred change
//! cycles of a 1,000-server set — never its latency figures.

use crate::case::Case;
use ngx_harness::{check, check_eq, CaseResult};

use super::churn::{config, put_ok, slab_figures, worker_memory, Churn};
use super::master::Master;

/// Servers of the set: larger than the 512 the API once took.
const SERVERS: usize = 1000;
/// `PUT`s after the warm-up (each one a change; every second one back to the base set).
const CYCLES: usize = 300;
/// Most a worker's private memory (`RssAnon`) may grow over the cycles, in KiB. Measured on a
/// 1,000-server set: 0 KiB over 10,000 cycles (docs/live-api.md, "Scale"); the bound leaves room
/// for the allocator keeping a larger body's buffers for reuse.
const RSS_GROWTH_KIB: u64 = 2048;

fn case_scale_set_churn_leaves_zone_and_workers_flat() -> CaseResult {
    let mut ch = Churn::new("big", 0, SERVERS, 0);
    let m = Master::start(&config(std::slice::from_ref(&ch)))?;
    put_ok(&m, "big", &ch.base_body())?;
    // Warm-up: the changed blocks move along the whole set once (every base server removed and
    // added back once). Before that, `pages_free` is still settling: 821 after 4 PUTs, 820 from
    // about 200 on.
    for _ in 0..ch.warm_up_puts() {
        let (body, _) = ch.next_body();
        put_ok(&m, "big", &body)?;
    }
    let before = slab_figures(&m, "big")?;
    let workers = m.workers();
    let mem_before: Vec<(u64, u64)> = workers.iter().map(|&p| worker_memory(p)).collect();
    for _ in 0..CYCLES {
        let (body, _) = ch.next_body();
        put_ok(&m, "big", &body)?;
    }
    check(ch.puts % 2 == 0, || {
        "the cycles must end on the base set".into()
    })?;
    let after = slab_figures(&m, "big")?;
    check_eq(after.2, 0, "slab allocation failures")?;
    check_eq(
        after,
        before,
        &format!("slab (chunks_used, pages_free, alloc_failures) after {CYCLES} changes of {SERVERS} servers"),
    )?;
    let v = m.get_json("/big")?;
    let servers = v["servers"].as_array().ok_or("no servers")?;
    check_eq(servers.len(), SERVERS, "servers after the cycles")?;
    check(
        servers.iter().all(|s| s["weight"].as_u64() == Some(1)),
        || "a weight was not set back to 1".into(),
    )?;
    m.check_workers_unchanged()?;
    for (&pid, (rss0, anon0)) in workers.iter().zip(&mem_before) {
        let (rss1, anon1) = worker_memory(pid);
        check(anon1 <= anon0 + RSS_GROWTH_KIB, || {
            format!(
                "worker {pid}: private memory (RssAnon) grew from {anon0} to {anon1} KiB over {CYCLES} changes (RSS {rss0} -> {rss1} KiB)"
            )
        })?;
    }
    Ok(())
}

pub fn trials() -> Vec<Case> {
    vec![Case::test(
        "scale_set_churn_leaves_zone_and_workers_flat",
        case_scale_set_churn_leaves_zone_and_workers_flat,
    )]
}
