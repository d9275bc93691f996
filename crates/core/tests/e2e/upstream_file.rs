//! The upstream file as a value: `UpstreamFile::parse` is the strict inverse of `render` on every
//! render fixture (`render/<case>.conf`), on variations of them (servers drained, zones of every
//! size, shuffled directives), and the live decision gives each reload reason.
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::json;
use tributary_core::{
    live_plan, validate, ExtraDirective, ReloadReason, UpstreamFile, UpstreamName,
};

fn fixtures() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/render");
    let mut out: Vec<(String, String)> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p: &PathBuf| p.extension().is_some_and(|e| e == "conf"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_render_fixture_parses_and_renders_its_own_bytes() {
    let cases = fixtures();
    assert!(cases.len() >= 7, "render fixtures missing: {cases:?}");
    for (stem, text) in cases {
        let f = UpstreamFile::parse(&text).unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert_eq!(f.render(), text, "{stem}");
        assert_eq!(f.zone.is_some(), stem.starts_with("live_"), "{stem}");
        // And the value it gives back is the value again.
        assert_eq!(UpstreamFile::parse(&f.render()).unwrap(), f, "{stem}");
    }
}

/// Deterministic pseudo-random numbers (the seed is in every failure message).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn generated_files_round_trip() {
    let hosts = [
        "10.0.0.1",
        "192.168.7.20",
        "2001:db8::17",
        "::1",
        "app.internal",
        "a-b.c",
    ];
    let dirs = [
        "keepalive 32;",
        "least_conn;",
        "zone shared 1m;",
        "probe uri=/ interval=1s;",
    ];
    for seed in 0..300u64 {
        let mut r = Lcg(seed);
        let targets: Vec<_> = (0..1 + r.next(12))
            .map(|_| {
                json!({
                    "address": hosts[r.next(hosts.len() as u64) as usize],
                    "port": 1 + r.next(65535),
                    "weight": 1 + r.next(1000),
                })
            })
            .collect();
        let v = validate(&targets);
        let directives: Vec<ExtraDirective> = (0..r.next(3))
            .map(|_| ExtraDirective::parse(dirs[r.next(dirs.len() as u64) as usize]).unwrap())
            .collect();
        let name = UpstreamName::parse(["api", "web-2", "x.y"][r.next(3) as usize]).unwrap();
        let mut f = UpstreamFile::new(&name, &v.targets, &directives);
        for s in f.servers.iter_mut() {
            s.down = r.next(4) == 0;
        }
        if r.next(2) == 0 {
            f = f.with_zone(r.next(1 << 24));
        }
        let text = f.render();
        assert_eq!(
            UpstreamFile::parse(&text).as_ref(),
            Ok(&f),
            "seed {seed}:\n{text}"
        );
    }
}

fn file(servers: &[&str], directives: &[&str], zone: Option<u64>) -> UpstreamFile {
    let targets: Vec<_> = servers
        .iter()
        .map(|a| json!({"address": a, "port": 80}))
        .collect();
    let directives: Vec<ExtraDirective> = directives
        .iter()
        .map(|d| ExtraDirective::parse(d).unwrap())
        .collect();
    let mut f = UpstreamFile::new(
        &UpstreamName::parse("api").unwrap(),
        &validate(&targets).targets,
        &directives,
    );
    f.zone = zone;
    f
}

#[test]
fn only_server_changes_of_a_zoned_live_upstream_go_live() {
    let live = file(&["10.0.0.1"], &["keepalive 8;"], Some(65536));
    let mut wanted = file(&["10.0.0.2", "2001:db8::1"], &["keepalive 8;"], Some(65536));
    wanted.servers[1].down = true;
    let plan = live_plan(Some(&live), &wanted).unwrap();
    assert_eq!(plan.set, wanted.servers);
    assert_eq!(plan.before, live.servers);
    // A binding's own zone directive serves as well.
    let own = file(&["10.0.0.1"], &["zone shared 1m;"], None);
    let moved = file(&["10.0.0.3"], &["zone shared 1m;"], None);
    assert!(live_plan(Some(&own), &moved).is_ok());
}

#[test]
fn every_other_change_names_its_reload_reason() {
    let live = file(&["10.0.0.1"], &["keepalive 8;"], Some(65536));
    let cases = [
        (
            None,
            file(&["10.0.0.1"], &["keepalive 8;"], Some(65536)),
            ReloadReason::NewUpstream,
            "new upstream",
        ),
        (
            Some(&live),
            file(&["10.0.0.2"], &["keepalive 16;"], Some(65536)),
            ReloadReason::DirectivesChanged,
            "directives changed",
        ),
        (
            Some(&live),
            file(&["10.0.0.2"], &["keepalive 8;"], Some(131072)),
            ReloadReason::ZoneResized,
            "the zone line changes (1 servers)",
        ),
        (
            Some(&live),
            file(&["10.0.0.2"], &["keepalive 8;"], None),
            ReloadReason::ZoneResized,
            "zone line changes",
        ),
        (
            Some(&live),
            file(&["app.internal"], &["keepalive 8;"], Some(65536)),
            ReloadReason::HostNames,
            "host-name target app.internal:80",
        ),
    ];
    for (old, new, reason, text) in cases {
        let e = live_plan(old, &new).unwrap_err();
        assert_eq!(e.reason, reason, "{e}");
        assert!(e.text.contains(text), "{reason}: {e}");
    }
    let bare = file(&["10.0.0.1"], &[], None);
    let e = live_plan(Some(&bare), &file(&["10.0.0.2"], &[], None)).unwrap_err();
    assert_eq!(e.reason, ReloadReason::NoZone);
    assert!(e.text.contains("no zone"), "{e}");
    let mut renamed = live.clone();
    renamed.name = UpstreamName::parse("web").unwrap();
    renamed.zone = None;
    let mut old = live.clone();
    old.zone = None;
    old.directives
        .push(ExtraDirective::parse("zone z 64k;").unwrap());
    renamed.directives = old.directives.clone();
    let e = live_plan(Some(&old), &renamed).unwrap_err();
    assert_eq!(e.reason, ReloadReason::DirectivesChanged);
}
