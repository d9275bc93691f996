//! Shared helpers: a counting wrapper around the real nginx commands, rendering upstream files.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tributary_apply::{
    Applier, ApplyOptions, Change, CommandError, CommandNginx, Nginx as ApplyNginx, ReloadConfirm,
};
use tributary_core::{render, Address, ExtraDirective, Target, UpstreamName};
use tributary_testkit::Nginx;

pub const WAIT: Duration = Duration::from_secs(30);

/// The real commands, counted.
pub struct Counting {
    pub inner: CommandNginx,
    pub tests: AtomicUsize,
    pub reloads: Mutex<Vec<Instant>>,
}

impl Counting {
    pub fn new(nginx: &Nginx) -> Arc<Counting> {
        Arc::new(Counting {
            inner: CommandNginx::new(nginx.test_cmd(), nginx.reload_cmd()),
            tests: AtomicUsize::new(0),
            reloads: Mutex::new(Vec::new()),
        })
    }
    pub fn tests(&self) -> usize {
        self.tests.load(Ordering::SeqCst)
    }
    pub fn reloads(&self) -> usize {
        self.reloads.lock().unwrap().len()
    }
}

impl ApplyNginx for Counting {
    fn test(&self) -> Result<(), CommandError> {
        self.tests.fetch_add(1, Ordering::SeqCst);
        self.inner.test()
    }
    fn reload(&self) -> Result<(), CommandError> {
        self.reloads.lock().unwrap().push(Instant::now());
        self.inner.reload()
    }
}

pub fn name(s: &str) -> UpstreamName {
    UpstreamName::parse(s).unwrap()
}

/// A no-wait option set for tests that do not look at the reload gap.
pub fn fast() -> ApplyOptions {
    ApplyOptions {
        min_reload_gap: Duration::ZERO,
        ..ApplyOptions::default()
    }
}

/// No reload gap, reloads confirmed by watching this nginx's workers and error log.
pub fn confirmed(nginx: &Nginx) -> ApplyOptions {
    ApplyOptions {
        min_reload_gap: Duration::ZERO,
        confirm: Some(ReloadConfirm::new(
            nginx.pid_file(),
            Some(nginx.error_log_path()),
        )),
    }
}

pub fn open(nginx: &Nginx, opts: ApplyOptions) -> (Arc<Counting>, Applier) {
    let counting = Counting::new(nginx);
    let applier = Applier::open(&nginx.conf_dir(), Box::new(counting.clone()), opts).unwrap();
    (counting, applier)
}

/// Rendered bytes of upstream `upstream` pointing at the given local ports.
pub fn upstream_bytes(upstream: &str, ports: &[u16], directives: &[&str]) -> Vec<u8> {
    let targets: Vec<Target> = ports
        .iter()
        .map(|p| Target {
            address: Address::V4([127, 0, 0, 1].into()),
            port: *p,
            weight: 1,
        })
        .collect();
    let directives: Vec<ExtraDirective> = directives
        .iter()
        .map(|d| ExtraDirective::parse(d).unwrap())
        .collect();
    render(&name(upstream), &targets, &directives).into_bytes()
}

pub fn change(upstream: &str, bytes: Vec<u8>) -> Change {
    Change {
        name: name(upstream),
        bytes,
    }
}

/// A directive the core accepts (one simple directive) but nginx rejects.
pub const BOGUS: &str = "bogus_directive on;";

/// File names in `upstreams/`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Fake nginx: the test fails (like nginx would, naming the file) when any `*.conf` in the folder
/// contains `BAD`.
pub struct FakeNginx {
    pub dir: PathBuf,
    pub tests: AtomicUsize,
    pub reloads: AtomicUsize,
}

impl ApplyNginx for FakeNginx {
    fn test(&self) -> Result<(), CommandError> {
        self.tests.fetch_add(1, Ordering::SeqCst);
        for e in fs::read_dir(&self.dir).unwrap() {
            let p = e.unwrap().path();
            let is_conf = p.is_file()
                && p.extension().is_some_and(|x| x == "conf")
                && !p.file_name().unwrap().to_string_lossy().starts_with('.');
            if is_conf && fs::read_to_string(&p).unwrap().contains("BAD") {
                return Err(CommandError {
                    command: "fake -t".into(),
                    status: Some(1),
                    stderr: format!("fake: [emerg] BAD in {}\n", p.display()),
                });
            }
        }
        Ok(())
    }
    fn reload(&self) -> Result<(), CommandError> {
        self.reloads.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

pub fn fake(conf: &Path) -> Arc<FakeNginx> {
    Arc::new(FakeNginx {
        dir: conf.join("upstreams"),
        tests: AtomicUsize::new(0),
        reloads: AtomicUsize::new(0),
    })
}
