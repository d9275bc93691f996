//! Batch apply against a real nginx: N upstream files changing at once.
//!
//! Run: `cargo bench -p tributary-apply --bench batch` (N = 1000; override with `BATCH_N=...`).
//! Prints one table: wall time per round, nginx tests and reloads. Numbers from one run on one
//! machine; compare rows of the same run, not runs across machines.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_apply::{
    Applier, ApplyOptions, Change, CommandError, CommandNginx, Nginx as ApplyNginx,
};
use tributary_core::{render, Address, ExtraDirective, Target, UpstreamName};
use tributary_testkit::Nginx;

struct Counting {
    inner: CommandNginx,
    tests: AtomicUsize,
    reloads: AtomicUsize,
}

impl ApplyNginx for Counting {
    fn test(&self) -> Result<(), CommandError> {
        self.tests.fetch_add(1, Ordering::SeqCst);
        self.inner.test()
    }
    fn reload(&self) -> Result<(), CommandError> {
        self.reloads.fetch_add(1, Ordering::SeqCst);
        self.inner.reload()
    }
}

fn batch(n: usize, port: u16, bad: Option<usize>) -> Vec<Change> {
    (0..n)
        .map(|i| {
            let name = UpstreamName::parse(&format!("svc{i}")).unwrap();
            let targets: Vec<Target> = (0..3u8)
                .map(|k| Target {
                    address: Address::V4([10, 0, k, (i % 250) as u8 + 1].into()),
                    port,
                    weight: 1,
                })
                .collect();
            let dirs: Vec<ExtraDirective> = if bad == Some(i) {
                vec![ExtraDirective::parse("bogus_directive on;").unwrap()]
            } else {
                vec![ExtraDirective::parse("keepalive 8;").unwrap()]
            };
            Change {
                bytes: render(&name, &targets, &dirs).into_bytes(),
                name,
            }
        })
        .collect()
}

fn main() {
    let n: usize = std::env::var("BATCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let nginx = Nginx::builder().start();
    let counting = Arc::new(Counting {
        inner: CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()),
        tests: AtomicUsize::new(0),
        reloads: AtomicUsize::new(0),
    });
    let mut applier = Applier::open(
        &nginx.conf_dir(),
        Box::new(counting.clone()),
        ApplyOptions {
            min_reload_gap: Duration::ZERO,
            ..ApplyOptions::default()
        },
    )
    .unwrap();

    println!(
        "{n} upstream files, real nginx {}",
        nginx.binary().display()
    );
    println!(
        "{:<44} {:>10} {:>7} {:>8}",
        "round", "wall ms", "tests", "reloads"
    );
    let mut round = |label: &str, changes: &[Change]| {
        let (t0, r0) = (
            counting.tests.load(Ordering::SeqCst),
            counting.reloads.load(Ordering::SeqCst),
        );
        let start = Instant::now();
        let out = applier.apply_batch(changes);
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let ok = out.iter().filter(|(_, o)| o.is_ok()).count();
        println!(
            "{:<44} {:>10.1} {:>7} {:>8}   ({ok}/{} ok)",
            label,
            ms,
            counting.tests.load(Ordering::SeqCst) - t0,
            counting.reloads.load(Ordering::SeqCst) - r0,
            out.len()
        );
    };
    round("all new", &batch(n, 80, None));
    round("all changed", &batch(n, 81, None));
    round("all unchanged", &batch(n, 81, None));
    round(
        "all changed, one fails nginx -t",
        &batch(n, 82, Some(n / 3)),
    );

    // Baseline in the same run: one `nginx -t` with N files, the unit the rounds above are made of.
    let single = CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd());
    let start = Instant::now();
    single.test().unwrap();
    println!(
        "{:<44} {:>10.1}",
        "baseline: one nginx -t",
        start.elapsed().as_secs_f64() * 1000.0
    );
}
