//! Refresh jitter end to end: `tributary serve` (SQLite store, the real `static` plugin, a real
//! nginx) with bindings saved together. Their refresh times are read back from each binding's
//! outcome history (`at_ms`: when the resolution started).

use crate::common;

use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::json;
use tributary_testkit::Nginx;

const BINDINGS: usize = 30;
const INTERVAL_MS: i64 = 10_000;
/// Scheduled refreshes looked at after the first (immediate) resolution.
const ROUNDS: usize = 3;

#[test]
fn bindings_saved_together_at_the_minimum_interval_do_not_refresh_in_lockstep() {
    let nginx = Nginx::builder().backend("alpha").start();
    let alpha = nginx.backend_port("alpha");
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start(root.path(), &nginx);
    let bindings: Vec<_> = (0..BINDINGS)
        .map(|i| {
            json!({"name": format!("b{i:02}"), "plugin": "static", "provider": "static",
                   "service": "demo", "interval_secs": INTERVAL_MS / 1000,
                   "config": {"targets": format!("127.0.0.1:{alpha}")}})
        })
        .collect();
    let body = json!({ "bindings": bindings }).to_string();
    let (st, v) = d.api("POST", "/api/v1/bindings/bulk", Some(&body));
    assert!(st < 300, "{st} {v}");

    // Every binding's refresh times, oldest first, once each has ROUNDS scheduled ones.
    let deadline = Instant::now() + Duration::from_secs(90);
    let times: Vec<Vec<i64>> = loop {
        let times: Vec<Vec<i64>> = (0..BINDINGS)
            .map(|i| {
                let (_, v) = d.api("GET", &format!("/api/v1/bindings/b{i:02}/history"), None);
                let mut t: Vec<i64> = v["history"]
                    .as_array()
                    .map(|h| h.iter().filter_map(|o| o["at_ms"].as_i64()).collect())
                    .unwrap_or_default();
                t.sort_unstable();
                t
            })
            .collect();
        if times.iter().all(|t| t.len() > ROUNDS) {
            break times;
        }
        assert!(
            Instant::now() < deadline,
            "not every binding refreshed {ROUNDS} times: {times:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for round in 1..=ROUNDS {
        let at: Vec<i64> = times.iter().map(|t| t[round]).collect();
        let spread = at.iter().max().unwrap() - at.iter().min().unwrap();
        eprintln!("round {round}: refresh times spread over {spread} ms");
        // Without jitter at the minimum interval they stay within a few ms of each other.
        assert!(
            spread >= INTERVAL_MS / 4,
            "round {round}: {BINDINGS} bindings refreshed within {spread} ms: {at:?}"
        );
    }
    for t in &times {
        for w in t.windows(2) {
            let gap = w[1] - w[0];
            // Never sooner than the 10 s minimum; at most the spread window (15 s) plus the
            // time a resolution and its apply (30 changes, one reload) take on a loaded
            // machine (22 s seen with the whole test suite running).
            assert!(
                (INTERVAL_MS..INTERVAL_MS * 4).contains(&gap),
                "gap {gap} ms: {t:?}"
            );
        }
    }
}
