//! The soak's command line: `--minutes N` (default 3), `--seed S` (default from the clock; printed so
//! a run can be replayed), `--keep` (keep the work folder even when every check passed).

use std::time::{SystemTime, UNIX_EPOCH};

pub struct Args {
    pub minutes: f64,
    pub seed: u64,
    pub keep: bool,
}

pub fn parse() -> Result<Args, String> {
    let mut a = Args {
        minutes: 3.0,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007),
        keep: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--minutes" => {
                a.minutes = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|m: &f64| *m > 0.0)
                    .ok_or("--minutes takes a positive number")?
            }
            "--seed" => {
                a.seed = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--seed takes a number")?
            }
            "--keep" => a.keep = true,
            // what cargo's bench/test runner may pass
            "--bench" | "--nocapture" => {}
            other => {
                return Err(format!(
                    "unknown argument {other:?} (use --minutes N, --seed S, --keep)"
                ))
            }
        }
    }
    Ok(a)
}
