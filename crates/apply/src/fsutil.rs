//! Atomic file replacement: temp file in the same folder, fsync, rename, fsync the folder.
//!
//! For many files at once, fsyncing each temp file costs one disk flush per file (about 2 ms
//! each here: 1,000 files = 2 s per step). Above [`BULK_THRESHOLD`] files the temp files are
//! written unsynced and made durable with one `syncfs` of their filesystem before any rename, which
//! keeps the same guarantee (no rename becomes visible before its data is on disk).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Marker inside temp file names; files with it are left-overs of a crash and are removed at open.
pub(crate) const TMP_MARKER: &str = ".tmp-";

/// Up to this many files, each temp file is fsynced on its own; above, one `syncfs` covers all.
pub(crate) const BULK_THRESHOLD: usize = 8;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a new temp file `.<file_name>.tmp-<pid>-<n>` in `dir` (hidden, never
/// `*.conf`), with the permissions of the file it will replace; fsynced when `sync`.
fn write_temp(dir: &Path, file_name: &str, bytes: &[u8], sync: bool) -> io::Result<PathBuf> {
    let target = dir.join(file_name);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{file_name}{TMP_MARKER}{}-{n}",
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        if let Ok(meta) = fs::metadata(&target) {
            f.set_permissions(fs::Permissions::from_mode(
                meta.permissions().mode() & 0o7777,
            ))?;
        }
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Replaces each `dir/<name>` with its bytes, atomically per file, without syncing the folder
/// (call [`sync_dir`] after). On an error returns the index of the failing item; items before it
/// may already be replaced, none after it is.
pub(crate) fn write_many(dir: &Path, items: &[(String, &[u8])]) -> Result<(), (usize, io::Error)> {
    let bulk = items.len() > BULK_THRESHOLD;
    let mut temps: Vec<PathBuf> = Vec::with_capacity(items.len());
    let cleanup = |temps: &[PathBuf]| {
        for t in temps {
            let _ = fs::remove_file(t);
        }
    };
    for (i, (name, bytes)) in items.iter().enumerate() {
        match write_temp(dir, name, bytes, !bulk) {
            Ok(t) => temps.push(t),
            Err(e) => {
                cleanup(&temps);
                return Err((i, e));
            }
        }
    }
    if bulk {
        if let Err(e) = sync_fs(dir) {
            cleanup(&temps);
            return Err((0, e));
        }
    }
    for (i, ((name, _), tmp)) in items.iter().zip(&temps).enumerate() {
        if let Err(e) = fs::rename(tmp, dir.join(name)) {
            cleanup(&temps[i..]);
            return Err((i, e));
        }
    }
    Ok(())
}

/// Flushes the filesystem holding `dir` (`syncfs`).
fn sync_fs(dir: &Path) -> io::Result<()> {
    let d = File::open(dir)?;
    rustix::fs::syncfs(&d).map_err(io::Error::from)
}

/// Makes renames and removals in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a file; a file that is already gone is fine.
pub(crate) fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads a file; `None` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
