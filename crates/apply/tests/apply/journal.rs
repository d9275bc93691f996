//! The journal of an existing file is a hard link to it (no copy to write and fsync), and the
//! applier times its steps.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

use tributary_apply::{Applier, ApplyOptions, Change, ChangeOutcome, CommandError, Nginx};
use tributary_core::UpstreamName;

/// Inode and bytes of the journal, each time nginx -t ran.
type Seen = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// An nginx whose test runs a closure (to look at the folder while a change is in flight).
struct Probe(Box<dyn Fn() + Send + Sync>);

impl Nginx for Probe {
    fn test(&self) -> Result<(), CommandError> {
        (self.0)();
        Ok(())
    }
    fn reload(&self) -> Result<(), CommandError> {
        Ok(())
    }
}

#[test]
fn the_journal_of_a_file_is_a_hard_link_to_it_and_steps_are_timed() {
    let dir = tempfile::tempdir().unwrap();
    let ups = dir.path().join("upstreams");
    fs::create_dir_all(&ups).unwrap();
    fs::write(ups.join("api.conf"), "old").unwrap();
    let old_inode = fs::metadata(ups.join("api.conf")).unwrap().ino();
    let seen: Seen = Arc::default();
    let (s, u) = (seen.clone(), ups.clone());
    let probe = Probe(Box::new(move || {
        let prev = u.join(".api.conf.prev");
        if let (Ok(m), Ok(b)) = (fs::metadata(&prev), fs::read(&prev)) {
            s.lock().unwrap().push((m.ino(), b));
        }
    }));
    let mut a = Applier::open(dir.path(), Box::new(probe), ApplyOptions::default()).unwrap();
    let change = Change {
        name: UpstreamName::parse("api").unwrap(),
        bytes: b"new".to_vec(),
    };
    let out = a.apply_batch(std::slice::from_ref(&change));
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    // While nginx -t ran, the journal was the old file itself (same inode, old bytes).
    assert_eq!(*seen.lock().unwrap(), vec![(old_inode, b"old".to_vec())]);
    assert!(!ups.join(".api.conf.prev").exists());
    assert_eq!(fs::read(ups.join("api.conf")).unwrap(), b"new");
    let steps = a.last_steps();
    assert_eq!(steps.tests, 1);
    assert!(steps.ready >= steps.write + steps.test, "{steps:?}");
}

/// What the folder held each time nginx was tested or reloaded.
type Looks = Arc<Mutex<Vec<(&'static str, Vec<String>, Vec<u8>)>>>;

/// An nginx that records the folder's names and the file's bytes at its test and its reload.
struct Watcher {
    dir: std::path::PathBuf,
    looks: Looks,
}

impl Watcher {
    fn look(&self, when: &'static str) {
        let mut names: Vec<String> = fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != tributary_apply::LOCK_FILE)
            .collect();
        names.sort();
        let bytes = fs::read(self.dir.join("api.conf")).unwrap_or_default();
        self.looks.lock().unwrap().push((when, names, bytes));
    }
}

impl Nginx for Watcher {
    fn test(&self) -> Result<(), CommandError> {
        self.look("test");
        Ok(())
    }
    fn reload(&self) -> Result<(), CommandError> {
        self.look("reload");
        Ok(())
    }
}

#[test]
fn the_new_file_is_in_place_and_the_journal_kept_until_the_reload_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let ups = dir.path().join("upstreams");
    fs::create_dir_all(&ups).unwrap();
    fs::write(ups.join("api.conf"), "old").unwrap();
    let looks: Looks = Arc::default();
    let watcher = Watcher {
        dir: ups.clone(),
        looks: looks.clone(),
    };
    let mut a = Applier::open(dir.path(), Box::new(watcher), ApplyOptions::default()).unwrap();
    let change = Change {
        name: UpstreamName::parse("api").unwrap(),
        bytes: b"new".to_vec(),
    };
    let out = a.apply_batch(std::slice::from_ref(&change));
    assert_eq!(out[0].1, ChangeOutcome::Applied { reloaded: true });
    // The rename is done before the test (no temp file left), the journal stays through the
    // reload and goes after it.
    let expected = |when| {
        (
            when,
            vec![".api.conf.prev".to_string(), "api.conf".to_string()],
            b"new".to_vec(),
        )
    };
    assert_eq!(
        *looks.lock().unwrap(),
        vec![expected("test"), expected("reload")]
    );
    let left: Vec<String> = fs::read_dir(&ups)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != tributary_apply::LOCK_FILE)
        .collect();
    assert_eq!(left, vec!["api.conf".to_string()]);
}
